"""Benchmarks as commands: `harness bench input` (the input pipeline alone) and `harness bench train`; `harness tune`
(each input stage probed, the pipeline's levers decided: tune.py)."""
