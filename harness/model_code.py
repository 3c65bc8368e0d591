"""The user's Python code a saved model needs: the model file a run was trained with, imported to train, recorded in
every `.keras` the run saves, and imported again before any command loads that file.

A model may hold the user's own classes (a layer or a subclassed `Model` registered with
`@keras.saving.register_keras_serializable()`, Keras 3 or tf-keras): Keras finds them by their registered name, which
exists only once the file that defines them has run in the process. `harness train --model FILE.py:FUNCTION` runs it;
`predict`, `evaluate`, `export` and `--init-from` run it again from the copy recorded in the `.keras` file itself (a
zip entry `harness/model_code.json` beside Keras' own, which Keras ignores): a pod on another machine reads the run
folder (`gs://...`) but not the trainer's disk, and a `.keras` copied alone still carries the code of its classes. The
copy is the source as trained, so a model file edited or deleted since loads as it was. `--model MODULE:FUNCTION`
records the module's name, imported by name (it must be installed where the model loads, as any dependency).
A `.keras` saved before this record existed falls back to the `run.model_file` of the `summary.json` beside it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import linecache
import logging
import os
import sys
import types
import zipfile
from typing import Optional

from harness.errors import UserCodeError

log = logging.getLogger(__name__)

ENTRY = "harness/model_code.json"   # the record's name inside a `.keras` zip
PREFIX = "harness_user_"            # a model file `dir/name.py` is imported as module `harness_user_name`


@dataclasses.dataclass(frozen=True)
class ModelCode:
    """What built a model, enough to import it again on another machine.

    Attributes:
      given: the model as the run named it: `path/to/file.py:FUNCTION` or `MODULE:FUNCTION`.
      module: the module's name in `sys.modules` (`harness_user_<stem>` for a file).
      function: the model function's name.
      path: a file's absolute path (None for a module).
      source: a file's text as it was imported (None for a module).
      sha256: hex digest of `source` (None for a module).
    """

    given: str
    module: str
    function: str
    path: Optional[str] = None
    source: Optional[str] = None
    sha256: Optional[str] = None

    def to_dict(self, *, source: bool = True) -> dict:
        """The record as JSON-ready dict; `source` False leaves the file's text out (`summary.json`)."""
        out = dataclasses.asdict(self)
        if not source:
            out.pop("source")
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> "ModelCode":
        """The record of `to_dict`."""
        return cls(**{f.name: d.get(f.name) for f in dataclasses.fields(cls)})

    def describe(self) -> str:
        """`given` with the file's absolute path where it differs: `m.py:build (/home/me/m.py)`."""
        where = self.path if self.path and not self.given.startswith(self.path) else None
        return f"{self.given} ({where})" if where else self.given


def module_name(path: str) -> str:
    """The module name a model file is imported as: `harness_user_<file stem>`."""
    return PREFIX + os.path.splitext(os.path.basename(path))[0]


def import_file(path: str, flag: str = "--model") -> types.ModuleType:
    """Import the Python file `path` as module `module_name(path)` (in `sys.modules`: dataclasses and pickling look a
    module up by name), from its text read once: the text that ran is the one `of_module` records.

    Raises:
      UserCodeError: no such file.
      Whatever the file raises while it runs (the caller names it).
    """
    if not os.path.isfile(path):
        raise UserCodeError(f"{flag}: no file {path!r}")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    return _execute(module_name(path), source, os.path.abspath(path))


