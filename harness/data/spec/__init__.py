"""The feature spec: `dataspec` (the `DataSpec` type), `config` (the `data:` section read value by value), `infer`
(a spec inferred from the records, and refined by the config), `validate` (a spec checked against the shards) and
`labels` (the label rule)."""
