"""An export on disk: `shards` (discovery, compression, mixer), `records` (reading and decoding records), `index`
(record counts, cached), `gcs` (Cloud Storage credentials), `source` (a ShardSet: discovered and counted once),
`scan` (names a bad record), `reshard`, `synth` (synthetic exports) and `inspect` (`harness inspect`)."""
