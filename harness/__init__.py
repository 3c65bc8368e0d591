"""harness: distributed training of TensorFlow models on Google Earth Engine TFRecord exports.

Importing the package selects Keras 2 (`tf-keras`) for `tf.keras` before TensorFlow is imported anywhere, so that code
written against `tf.keras` keeps the Keras it was written for; a Keras 3 model (`import keras`) trains as well
(`harness.keras_kinds`). It also turns off TensorFlow's Cloud Storage read block (`GCS_READ_CACHE_BLOCK_SIZE_MB=0`, read
by tsl/platform/cloud/gcs_file_system.cc when its file system starts; TensorFlow's default is 64 MiB): every open
gs:// file allocates and zero-fills one block, page faults and all, and each read is copied once more out of it
(tensorflow/tensorflow#30327), so 64 MiB blocks cost the client 1.6x the CPU per example of a local read of ~15 MB
GZIP shards. With no block, each fill of the reader's own buffer (`shards.read_buffer_bytes`: 16 MiB for gs://) is
one media request straight into it: bucket / local 0.83 [0.72-0.92] over 7 runs, against 0.76 with 16 MiB
blocks (benchmarks/gcs_read.py).
A value the user already exported wins.

It also spares `import tensorflow` an import it cannot use: TensorFlow's GCE cluster resolver and its TPU client
(tensorflow/python/distribute/cluster_resolver/gce_cluster_resolver.py, tensorflow/python/tpu/client/client.py)
each import `googleapiclient.discovery` and then `oauth2client`, and without oauth2client (deprecated since 2017,
installed by nothing the harness needs) treat the client as absent. Earth Engine users have googleapiclient
(earthengine-api needs it), so every process paid for that import: 0.2-0.3 CPU-s of a 2.6-2.9 s
`import harness, tensorflow` (5 runs each, 2 cores), and google.api_core's FutureWarning about the Python version
on every command. Where oauth2client is absent, that import, from those two
modules, fails as it would without googleapiclient; every other import of googleapiclient is untouched.

And it imports TensorFlow (tf_keras, Keras 3, Horovod's TensorFlow module) with the cyclic garbage collector off,
their objects frozen after (`harness.heavy_imports`): about 1 CPU-s less for every process that imports them.
"""
import importlib.util
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO and WARNING lines
os.environ.setdefault("GCS_READ_CACHE_BLOCK_SIZE_MB", "0")  # no per-file block (see above)

__version__ = "0.1.0"

_NEED_OAUTH2CLIENT = ("tensorflow.python.distribute.cluster_resolver.gce_cluster_resolver",
                      "tensorflow.python.tpu.client.client")


class _NoClientWithoutOauth2client:
    """A meta path finder: `googleapiclient`, imported by the TensorFlow modules that need oauth2client with it
    (`_NEED_OAUTH2CLIENT`), is not found."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "googleapiclient":
            return None
        frame = sys._getframe(1)
        while frame is not None:
            importer = frame.f_globals.get("__name__")
            if importer in _NEED_OAUTH2CLIENT:
                raise ModuleNotFoundError(f"No module named {name!r} (for {importer}, which also needs the absent "
                                          "oauth2client)", name=name)
            frame = frame.f_back
        return None


if "tensorflow" not in sys.modules and importlib.util.find_spec("oauth2client") is None:
    sys.meta_path.insert(0, _NoClientWithoutOauth2client)

from harness import heavy_imports  # noqa: E402  (TensorFlow's import without the cyclic collector: its docstring)

heavy_imports.install()
