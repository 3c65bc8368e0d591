"""TensorFlow's import without the cyclic garbage collector, and its objects then kept out of the collector's reach.

`import tensorflow` makes ~270,000 Python objects that live as long as the process. While it runs, the collector
runs ~640 times (4 of them over every object), and every later full collection, the last one at the interpreter's
exit included, walks them all again, finding nothing: `python -c "import harness, tensorflow as tf;
tf.constant(1)"` spends 2.4-2.6 CPU-s with the collector as Python sets it, 1.5-1.6 with it off during the import
and the module's objects frozen after it (`gc.freeze()`, the permanent generation: still freed by reference
counting, never walked), three runs each on 2 cores, TF 2.21, Python 3.11. Every process the harness starts (a
worker, a rank, each `harness` command) pays that import, so each starts about 1 CPU-s sooner.

The same holds for the other imports of that size (`HEAVY`). A cycle of garbage made during one of them is not
collected (the objects the first import's collections found: ~700, a few hundred kB). Python's documentation of
`gc.freeze`: "to avoid the cost of walking [objects that live for the life of the process] ... and to make the
objects be ignored by future collections" (docs.python.org/3/library/gc.html#gc.freeze).

During the same imports `typing.ForwardRef` compiles each string it is given (`compile(arg, '<string>', 'eval')`,
CPython 3.11's typing.py), and the `TypeVar`s of TensorFlow's generated op modules have constraints that are
strings: `import harness, tensorflow` compiles 17,978 strings, 94 distinct ("_atypes.Int32" 938 times, ...). Each distinct
string is compiled once (`_compile_once`, the same immutable code object for equal arguments; typing's module
namespace only, only while the outermost heavy import runs).
"""
import builtins
import contextlib
import functools
import gc
import importlib.util
import os
import re
import sys
import tempfile
import typing

HEAVY = ("tensorflow", "tf_keras", "keras", "horovod.tensorflow")

# What TensorFlow's C++ libraries print on stderr while they load, whatever TF_CPP_MIN_LOG_LEVEL says (absl logs
# before its InitializeLog go to stderr unfiltered): not the user's business on every command. Left out of what the
# import wrote; every other line is written back. With DEBUG logging on (`harness -v`) they are kept.
_BANNERS = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
                      r"|I\d{4} [\d:. ]+\d+ (port\.cc:\d+\] oneDNN custom operations are on"
                      r"|cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized)"
                      r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler"
                      r" flags\.)")


@contextlib.contextmanager
def _without_banners():
    """Capture file descriptor 2 during the block into a temporary file, then write back every line but
    `_BANNERS` (in order, also when the block raises)."""
    import logging

    if logging.getLogger().isEnabledFor(logging.DEBUG):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not _BANNERS.match(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


@functools.lru_cache(maxsize=1024)
def _compile_once(source, filename, mode):
    """`compile` for typing.ForwardRef's strings, each (source, filename, mode) once."""
    return builtins.compile(source, filename, mode)


class _CollectorOffLoader:
    """The module's own loader, with the collector off while the module executes and the objects frozen after."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        outermost = HeavyImports.depth == 0
        was_enabled = gc.isenabled()
        HeavyImports.depth += 1
        gc.disable()
        shadowed = outermost and "compile" not in vars(typing)
        if shadowed:
            typing.compile = _compile_once   # a global of typing's, found before the builtin
        try:
            with _without_banners() if outermost else contextlib.nullcontext():
                self._loader.exec_module(module)
        finally:
            HeavyImports.depth -= 1
            module.__spec__.loader = module.__loader__ = self._loader   # as if it had never been wrapped
            if shadowed:
                del typing.compile
            if outermost:
                gc.freeze()
                if was_enabled:
                    gc.enable()


class HeavyImports:
    """A meta path finder (installed by `harness/__init__.py`) that gives each module of `HEAVY` the loader above;
    it finds nothing itself, and a module already imported is never seen."""

    depth = 0
    _finding = False

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in HEAVY or cls._finding:
            return None
        cls._finding = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            cls._finding = False
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _CollectorOffLoader(spec.loader)
        return spec


def install() -> None:
    """Put `HeavyImports` first on `sys.meta_path` (once)."""
    if HeavyImports not in sys.meta_path:
        sys.meta_path.insert(0, HeavyImports)
