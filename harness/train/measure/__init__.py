"""Measuring a run: the input-cost `probe`, `--profile` (`profiling`), `--tune` (`tune`)."""
