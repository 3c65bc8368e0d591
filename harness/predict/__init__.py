"""`harness predict`: the command's flow (`job`), what the model is fed (`reader`), the model and its checks
(`model`), the prediction stream (`stream`), the files and the output folder's rules (`writer`), the maps
(`maps`, the one home of the map formats), the upload commands (`upload`, `identity`), its options (`options`)
and `harness inspect`'s view of its output folder (`describe`); and `harness export --format savedmodel`
(`serving`, `vertex`)."""
