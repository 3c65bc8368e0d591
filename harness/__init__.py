"""harness: distributed training of TensorFlow models on Google Earth Engine TFRecord exports.

Importing the package selects Keras 2 (`tf-keras`) for `tf.keras` before TensorFlow is imported anywhere: Keras 3's
`fit` fails under MultiWorkerMirroredStrategy with TF 2.18-2.21 and Horovod does not average Keras 3 gradients
(see setup.cfg). It also turns off TensorFlow's Cloud Storage read block (`GCS_READ_CACHE_BLOCK_SIZE_MB=0`, read
by tsl/platform/cloud/gcs_file_system.cc when its file system starts; TensorFlow's default is 64 MiB): every open
gs:// file allocates and zero-fills one block, page faults and all, and each read is copied once more out of it
(tensorflow/tensorflow#30327), so 64 MiB blocks cost the client 1.6x the CPU per example of a local read of ~15 MB
GZIP shards. With no block, each fill of the reader's own buffer (`shards.read_buffer_bytes`: 16 MiB for gs://) is
one media request straight into it: bucket / local 0.83 [0.72-0.92] over 7 runs, against 0.76 with 16 MiB
blocks (benchmarks/gcs_read.py).
A value the user already exported wins.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO and WARNING lines
os.environ.setdefault("GCS_READ_CACHE_BLOCK_SIZE_MB", "0")  # no per-file block (see above)

__version__ = "0.1.0"
