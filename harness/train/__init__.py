"""Training: precision policy, built-in models, the training loop, checkpoints, the `harness train` job."""
