"""`harness predict`: options, the model and its checks, the ordered reader, the atomic writer, the run; and
`harness export --format savedmodel` (serving)."""
