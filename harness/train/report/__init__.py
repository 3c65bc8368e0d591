"""What a run reports: the epoch line (`console`), TensorBoard scalars (`tensorboard`), `summary.json`
(`run_summary`)."""
