"""Earth Engine TFRecord exports, one room per job: `export` (an export on disk: shards, records, the record index,
Cloud Storage, discovery, scan, reshard, synthetic exports, `harness inspect`), `spec` (the feature spec: the type,
the `data:` section, inference, validation, the label rule), `input` (the tf.data input pipeline: decoding,
augmentation, the plan of its stages, its assembly, the file cache, the tf.data service) and `tune` (the pipeline's
stage rates measured, Plumber's model of them, and the levers decided on it)."""
