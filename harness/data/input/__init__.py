"""The tf.data input pipeline: `decode` (records -> inputs and labels), `augment` (the random stages), `stages` (the
plan: every stage decided once, without TensorFlow), `pipeline` (the plan measured, decided and applied),
`filecache` (one live filler per file cache) and `service` (the tf.data service)."""
