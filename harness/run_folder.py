"""A training run's output folder as other commands read it: the model file (`model.keras`) and where
`--init-from` and `predict --model` find it, whether given a run folder or a `.keras` file (local or `gs://`)."""
from __future__ import annotations

import os

from harness.errors import ModelFileError

MODEL_FILE = "model.keras"  # the final model in a run folder (harness.train.lifecycle.backup.save_model writes it)


def model_path(source: str) -> str:
    """`source/model.keras` when `source` is a folder (a run folder), else `source` itself (a `.keras` file)."""
    import tensorflow as tf

    return os.path.join(source, MODEL_FILE) if tf.io.gfile.isdir(source) else source


def find_model(source: str, *, flag: str) -> str:
    """The model file of `source` (`model_path`), checked to exist.

    Args:
      flag: the option that named `source` (`--init-from`, `--model`), for the message.
    Raises:
      ModelFileError: naming the flag, `source` and the path looked for, when no such file exists.
    """
    import tensorflow as tf

    path = model_path(source)
    if not tf.io.gfile.exists(path):
        raise ModelFileError(f"{flag} {source}: no file {path} (give a .keras model or a run folder holding "
                             f"{MODEL_FILE})")
    if path.endswith(".py"):
        raise ModelFileError(f"{flag} {source}: a Python file, not a trained model: give a run folder or its "
                             f"{MODEL_FILE} (a model file is trained first: harness train --model "
                             f"{source}:FUNCTION ...)")
    return path
