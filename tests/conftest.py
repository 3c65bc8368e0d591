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

import procs  # noqa: E402  (tests/procs.py, on the path just above)

for _name, _value in procs.SUITE_ENV.items():   # every process the tests start inherits them
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """The folder of real exports: ../shared/data (HARNESS_SHARED_DATA), or the cache its files are fetched into
    from their public sources; the test is skipped, with what was tried, when neither can be had."""
    import shared_data as sd

    try:
        return sd.shared_data_root()
    except sd.SharedDataUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(autouse=True, scope="session")
def _isolated_index(tmp_path_factory):
    """Each test session gets its own record index (HARNESS_CACHE_DIR), never the user's ~/.cache: set for the
    whole session, before any module fixture starts a process (a function's monkeypatch came after them)."""
    saved = os.environ.get("HARNESS_CACHE_DIR")
    os.environ["HARNESS_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "harness-cache")
    yield
    if saved is None:
        os.environ.pop("HARNESS_CACHE_DIR", None)
    else:
        os.environ["HARNESS_CACHE_DIR"] = saved


def pytest_configure(config):
    """Two logical CPU devices for the whole test process, so MirroredStrategy tests get 2 replicas.

    Must run before TensorFlow initializes its runtime (the first op); tests that need another device layout
    run in subprocesses. Under pytest-xdist the controller runs no test and imports nothing."""
    config.addinivalue_line("markers", "serial(reason): the test runs with no other test beside it when the suite "
                                       "runs on parallel workers (tests/README.md: its assertions read the clock)")
    config.addinivalue_line("markers", "waits(reason): the test mostly waits (a peer timeout, a grace period): on "
                                       "parallel workers its file runs in the one stream of such files, beside "
                                       f"{CPU_SLOTS} tests that keep a core busy (tests/README.md)")
    if not hasattr(config, "workerinput"):   # the process that prints the summary
        config.stash[_IMPORT_CPU] = _start_import_probe()
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


# Tests that keep a core busy run at most this many at once (the cores of the machine CI runs on); the stream of
# `waits` files runs beside them (`make test`: 3 workers, `--dist loadgroup`).
CPU_SLOTS = 2
SERIAL, CPU, WAITS = "serial", "cpu", "waits"


class _Turns:
    """Who runs now, when the suite runs on pytest-xdist workers: a test marked `serial` alone; every other test
    beside any other unmarked one, and an unmarked one (CPU) also in one of CPU_SLOTS slots, so that a third worker
    adds a stream of `waits` tests without a third test that needs a core.

    A readers-writer lock across the workers' processes: flock(2) on one file, shared for an unmarked test,
    exclusive for a serial one, behind a gate file that a serial test holds while it waits, so that the other
    workers' next tests queue behind it instead of keeping it waiting for ever; then a CPU test takes the first
    free slot file (flock, polled every 50 ms), after the gate, so that a test waiting for a slot never holds the
    gate. Each wait is bounded by the tests being waited for, which pytest-timeout bounds."""

    def __init__(self, stem: str):
        self._gate = open(stem + ".gate", "a+")
        self._lock = open(stem + ".lock", "a+")
        self._slots = [open(f"{stem}.cpu{i}", "a+") for i in range(CPU_SLOTS)]

    @contextlib.contextmanager
    def turn(self, kind: str):
        alone = kind == SERIAL
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(self._gate, fcntl.LOCK_UN)
        slot = None
        try:
            slot = self._take_slot() if kind == CPU else None
            yield
        finally:
            if slot is not None:
                fcntl.flock(slot, fcntl.LOCK_UN)
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(self._gate, fcntl.LOCK_UN)

    def _take_slot(self):
        while True:
            for slot in self._slots:
                try:
                    fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return slot
                except BlockingIOError:
                    pass
            time.sleep(0.05)


_TURNS = pytest.StashKey()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """On a pytest-xdist worker, a test's setup, call and teardown take their turn (`_Turns`): a `serial` test
    alone, an unmarked one in a CPU slot, a `waits` one beside them."""
    turn = contextlib.nullcontext()
    folder = os.environ.get("HARNESS_TEST_TURNS")
    if folder is not None and hasattr(item.config, "workerinput"):
        if _TURNS not in item.config.stash:
            item.config.stash[_TURNS] = _Turns(os.path.join(folder, "turns"))
        kind = SERIAL if item.get_closest_marker(SERIAL) else WAITS if item.get_closest_marker(WAITS) else CPU
        turn = item.config.stash[_TURNS].turn(kind)
    with turn, _cpu_logged(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The teardown's report carries the CPU seconds of the whole test (setup, call and teardown: this process and
    the children it waited for) as the user property `cpu_s`, which pytest-xdist sends to the controller's table
    of where the time went (`pytest_terminal_summary`)."""
    outcome = yield
    start = item.stash.get(_CPU_START, None)
    if call.when == "teardown" and start is not None:
        outcome.get_result().user_properties.append(("cpu_s", round(_cpu_seconds() - start, 3)))


def _cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its children that ended and were waited for."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


_CPU_START = pytest.StashKey()


@contextlib.contextmanager
def _cpu_logged(item):
    """The test's CPU seconds from its setup on (`_CPU_START`, read by `pytest_runtest_makereport`); with
    HARNESS_TEST_CPU_LOG=FILE also one JSON line per test appended to FILE: its node id, wall seconds and the CPU
    seconds it and the processes it started spent (setup, call and teardown), when it started (Unix seconds, after
    its turn came) and on which pytest-xdist worker: where a 2-core run's time goes, and where the cores sat idle."""
    start, wall, cpu = time.time(), time.monotonic(), _cpu_seconds()
    item.stash[_CPU_START] = cpu
    log = os.environ.get("HARNESS_TEST_CPU_LOG")
    if not log:
        yield
        return
    try:
        yield
    finally:
        line = json.dumps({"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 3),
                           "cpu_s": round(_cpu_seconds() - cpu, 3), "start": round(start, 3),
                           "worker": os.environ.get("PYTEST_XDIST_WORKER", "")})
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


# The order the workers take the files in (pytest-xdist, a file at a time per worker, in this order): first the files
# marked `waits` (one group under `make test`'s `--dist loadgroup`: one worker starts on them at once and runs them
# beside the others), then the longest files, so that the run does not end on one worker alone. Wall seconds of a
# fresh clone's `make test` on 2 cores (CPU seconds in brackets; 8f46e95, 2026-12-06); every other file follows in
# collection order.
RUN_FIRST = (
    "cluster/test_faults.py",                # waits: 215 s (82), peer timeouts, a worker 25 s late
    "distribute/test_peer_faults.py",        # waits: 153 s (63), a rank 45 s late
    "launch/test_launcher_stop.py",          # waits: 68 s (20), grace periods
    "train/lifecycle/test_peers.py",         # waits: 10 s (0), the watchdog's bounds
    "bench/test_benchmarks_start.py",        # 228 s (168)
    "launch/test_fault_tolerance.py",        # 148 s (87)
    "test_ports_inventory.py",               # 120 s (90)
    "data/export/test_gcs_bucket.py",        # 116 s (52, and its bucket's process)
    "train/test_layouts_run.py",             # 100 s (81): each layout on 1 and 2 workers
    "cluster/test_horovod_hosts.py",         # 68 s (49)
    "distribute/test_horovod_backend.py",    # 61 s (54)
    "predict/test_readme_roundtrip.py",      # 55 s (42)
    "bench/test_tune.py",                    # 55 s (38)
    "train/measure/test_tune.py",            # 49 s (30)
)


@pytest.hookimpl(tryfirst=True)   # before xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(session, config, items):
    """On pytest-xdist workers, order the tests by RUN_FIRST, then as collected (a stable sort: tests keep their
    order within a file); a run in one process keeps the collected order. Under `--dist loadgroup` each file is a
    group (a worker runs it whole, as `--dist loadfile` does), and every file marked `waits` is in the one group
    WAITS: one worker runs those one after the other beside the CPU_SLOTS tests of the others."""
    if not hasattr(config, "workerinput"):
        return
    if config.getvalue("loadgroup"):   # xdist sets it on the workers (their `dist` is "no")
        # A file with one test marked `waits` goes whole into WAITS: a group per test would split the file over two
        # workers (its module fixtures built twice), which pytest_sessionfinish refuses.
        waiting = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker(WAITS) is not None}
        for item in items:
            path = item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(WAITS if path in waiting else path))
    first = {name: i for i, name in enumerate(RUN_FIRST)}
    tests = pathlib.Path(__file__).resolve().parent

    def rank(item):
        try:
            return first.get(item.path.relative_to(tests).as_posix(), len(first))
        except ValueError:
            return len(first)
    items.sort(key=rank)


