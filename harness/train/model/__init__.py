"""The model's parts, built inside the strategy's scope: models (`builtin`, `user`), `losses`, `metrics`, `optim`,
`precision`."""
