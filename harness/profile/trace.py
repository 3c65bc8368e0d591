"""tf.profiler traces of a window of steps on every worker, their check, and the profiler's own input analysis.

Each worker traces into its own folder, `LOGDIR/worker-<rank>/plugins/profile/<run>/<host>.xplane.pb`: workers on
one host share the host name and the second-resolution run folder, so with one folder for all, a later worker's
trace would overwrite an earlier one's. TensorBoard's profile plugin looks for `plugins/profile/` only in the logdir
root and in TensorBoard runs, the folders holding an event file (its `generate_runs`), so each worker also writes an
event file holding no summary into its folder: `tensorboard --logdir LOGDIR` then lists `worker-<rank>/<run>` for
every worker. Whether TensorBoard, the plugin and its converter import here is checked when the window is made
(`viewer_problems`), so a broken install is said at the start and in the report's table. Steps inside the window
are marked with `tf.profiler.experimental.Trace("train", step_num=...)`, which is what the profiler's step-time and
input-pipeline analysis keys on.

The input-bound figure is read with tensorboard-plugin-profile's converter (`xspace_to_tool_data`, tool
`input_pipeline_analyzer`), the code behind TensorBoard's Profile tab, so it is the profiler's number, not ours.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import re
import shlex
import warnings
from importlib import metadata
from typing import Optional

import tensorflow as tf

from harness.errors import ConfigError

log = logging.getLogger(__name__)


def parse_step_window(text: str) -> tuple[int, int]:
    """`"10:20"` -> `(10, 20)`: global steps 10 to 20, both traced (as Keras' `profile_batch="10,20"`).

    Raises:
      ConfigError: unless the text is `START:STOP` with 1 <= START <= STOP.
    """
    m = re.fullmatch(r"\s*(\d+)\s*[:,]\s*(\d+)\s*", text or "")
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ConfigError(f"--profile-steps {text!r}: expected START:STOP with 1 <= START <= STOP (e.g. 10:20)")
    return int(m.group(1)), int(m.group(2))


def worker_logdir(logdir: str, rank: int) -> str:
    return os.path.join(logdir, f"worker-{rank}")


@dataclasses.dataclass(frozen=True)
class TraceResult:
    """What one worker's window left: the `.xplane.pb` (None when missing), its size, the steps traced, and the
    error when tracing failed."""

    rank: int
    logdir: str
    xplane: Optional[str]
    bytes: int
    steps: tuple[int, int]
    error: str = ""
    viewer: tuple[str, ...] = ()  # why TensorBoard would not show it (`viewer_problems`); empty when it would

    @property
    def ok(self) -> bool:
        return self.xplane is not None and self.bytes > 0

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), ok=self.ok)


class ProfileWindow:
    """A `Trainer` step hook: starts tf.profiler before step `first`, stops it after step `last`.

    Call `close()` after training: it stops a window the run did not reach the end of, and returns the
    `TraceResult` (also for a window never started, with the error saying so).
    """

    def __init__(self, logdir: str, *, first: int, last: int, rank: int):
        self.logdir, self.first, self.last, self.rank = worker_logdir(logdir, rank), first, last, rank
        self._active = False
        self._done = False
        self._step_trace = None
        self._error = ""
        self.viewer = tuple(viewer_problems())
        for problem in self.viewer:
            log.warning("worker %d: TensorBoard will not show the trace: %s", rank, problem)

    def before_step(self, step: int) -> None:
        if not self._done and not self._active and self.first <= step <= self.last:
            try:
                tf.io.gfile.makedirs(self.logdir)
                mark_tensorboard_run(self.logdir)
                tf.profiler.experimental.start(self.logdir)
                self._active = True
            except (tf.errors.AlreadyExistsError, tf.errors.UnavailableError) as e:
                self._error, self._done = f"profiler did not start: {e}", True
                log.warning("worker %d: %s", self.rank, self._error)
        if self._active:
            self._step_trace = tf.profiler.experimental.Trace("train", step_num=step, _r=1)
            self._step_trace.__enter__()

    def after_step(self, step: int) -> None:
        if self._step_trace is not None:
            self._step_trace.__exit__(None, None, None)
            self._step_trace = None
        if self._active and step >= self.last:
            self._stop()

    def _stop(self) -> None:
        try:
            tf.profiler.experimental.stop()
        except tf.errors.UnavailableError as e:
            self._error = f"profiler did not stop: {e}"
        self._active, self._done = False, True

    def close(self) -> TraceResult:
        if self._step_trace is not None:
            self._step_trace.__exit__(None, None, None)
            self._step_trace = None
        if self._active:
            self._stop()
        if not self._done and not self._error:
            self._error = f"the run ended before step {self.first}: nothing traced"
        return dataclasses.replace(find_trace(self.logdir, rank=self.rank, steps=(self.first, self.last),
                                              error=self._error), viewer=self.viewer)


def mark_tensorboard_run(logdir: str) -> None:
    """Write an event file holding no summary into `logdir`, so that TensorBoard counts it as a run and its profile
    plugin finds the traces under it. A failure is logged, never raised: the trace itself does not need it."""
    try:
        writer = tf.summary.create_file_writer(logdir)
        writer.flush()
        writer.close()
    except (tf.errors.OpError, OSError) as e:
        log.warning("no TensorBoard event file in %s (TensorBoard will not list this trace): %s", logdir, e)


# (module, what it is): what `tensorboard --logdir` needs to show a trace; "PROFILER." is the profile plugin's own
# package: `xprof` (tensorboard-plugin-profile >= 2.20 is a passthrough to it, whose submodules do not import under
# the old name), else `tensorboard_plugin_profile`.
VIEWER_MODULES = (
    ("tensorboard.default", "TensorBoard (it imports pkg_resources: setuptools<81)"),
    ("PROFILER.profile_plugin", "TensorBoard's profile plugin (it imports etils.epath)"),
    ("PROFILER.convert.raw_to_tool_data", "the profile plugin's converter"),
)


def profiler_module(name: str):
    """The profile plugin's module `name` (`convert.raw_to_tool_data`, `protobuf.overview_page_pb2`): from `xprof`
    where it is installed (tensorboard-plugin-profile 2.20 and later), else from `tensorboard_plugin_profile`.

    Raises:
      ImportError: neither has it."""
    try:
        return importlib.import_module(f"xprof.{name}")
    except ImportError:
        return importlib.import_module(f"tensorboard_plugin_profile.{name}")


def viewer_problems() -> list[str]:
    """Why `tensorboard --logdir LOGDIR` would not show the traces, one line each: a module of VIEWER_MODULES that
    fails to import, or no `profile` plugin registered with TensorBoard (entry point group `tensorboard_plugins`);
    empty when all is in place. The remedy is the `profile` extra (pip install 'harness[profile]')."""
    problems = []
    for module, what in VIEWER_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pkg_resources' deprecation warning
                if module.startswith("PROFILER."):
                    profiler_module(module.removeprefix("PROFILER."))
                else:
                    importlib.import_module(module)
        except Exception as e:  # ImportError, or what a half-installed package raises on import
            problems.append(f"{what} does not import: {type(e).__name__}: {e} (pip install 'harness[profile]')")
    entry_points = metadata.entry_points()
    plugins = (entry_points.select(group="tensorboard_plugins") if hasattr(entry_points, "select")
               else entry_points.get("tensorboard_plugins", []))  # Python 3.9
    if not any(ep.name == "profile" for ep in plugins):
        problems.append("no TensorBoard plugin named 'profile' is installed (pip install 'harness[profile]')")
    return problems


def find_trace(logdir: str, *, rank: int, steps: tuple[int, int], error: str = "") -> TraceResult:
    """The newest `.xplane.pb` under `logdir/plugins/profile/`, as a `TraceResult`."""
    found = tf.io.gfile.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
    if not found:
        return TraceResult(rank, logdir, None, 0, steps, error or f"no .xplane.pb under {logdir}/plugins/profile")
    newest = max(found, key=lambda p: (os.path.basename(os.path.dirname(p)), p))
    size = tf.io.gfile.stat(newest).length
    return TraceResult(rank, logdir, newest, size, steps, error or ("" if size else f"{newest} is empty"))


def missing_traces(results: list[dict], workers: int) -> list[str]:
    """Lines naming each worker whose trace is missing or empty (`results`: gathered `TraceResult.to_dict()`s)."""
    by_rank = {r["rank"]: r for r in results}
    out = []
    for rank in range(workers):
        r = by_rank.get(rank)
        if r is None:
            out.append(f"worker {rank}: no trace reported")
        elif not r["ok"]:
            out.append(f"worker {rank}: {r['error'] or 'trace missing'} (log dir {r['logdir']})")
    return out


def _converter():
    """The profile plugin's `raw_to_tool_data` (`xspace_to_tool_data`), `profiler_module`'s."""
    return profiler_module("convert.raw_to_tool_data")


_PERCENT = re.compile(r"([\d.]+)\s*%\s*of the total step time")


def profiler_input_analysis(xplane: str) -> dict:
    """The profiler's input-pipeline analysis of one trace.

    Returns:
      `{"input_percent", "conclusion", "step_time_ms", "input_ms", "hardware_type", "steps"}`; `input_percent`
      is the share of step time the profiler attributes to waiting for input (its "input-bound" figure), None
      when the analyzer found no step. On failure: `{"error": ...}`.
    """
    try:
        convert = _converter()
        # XProf (tensorboard-plugin-profile >= 2.20) names the tool "input_pipeline_analyzer"; the plugin before it
        # "input_pipeline_analyzer^" (the caret: its JSON form for TensorBoard)
        name = "input_pipeline_analyzer" if convert.__name__.startswith("xprof") else "input_pipeline_analyzer^"
        data, _ = convert.xspace_to_tool_data([xplane], name, {})
    except Exception as e:  # ImportError, or the converter's own failures: report, never fail the run
        return {"error": f"input_pipeline_analyzer failed on {xplane}: {type(e).__name__}: {e}"}
    if not data:
        return {"error": f"input_pipeline_analyzer returned nothing for {xplane}"}
    tables = [t for t in json.loads(data) if isinstance(t, dict)]
    # The step table: the one whose properties hold the conclusion (XProf puts another table before it; the
    # plugin before XProf had it first).
    steps = next((t for t in tables if "input_conclusion" in t.get("p", {})), tables[0] if tables else {})
    props, rows = steps.get("p", {}), steps.get("rows", [])
    conclusion = props.get("input_conclusion", "")
    m = _PERCENT.search(conclusion)
    step_ms, input_ms = _float(props.get("steptime_ms_average")), _float(props.get("infeed_time_ms_avg"))
    if m:
        percent = float(m.group(1))
    elif rows and step_ms:
        percent = 100.0 * (input_ms or 0.0) / step_ms
    else:
        percent = None
    return {"input_percent": percent, "conclusion": conclusion, "step_time_ms": step_ms, "input_ms": input_ms,
            "hardware_type": props.get("hardware_type"), "steps": len(rows)}


def profiler_device_idle(xplane: str) -> dict:
    """The profiler's overview page of one trace: how much of the traced time the device sat idle.

    Returns:
      `{"device_idle_percent", "device_type"}`: XProf's `OverviewPageAnalysis.device_idle_time_percent`, the
      device's idle time between its ops as a share of the traced time (the "device idle" of TensorBoard's
      Profile overview page; tensorflow.org/guide/profiler, section "Overview page"), None where the trace has no
      device (a CPU-only run: the overview counts no device time). On failure: `{"device_idle_error": ...}`.
    """
    try:
        convert = _converter()
        overview_page_pb2 = profiler_module("protobuf.overview_page_pb2")

        # The JSON the converter makes for TensorBoard leaves device_idle_time_percent out: parse the proto.
        raw, ok = convert._pywrap_profiler.xspace_to_tools_data([xplane], "overview_page")
        if not ok:
            raise RuntimeError(raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw))
        page = overview_page_pb2.OverviewPage()
        page.ParseFromString(raw)
    except Exception as e:  # ImportError, or the converter's own failures: report, never fail the run
        return {"device_idle_error": f"overview_page failed on {xplane}: {type(e).__name__}: {e}"}
    device = page.run_environment.device_type
    has_device = bool(device) and device.upper() not in ("CPU", "CPU_ONLY")
    return {"device_idle_percent": page.analysis.device_idle_time_percent if has_device else None,
            "device_type": device}


def _float(value) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def tensorboard_command(logdir: str) -> str:
    """The command that shows the traces, ready to paste into a shell (the path quoted where it needs it)."""
    return f"tensorboard --logdir {shlex.quote(os.path.abspath(logdir) if '://' not in logdir else logdir)}"

