"""Shared fixtures: the real exports (../shared/data, or fetched: tests/shared_data.py) and small synthetic exports."""
import contextlib
import fcntl
import json
import os
import pathlib
import resource
import shutil
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # shared test helpers (procs.py) for the importlib import mode

# Open MPI's ranks busy-poll while they wait in a collective unless oversubscribed (more ranks than cores), which
# Open MPI does not see here: the suite's 2 ranks share the 2 cores with the other test worker, and a rank that
# spins takes the core its peer needs (a 2-rank `harness launch mpi` train: 25.3 -> 16.1 CPU-s, 7.9 -> 2.2 s of
# it in the kernel). Every process the tests start inherits it (mpirun and horovodrun pass OMPI_MCA_* on).
os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


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
    run in subprocesses. Under pytest-xdist the controller runs no test and imports nothing."""
    config.addinivalue_line("markers", "serial(reason): the test runs with no other test beside it when the suite "
                                       "runs on parallel workers (tests/README.md: its assertions read the clock)")
    if _xdist_controller(config):   # the folder of the workers' lock files (_Turns); they inherit the environment
        folder = tempfile.mkdtemp(prefix="harness-pytest-turns-")
        os.environ["HARNESS_TEST_TURNS"] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
        return
    import harness  # noqa: F401  (selects Keras 2 before TensorFlow is imported)
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


def _xdist_controller(config) -> bool:
    """Whether this process is pytest-xdist's controller (it hands tests to the workers and runs none)."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


class _Turns:
    """Who runs now, when the suite runs on pytest-xdist workers: a test marked `serial` alone, every other test
    beside any other unmarked one. A readers-writer lock across the workers' processes: flock(2) on one file,
    shared for an unmarked test, exclusive for a serial one, behind a gate file that a serial test holds while it
    waits, so that the other workers' next tests queue behind it instead of keeping it waiting for ever. Each wait
    is bounded by the test being waited for, which pytest-timeout bounds."""

    def __init__(self, stem: str):
        self._gate = open(stem + ".gate", "a+")
        self._lock = open(stem + ".lock", "a+")

    @contextlib.contextmanager
    def turn(self, alone: bool):
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(self._gate, fcntl.LOCK_UN)


_TURNS = pytest.StashKey()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """On a pytest-xdist worker, a `serial` test's setup, call and teardown run with no other test beside them."""
    turn = contextlib.nullcontext()
    folder = os.environ.get("HARNESS_TEST_TURNS")
    if folder is not None and hasattr(item.config, "workerinput"):
        if _TURNS not in item.config.stash:
            item.config.stash[_TURNS] = _Turns(os.path.join(folder, "turns"))
        turn = item.config.stash[_TURNS].turn(alone=item.get_closest_marker("serial") is not None)
    with turn, _cpu_logged(item):
        yield


def _cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its children that ended and were waited for."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def _cpu_logged(item):
    """With HARNESS_TEST_CPU_LOG=FILE, one JSON line per test appended to FILE: its node id, wall seconds and the
    CPU seconds it and the processes it started spent (setup, call and teardown): where a 2-core run's time goes."""
    log = os.environ.get("HARNESS_TEST_CPU_LOG")
    if not log:
        yield
        return
    wall, cpu = time.monotonic(), _cpu_seconds()
    try:
        yield
    finally:
        line = json.dumps({"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 3),
                           "cpu_s": round(_cpu_seconds() - cpu, 3)})
        with open(log, "a") as f:
            f.write(line + "\n")


@pytest.fixture(scope="session")
def cpu_mirrored():
    """One MirroredStrategy over the 2 logical CPUs for the whole session.

    Several MirroredStrategy objects in one process reuse collective instance keys and abort with "Shape mismatch
    in the collective instance"; reduction to one device avoids collectives on a single host's CPUs."""
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                          cross_device_ops=tf.distribute.ReductionToOneDevice())


# The longest files first, so that two workers (`make test TEST_WORKERS=2`: pytest-xdist, one file at a time per
# worker) do not end on one of them alone; the files that mostly wait (a peer timeout, a late worker: wall about twice their CPU) between
# those that keep a core busy, so that a wait overlaps another file's work. Wall seconds of one serial run on the
# 2-core machine, in brackets; every other file follows in collection order.
RUN_FIRST = (
    "cluster/test_faults.py",                # 218 s, half of it waiting for peer timeouts
    "bench/test_benchmarks_start.py",        # 221 s, CPU
    "distribute/test_peer_faults.py",        # 139 s, half waiting (a rank 45 s late)
    "launch/test_fault_tolerance.py",        # 203 s, CPU
    "launch/test_launcher_stop.py",          # 45 s, a quarter CPU (grace periods)
    "distribute/test_horovod_backend.py",    # 128 s, CPU
    "data/test_gcs_bucket.py",               # 100 s
    "test_ports_inventory.py",               # 120 s, CPU
    "train/test_faults_named.py",            # 52 s, waiting for watchdog bounds
    "train/test_tune.py",                    # 88 s, CPU
    "cluster/test_horovod_hosts.py",         # 52 s
    "train/test_job.py",                     # 53 s
)


def pytest_collection_modifyitems(session, config, items):
    """On pytest-xdist workers, order the tests by RUN_FIRST, then as collected (a stable sort: tests keep their
    order within a file); a run in one process keeps the collected order."""
    if not hasattr(config, "workerinput"):
        return
    first = {name: i for i, name in enumerate(RUN_FIRST)}
    tests = pathlib.Path(__file__).resolve().parent

    def rank(item):
        try:
            return first.get(item.path.relative_to(tests).as_posix(), len(first))
        except ValueError:
            return len(first)
    items.sort(key=rank)


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
