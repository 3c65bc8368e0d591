"""harness: distributed training of TensorFlow models on Google Earth Engine TFRecord exports.

Importing the package selects Keras 2 (`tf-keras`) for `tf.keras` before TensorFlow is imported anywhere: Keras 3's
`fit` fails under MultiWorkerMirroredStrategy with TF 2.18-2.21 and Horovod does not average Keras 3 gradients
(see setup.cfg). It also sets TensorFlow's Cloud Storage read block (`GCS_READ_CACHE_BLOCK_SIZE_MB`, read by
tsl/platform/cloud/gcs_file_system.cc when its file system starts) to 16 MiB from TensorFlow's 64 MiB: every open
gs:// file allocates and zero-fills one block, page faults and all, so 64 MiB blocks cost the client 1.6x the CPU
per example of a local read of ~15 MB GZIP shards, 16 MiB blocks 1.2x (benchmarks/gcs_read.py; perf shows the
memset and the page faults; tensorflow/tensorflow#30327). A value the user already exported wins.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO and WARNING lines
os.environ.setdefault("GCS_READ_CACHE_BLOCK_SIZE_MB", "16")  # per open gs:// file (see above)

__version__ = "0.1.0"
