"""Shared fixtures: the real exports (../shared/data, or fetched: tests/shared_data.py) and small synthetic exports."""
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # shared test helpers (procs.py) for the importlib import mode


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """The folder of real exports: ../shared/data (HARNESS_SHARED_DATA), or the cache its files are fetched into
    from their public sources; the test is skipped, with what was tried, when neither can be had."""
    import shared_data as sd

    try:
        return sd.shared_data_root()
    except sd.SharedDataUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(autouse=True)
def _isolated_index(tmp_path_factory, monkeypatch):
    """Each test session gets its own record index (HARNESS_CACHE_DIR), never the user's ~/.cache."""
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "harness-cache"))


def pytest_configure(config):
    """Two logical CPU devices for the whole test process, so MirroredStrategy tests get 2 replicas.

    Must run before TensorFlow initializes its runtime (the first op); tests that need another device layout
    run in subprocesses."""
    import harness  # noqa: F401  (selects Keras 2 before TensorFlow is imported)
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


@pytest.fixture(scope="session")
def cpu_mirrored():
    """One MirroredStrategy over the 2 logical CPUs for the whole session.

    Several MirroredStrategy objects in one process reuse collective instance keys and abort with "Shape mismatch
    in the collective instance"; reduction to one device avoids collectives on a single host's CPUs."""
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                          cross_device_ops=tf.distribute.ReductionToOneDevice())


def pytest_collection_finish(session):
    """Refuse a run in which importing a test module turned TensorFlow's eager execution off for the whole process
    (earthengine-api's ee.cli.commands calls tf.compat.v1.disable_v2_behavior() at import: every later test that
    iterates a dataset then fails with "only supported in eager mode"). Such a module runs its import in a child
    process (tests/predict/scripts/ee_manifests.py)."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and not tf.executing_eagerly():
        raise pytest.UsageError("a test module turned off TensorFlow's eager execution when it was imported: "
                                "import it in a child process")


@pytest.fixture(scope="session")
def gcs_bed(tmp_path_factory):
    """A Cloud Storage bucket `gs://bucket` on loopback that TensorFlow's own gs:// file system reaches through a
    local proxy (tests/gcs_bed.py): one child process for the session, stopped at its end, also after a failure.
    Use `gcs` in tests, which also checks that nothing tried to leave loopback."""
    from gcs_bed import GcsBed

    bed = GcsBed(tmp_path_factory.mktemp("gcs-bed"))
    bed.start()
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture
def gcs(gcs_bed, monkeypatch):
    """`gcs_bed`, with this process's environment routed to it (`GcsBed.env()`; subprocesses inherit it) and the
    credentials probe reset; fails the test when the proxy refused a request during it (a host other than Google
    Cloud Storage's, or plain HTTP: something tried to leave loopback)."""
    from harness.data import gcs as gcs_lib

    before = len(gcs_bed.refused())
    for k in [k for k in os.environ if "proxy" in k.lower() or k in ("GOOGLE_APPLICATION_CREDENTIALS",
                                                                      "GOOGLE_AUTH_TOKEN_FOR_TESTING")]:
        monkeypatch.delenv(k)
    for k, v in gcs_bed.env({}).items():
        monkeypatch.setenv(k, v)
    gcs_lib.reset()
    yield gcs_bed
    gcs_lib.reset()
    refused = gcs_bed.refused()[before:]
    assert not refused, f"the GCS bed's proxy refused (traffic meant to leave loopback): {refused}"
