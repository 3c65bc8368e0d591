"""harness/heavy_imports.py: TensorFlow imported without the cyclic collector, its objects frozen after, the collector
and the module's loader as they were."""
import gc
import importlib
import sys
import typing

import pytest

from harness import heavy_imports


def test_this_process_imported_tensorflow_through_the_hook():
    # tests/conftest.py imports harness, then TensorFlow
    import tensorflow as tf

    assert heavy_imports.HeavyImports in sys.meta_path
    assert gc.get_freeze_count() > 100_000, "TensorFlow's objects were not frozen"
    assert gc.isenabled()
    assert type(tf.__spec__.loader).__name__ == "SourceFileLoader" and tf.__loader__ is tf.__spec__.loader
    # typing's compile shadowed during the import only; TensorFlow's ~18,000 ForwardRef strings compiled ~100 times
    import typing
    assert "compile" not in vars(typing)
    cached = heavy_imports._compile_once.cache_info()
    assert cached.hits > 10_000 and cached.misses < 200, cached


def test_forward_refs_made_during_a_heavy_import_equal_those_made_after(module_named):
    body = "import typing\nT = typing.TypeVar('T', 'int', 'str')\nU = typing.TypeVar('U', 'int', 'str')\n"
    module = importlib.import_module(module_named("heavy_probe_typing", body))
    after = typing.TypeVar("V", "int", "str")
    assert module.T.__constraints__ == module.U.__constraints__ == after.__constraints__
    assert module.T.__constraints__[0].__forward_code__ is module.U.__constraints__[0].__forward_code__
    assert typing.get_type_hints(lambda x: None) == {} and "compile" not in vars(typing)


@pytest.fixture
def module_named(tmp_path, monkeypatch):
    """A module `name` in tmp_path, made heavy (in `HEAVY`) for the test; forgotten afterwards."""
    def make(name, body):
        (tmp_path / f"{name}.py").write_text(body)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setattr(heavy_imports, "HEAVY", (*heavy_imports.HEAVY, name))
        monkeypatch.delitem(sys.modules, name, raising=False)
        importlib.invalidate_caches()
        return name
    yield make


def test_a_heavy_module_runs_with_the_collector_off_and_is_frozen_after(module_named):
    name = module_named("heavy_probe_a", "import gc\nCOLLECTING = gc.isenabled()\nOBJECTS = [[] for _ in range(5000)]\n")
    before = gc.get_freeze_count()
    module = importlib.import_module(name)
    assert module.COLLECTING is False
    assert gc.isenabled() and gc.get_freeze_count() >= before + 5000
    assert type(module.__loader__).__name__ == "SourceFileLoader" and module.__spec__.loader is module.__loader__


def test_a_collector_the_user_turned_off_stays_off(module_named):
    name = module_named("heavy_probe_b", "X = 1\n")
    gc.disable()
    try:
        importlib.import_module(name)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_failing_heavy_import_raises_its_own_error_and_restores_the_collector(module_named):
    name = module_named("heavy_probe_c", "raise ImportError('the module itself failed')\n")
    with pytest.raises(ImportError, match="the module itself failed"):
        importlib.import_module(name)
    assert gc.isenabled() and heavy_imports.HeavyImports.depth == 0


def test_a_missing_heavy_module_is_not_found_as_usual(monkeypatch):
    monkeypatch.setattr(heavy_imports, "HEAVY", (*heavy_imports.HEAVY, "no_such_heavy_module"))
    with pytest.raises(ModuleNotFoundError, match="no_such_heavy_module"):
        importlib.import_module("no_such_heavy_module")
