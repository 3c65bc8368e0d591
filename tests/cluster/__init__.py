"""Multi-host tests on a bed of network namespaces (bed.py)."""
