"""Launchers: start the same `harness train` command as several workers (locally, under MPI, on Kubernetes)."""
