"""`harness evaluate`: a trained run scored on a labelled export with validation's own metrics (`run`)."""
