"""`import harness` before TensorFlow: TensorFlow's GCE and TPU client modules, which need oauth2client beside
googleapiclient, do not import googleapiclient where oauth2client is absent (harness/__init__.py); every other
importer gets it."""
import importlib.util
import sys

import pytest

import harness

pytestmark = pytest.mark.skipif(importlib.util.find_spec("googleapiclient") is None
                                or importlib.util.find_spec("oauth2client") is not None,
                                reason="needs googleapiclient (earthengine-api) installed and oauth2client absent")


@pytest.fixture
def fresh_googleapiclient(monkeypatch):
    """googleapiclient as if not yet imported (restored afterwards)."""
    for name in [n for n in sys.modules if n == "googleapiclient" or n.startswith("googleapiclient.")]:
        monkeypatch.delitem(sys.modules, name)


def _import_as(module_name: str):
    exec(compile("import googleapiclient", "<test>", "exec"), {"__name__": module_name})


@pytest.mark.parametrize("importer", harness._NEED_OAUTH2CLIENT)
def test_tensorflows_client_modules_find_no_googleapiclient(fresh_googleapiclient, importer):
    assert harness._NoClientWithoutOauth2client in sys.meta_path
    with pytest.raises(ModuleNotFoundError, match="needs the absent oauth2client"):
        _import_as(importer)
    assert "googleapiclient" not in sys.modules


def test_every_other_importer_gets_it(fresh_googleapiclient):
    _import_as("my_module")
    assert "googleapiclient" in sys.modules


def test_tensorflow_imported_without_it_treats_the_client_as_absent():
    from tensorflow.python.distribute.cluster_resolver import gce_cluster_resolver
    assert gce_cluster_resolver._GOOGLE_API_CLIENT_INSTALLED is False
