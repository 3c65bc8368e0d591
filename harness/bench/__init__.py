"""Benchmarks as commands: `harness bench input` (the input pipeline alone) and `harness bench train`."""