_WORKERS_OF_FILE: dict = {}   # on the xdist controller: test file -> the workers that ran its tests


_TIME_OF_FOLDER: dict = {}   # test folder -> [tests, wall seconds, CPU seconds] (setup, call and teardown)
_IMPORT_CPU = pytest.StashKey()
# The machine's speed in the unit every process the suite starts pays: the CPU seconds of `import harness,
# tensorflow` in a fresh interpreter, measured once while the suite runs (the same machine gave 1.5-1.6 one day and
# 3.0-3.8 another: runs are compared in this unit, tests/README.md)
_IMPORT_PROBE = ("import time; t = time.process_time(); import harness, tensorflow; "
                 "print(f'{time.process_time() - t:.2f}')")


def _start_import_probe():
    import subprocess

    return subprocess.Popen([sys.executable, "-c", _IMPORT_PROBE], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def _import_cpu(config) -> str:
    """The probe's CPU seconds as text, or why there is none (waits at most 60 s for it)."""
    import subprocess

    probe = config.stash.get(_IMPORT_CPU, None)
    if probe is None:
        return "not measured"
    try:
        out, _ = probe.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        probe.kill()
        probe.communicate()
        return "not measured (over 60 s)"
    return f"{out.strip()} CPU-s" if probe.returncode == 0 and out.strip() else f"failed (exit {probe.returncode})"


def pytest_runtest_logreport(report):
    """On the pytest-xdist controller, which worker ran each file's tests (`report.node`: the worker's gateway);
    in the process that prints the summary, each folder's tests, wall and CPU seconds."""
    node = getattr(report, "node", None)
    if node is not None and report.when == "call":
        _WORKERS_OF_FILE.setdefault(report.nodeid.split("::")[0], set()).add(node.gateway.id)
    folder = report.nodeid.split("::")[0].rpartition("/")[0] or "."
    row = _TIME_OF_FOLDER.setdefault(folder, [0, 0.0, 0.0])
    row[1] += report.duration
    if report.when == "teardown":
        row[0] += 1
        row[2] += dict(report.user_properties).get("cpu_s", 0.0)


@pytest.hookimpl(trylast=True)   # after `--durations`' slowest tests
def pytest_terminal_summary(terminalreporter):
    """Where the time went, at the end of the run: per test folder the tests, their wall seconds (setup, call and
    teardown, summed: tests on parallel workers overlap) and their CPU seconds (each test's process and the
    children it waited for: on 2 cores the suite's wall is at least half the total)."""
    if not _TIME_OF_FOLDER:
        return
    write = terminalreporter.write_line
    terminalreporter.section("time per test folder")
    write(f"{'folder':<28} {'tests':>6} {'wall s':>9} {'CPU s':>9}")
    total = [0, 0.0, 0.0]
    for folder, (tests, wall, cpu) in sorted(_TIME_OF_FOLDER.items(), key=lambda kv: -kv[1][2]):
        write(f"{folder:<28} {tests:>6} {wall:>9.1f} {cpu:>9.1f}")
        total = [total[0] + tests, total[1] + wall, total[2] + cpu]
    write(f"{'all':<28} {total[0]:>6} {total[1]:>9.1f} {total[2]:>9.1f}")
    write(f"this machine: `import harness, tensorflow` in a fresh process, {_import_cpu(terminalreporter.config)}")


def pytest_sessionfinish(session, exitstatus):
    """Fail a parallel run in which a file's tests ran on two workers: `--dist loadgroup` then split the groups
    (each file, and the `waits` files together) and every module fixture was built once per worker. pytest 9.2
    with pytest-xdist 3.8 did that silently (setup.cfg pins pytest below 9.2)."""
    split = {path: sorted(workers) for path, workers in _WORKERS_OF_FILE.items() if len(workers) > 1}
    if split and session.config.getvalue("dist") == "loadgroup":
        print(f"\n--dist loadgroup split {len(split)} test file(s) over workers, e.g. "
              f"{dict(list(split.items())[:3])}: the groups of tests/conftest.py did not hold (pytest, pytest-xdist "
              "versions)", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_finish(session):
    """Refuse a run in which importing a test module turned TensorFlow's eager execution off for the whole process
    (earthengine-api's ee.cli.commands calls tf.compat.v1.disable_v2_behavior() at import: every later test that
    iterates a dataset then fails with "only supported in eager mode"). Such a module runs its import in a child
    process (tests/predict/scripts/ee_manifests.py)."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and not tf.executing_eagerly():
        raise pytest.UsageError("a test module turned off TensorFlow's eager execution when it was imported: "
                                "import it in a child process")
    # Nor may importing one start TensorFlow's runtime (a module-level `tf.constant`): every pytest-xdist worker
    # imports every module, and the in-process tests that set TF_CONFIG (a worker that never arrives) need the
    # runtime of their worker unstarted; one such module failed them in the full run only.
    if tf is not None:
        from tensorflow.python.eager import context

        if context.context()._context_handle is not None:   # set by the first op (TF 2.21, eager/context.py)
            raise pytest.UsageError("a test module ran a TensorFlow op when it was imported (TensorFlow's runtime "
                                    "started at collection): make it inside a test or a fixture")


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
    from harness.data.export import gcs as gcs_lib

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
