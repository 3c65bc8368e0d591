"""The traces as the user sees them: the `tensorboard --logdir` command the report prints, run as printed, lists
every worker's trace in the profile plugin; a TensorBoard, plugin or converter that does not import is said in the
printed table, not only in report.json."""
import gzip
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import tensorflow as tf

from harness.profile import trace as trace_lib

START_S = 180  # TensorBoard's start and first scan of the logdir, on 2 busy cores


def _trace_as_worker(rank: int, logdir: str) -> trace_lib.TraceResult:
    """What another worker's session leaves: its ProfileWindow around 2 steps, in its own `worker-<rank>/`."""
    step = tf.function(lambda x: tf.linalg.matmul(x, x))
    window = trace_lib.ProfileWindow(logdir, first=1, last=2, rank=rank)
    for s in (1, 2, 3):
        window.before_step(s)
        step(tf.ones([8, 8]))
        window.after_step(s)
    return window.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read()
        if r.headers.get("Content-Encoding") == "gzip":  # the plugin gzips its answers
            body = gzip.decompress(body)
    return json.loads(body)


def test_printed_tensorboard_command_lists_every_workers_trace(tmp_path, delayed_run, capsys):
    _, report = delayed_run(0.020, 0.005, tmp_path, trace_steps=(8, 10))
    other = _trace_as_worker(1, report["traces"]["logdir"])
    assert other.ok and not other.viewer and not report["traces"]["viewer"]
    printed = re.search(r"^traces: (tensorboard --logdir .+)$", capsys.readouterr().out, re.M).group(1)
    assert printed == f"tensorboard --logdir {tmp_path / 'tensorboard'}"
    runs = {f"worker-{rank}/{os.path.basename(os.path.dirname(xplane))}"
            for rank, xplane in ((0, report["parts"][0]["trace"]["xplane"]), (1, other.xplane))}

    venv_bin = pathlib.Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    assert shutil.which("tensorboard", path=env["PATH"]) == str(venv_bin / "tensorboard")
    port = _free_port()
    base = f"http://127.0.0.1:{port}/data/plugin/profile"
    proc = subprocess.Popen(shlex.split(printed) + ["--port", str(port), "--host", "127.0.0.1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    listed, tools, deadline = None, None, time.monotonic() + START_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                listed = _get_json(f"{base}/runs")
                if set(listed) >= runs:
                    tools = _get_json(f"{base}/run_tools?run={urllib.parse.quote(sorted(runs)[1])}")
                    break
            except (OSError, ValueError):  # not listening yet (URLError is an OSError), or an answer cut short
                pass
            time.sleep(1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate(timeout=30)[0]
    assert listed is not None and sorted(listed) == sorted(runs), f"listed {listed}, expected {runs}\n{out[-3000:]}"
    # the plugin reads the trace (XProf, tensorboard-plugin-profile >= 2.20, lists the tools without the caret)
    assert {"input_pipeline_analyzer", "overview_page"} <= {t.rstrip("^") for t in tools}, tools


def test_viewer_and_converter_failures_are_printed_in_the_table(tmp_path, delayed_run, capsys, monkeypatch, caplog):
    for name in ("etils", "etils.epath"):
        monkeypatch.setitem(sys.modules, name, None)  # `import etils` now fails, as where it is not installed
    for name in ("tensorboard_plugin_profile.profile_plugin", "xprof.profile_plugin"):   # imported afresh
        monkeypatch.delitem(sys.modules, name, raising=False)

    def no_converter():
        raise ImportError("No module named 'tensorboard_plugin_profile'")

    monkeypatch.setattr(trace_lib, "_converter", no_converter)
    _, report = delayed_run(0.020, 0.005, tmp_path, trace_steps=(8, 10))
    out = capsys.readouterr().out
    (viewer,) = report["traces"]["viewer"]
    assert viewer.startswith("TensorBoard's profile plugin (it imports etils.epath) does not import: "
                             "ModuleNotFoundError")
    assert "etils" in viewer and viewer.endswith("(pip install 'harness[profile]')")
    assert f"TENSORBOARD BROKEN: {viewer}" in out
    assert any(r.getMessage() == f"worker 0: TensorBoard will not show the trace: {viewer}" for r in caplog.records)
    (analysis,) = report["traces"]["analysis"]
    assert analysis.startswith("worker 0: input_pipeline_analyzer failed on ") and "No module named" in analysis
    assert f"PROFILER ANALYSIS FAILED: {analysis}" in out


def test_tensorboard_and_its_profile_plugin_import_here():
    assert trace_lib.viewer_problems() == []


def test_printed_command_quotes_a_path_with_spaces(tmp_path):
    logdir = tmp_path / "my runs" / "tensorboard"
    assert shlex.split(trace_lib.tensorboard_command(str(logdir))) == ["tensorboard", "--logdir", str(logdir)]
