"""Earth Engine TFRecord exports: shards (shards.py), record counts (index.py), reading and decoding records
(records.py), the feature spec (spec.py), the tf.data pipeline (pipeline.py), synthetic exports (synth.py) and
`harness inspect` (inspect.py)."""
