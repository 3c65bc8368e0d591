"""Where the benchmarks find the real exports: HARNESS_SHARED_DATA, else ../shared/data beside the repository (as
tests/shared_data.py resolves them for the tests)."""
import os

SHARED_DATA = os.environ.get("HARNESS_SHARED_DATA",
                             os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                                          "shared", "data"))
# the real Earth Engine point export (ACES: 8,316 records of 9 floats, GZIP, one file)
ACES_POINTS = os.path.join(SHARED_DATA, "gee-aces-points", "training.tfrecord.gz")
