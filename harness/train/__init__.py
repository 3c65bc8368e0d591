"""Training: `job` (`harness train`: inputs -> `loop.factory.build_run` -> fit -> results), its `options` and
`inputs`; the rooms: `loop` (trainer, evaluator, controller), `model` (built-in and user models, losses, metrics,
optimizer, precision), `lifecycle` (backup, resume, preemption, watchdog, peers, interrupt, early stopping),
`measure` (probe, profiling, tune) and `report` (epoch line, TensorBoard, summary.json)."""
