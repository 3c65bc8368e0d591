"""harness: distributed training of TensorFlow models on Google Earth Engine TFRecord exports.

Importing the package selects Keras 2 (`tf-keras`) for `tf.keras` before TensorFlow is imported anywhere: Keras 3's
`fit` fails under MultiWorkerMirroredStrategy with TF 2.18-2.21 and Horovod does not average Keras 3 gradients
(see setup.cfg). A value the user already exported wins.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO and WARNING lines

__version__ = "0.1.0"