def _execute(name: str, source: str, path: str) -> types.ModuleType:
    """Run `source` as module `name` whose file is `path`; its lines are the ones inspect and AutoGraph read for
    `path` in this process (`linecache`), whatever the file on disk holds now."""
    spec = importlib.util.spec_from_loader(name, loader=None, origin=path)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = path
    module.__harness_source__ = source
    module.__harness_sha256__ = _digest(source)
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)   # mtime None: never re-read
    sys.modules[name] = module
    try:
        exec(compile(source, path, "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def of_module(given: str, module: types.ModuleType, function: str) -> ModelCode:
    """The record of a model function `function` of `module`, as `given` named it (`FILE.py:FUNCTION` imported by
    `import_file`: its absolute path and text; else `MODULE:FUNCTION`: the module's name)."""
    source = getattr(module, "__harness_source__", None)
    if source is not None:
        return ModelCode(given=given, module=module.__name__, function=function, path=module.__file__,
                         source=source, sha256=module.__harness_sha256__)
    return ModelCode(given=given, module=module.__name__, function=function)


def of_function(fn) -> Optional[ModelCode]:
    """The record of a model function passed in Python (`harness.train.job.run(model_fn=...)`): its module's, or
    None for a function of `__main__` (a script, which another process cannot import) or of no module."""
    name = getattr(fn, "__module__", None)
    module = sys.modules.get(name) if name else None
    if module is None or name == "__main__":
        return None
    return of_module(f"{name}:{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}", module,
                     getattr(fn, "__name__", "?"))


def write(keras_path: str, code: Optional[ModelCode]) -> None:
    """Add `code` to the local `.keras` file `keras_path` (a zip entry `ENTRY`, which Keras does not read); nothing
    for None."""
    if code is None:
        return
    with zipfile.ZipFile(keras_path, "a") as z:
        z.writestr(ENTRY, json.dumps(code.to_dict()))


def read(keras_path: str) -> Optional[ModelCode]:
    """The code recorded in the `.keras` file `keras_path` (local or `gs://`), else (a file saved before the record
    existed) the `FILE.py:FUNCTION` of the `summary.json` beside it (`run.model_file`, a path as the run was
    given it), else None (the built-in model, a model made elsewhere)."""
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(keras_path, "rb") as f, zipfile.ZipFile(f) as z:
            if ENTRY in z.namelist():
                return ModelCode.from_dict(json.loads(z.read(ENTRY)))
    except (OSError, ValueError, zipfile.BadZipFile, tf.errors.OpError):
        return None
    summary = os.path.join(os.path.dirname(keras_path), "summary.json")
    try:
        with tf.io.gfile.GFile(summary) as f:
            given = (json.load(f).get("run") or {}).get("model_file") or ""
    except (OSError, ValueError, tf.errors.OpError):
        return None
    file, sep, function = given.rpartition(":")
    if not sep or not file.endswith(".py"):
        return None
    return ModelCode(given=given, module=module_name(file), function=function, path=os.path.abspath(file))


def prepare(keras_path: str) -> Optional[str]:
    """Import the code recorded for `keras_path` (`read`) before Keras loads it, so that its registered classes
    are found: a file's recorded text (reused when this process already runs the same text under that name), or a
    module by name; a record without text (`read`'s fallback) imports the file where it still is.

    Returns:
      None when the code imported or none is recorded; else one line naming the model file, what failed and what
      to do (the caller raises it if the model then fails to load, else warns: a model of Keras' own layers loads
      without its file).
    """
    code = read(keras_path)
    if code is None:
        return None
    try:
        if code.source is not None:
            running = sys.modules.get(code.module)
            if getattr(running, "__harness_sha256__", None) != code.sha256:
                _execute(code.module, code.source, code.path)
        elif code.path is not None:
            if not os.path.isfile(code.path):
                return (f"{keras_path} was trained with --model {code.given}, and {code.path} is gone: put the "
                        "file back where it was (its classes define the model), or train again")
            import_file(code.path)
        else:
            importlib.import_module(code.module)
    except Exception as e:  # the user's code may raise anything
        what = "its recorded copy" if code.source is not None else code.path or f"module {code.module}"
        return (f"{keras_path} was trained with --model {code.describe()}; importing {what} failed: "
                f"{type(e).__name__}: {_first_line(e)}: install what it imports here (or put it on PYTHONPATH)")
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
