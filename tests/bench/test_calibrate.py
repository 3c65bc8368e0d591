"""`harness bench scale --measured` (harness/bench/calibrate.py): which parameters the runs determine, the fit
recovering parameters that made the runs, the interval from the runs' spread, and the flag's forms."""
import dataclasses
import importlib.util
import pathlib
import re

import pytest

from harness.bench import calibrate, scale
from harness.errors import ConfigError

M = scale.Measurement(step_s=0.1, jitter_s=0.0, per_replica_batch=64)
LINE = scale.Setup(gradient_bytes=100e6, tensors=100, gpus_per_node=8, node=scale.NODE_LINKS["nvlink"],
                   net=scale.parse_link("25Gbit/s"), backend="horovod")


def _bench(script: str):
    """benchmarks/SCRIPT.py as a module (benchmarks/ is not a package)."""
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / f"{script}.py"
    spec = importlib.util.spec_from_file_location(f"{script}_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _runs(truth: scale.Setup, ns, spread=0.0):
    return [calibrate.Run(n, scale.predict(M, truth, n).examples_per_s, spread) for n in ns]


@pytest.mark.parametrize("ns, free", [
    ((8,), ("fixed",)), ((4,), ("fixed",)), ((16,), ("bandwidth",)), ((8, 16), ("overlap", "bandwidth")),
    ((16, 32), ("bandwidth", "overlap")), ((8, 16, 32), ("overlap", "bandwidth", "fixed")),
    ((4, 8), ("overlap", "fixed")), ((16, 32, 64), ("bandwidth", "overlap", "fixed")),
])
def test_the_runs_determine_their_parameters(ns, free):
    assert calibrate.free_parameters([calibrate.Run(n, 1.0) for n in ns], 8) == free


def test_a_node_and_two_nodes_recover_the_overlap_and_bandwidth_that_made_them():
    """Runs made by the model itself at half the line rate and 40% overlap, on a 20 ms step whose node all-reduce
    is partly exposed: the fit finds both (within its grid's step) and forecasts 64 replicas as the truth does."""
    m = dataclasses.replace(M, step_s=0.02)
    truth = dataclasses.replace(LINE, net=scale.Link(LINE.net.alpha_s, LINE.net.beta_s_per_byte / 0.5),
                                backward_share=0.4)
    runs = [calibrate.Run(n, scale.predict(m, truth, n).examples_per_s) for n in (8, 16)]
    fit = calibrate.calibrate(m, LINE, runs)
    assert fit.free == ("overlap", "bandwidth") and fit.residual == 0.0
    assert fit.rate_share == pytest.approx(0.5, rel=0.03) and fit.setup.backward_share == pytest.approx(0.4, abs=0.02)
    (f,) = calibrate.forecast(m, LINE, runs, [64], fit, extrapolation_points=0.0)
    assert f.point.efficiency == pytest.approx(scale.predict(m, truth, 64).efficiency, abs=0.005)
    # no spread, no model error: the interval is what the runs leave open, the per-hop latency (0.14-1 of NCCL's
    # Simple) and the fixed cost; on 64 replicas of this step the latency moves the efficiency by ~0.1 points
    assert f.efficiency_low <= f.point.efficiency <= f.efficiency_high
    assert 0 < f.efficiency_high - f.efficiency_low < 0.002
    low_latency = calibrate.calibrate(m, LINE, runs, held={"latency": 0.14})
    assert scale.predict(m, low_latency.setup, 64).efficiency <= f.efficiency_high
    # the model's own error beyond the runs: ±2 x 2 points per doubling, 16 -> 64 replicas: ±8 points; none at 16
    at16, at64 = calibrate.forecast(m, LINE, runs, [16, 64], fit)
    assert calibrate.EXTRAPOLATION_Z * calibrate.EXTRAPOLATION_POINTS == 4.0
    assert (at64.efficiency_low, at64.efficiency_high) == pytest.approx((f.point.efficiency - 0.08,
                                                                         f.point.efficiency + 0.08))
    assert at16.efficiency_high - at16.efficiency_low < 0.002


def test_a_node_that_hides_its_all_reduce_leaves_the_overlap_undetermined():
    """At 85% overlap a 100 ms step hides the node's all-reduce: another (overlap, bandwidth) pair gives the same
    two runs, and the fit may return it. What the runs cannot tell is not made up: both pairs fit them exactly."""
    truth = dataclasses.replace(LINE, net=scale.Link(LINE.net.alpha_s, LINE.net.beta_s_per_byte / 0.5),
                                backward_share=0.85)
    runs = _runs(truth, (8, 16))
    fit = calibrate.calibrate(M, LINE, runs)
    for r in runs:
        assert scale.predict(M, fit.setup, r.replicas).examples_per_s == pytest.approx(r.examples_per_s, rel=0.01)


def test_a_fixed_cost_is_found_in_closed_form_from_a_third_run():
    truth = dataclasses.replace(LINE, fixed_s=0.004, backward_share=0.7)
    fit = calibrate.calibrate(M, LINE, _runs(truth, (8, 16, 32)))
    assert fit.free == ("overlap", "bandwidth", "fixed")
    assert fit.setup.fixed_s == pytest.approx(0.004, abs=0.0015) and fit.residual < 0.01


def test_the_interval_holds_the_forecast_and_widens_with_the_runs_spread():
    narrow = calibrate.forecast(M, LINE, _runs(LINE, (8, 16), 0.01), [128], extrapolation_points=0.0)[0]
    wide = calibrate.forecast(M, LINE, _runs(LINE, (8, 16), 0.05), [128], extrapolation_points=0.0)[0]
    assert narrow.efficiency_low <= narrow.point.efficiency <= narrow.efficiency_high
    assert wide.efficiency_high - wide.efficiency_low > narrow.efficiency_high - narrow.efficiency_low > 0
    assert wide.examples_low == pytest.approx(wide.efficiency_low * 128 * 64 / 0.1)


@pytest.mark.parametrize("text, run", [
    ("16=12828", calibrate.Run(16, 12828.0, 0.0)), ("16=1000±5%", calibrate.Run(16, 1000.0, 0.05)),
    ("16=1000+-5", calibrate.Run(16, 1000.0, 0.05)), ("8=90,110", calibrate.Run(8, 100.0, 0.1)),
])
def test_measured_runs_as_typed(text, run):
    assert calibrate.Run.parse(text) == run


@pytest.mark.parametrize("text", ["16", "x=3", "1=100", "16=-4", "16=abc"])
def test_a_bad_measured_run_is_one_line(text):
    with pytest.raises(ConfigError, match=r"^--measured "):
        calibrate.Run.parse(text)


def test_bench_scale_with_measured_runs_prints_the_calibration_and_the_forecast_with_intervals(tmp_path, capsys):
    """`harness bench scale --measured` in-process: the fitted parameters named, the forecast per N with its
    interval, the measured runs beside their fitted values."""
    from scale_support import write_report

    from harness import cli

    write_report(tmp_path / "report.json", step_times=(0.02,) * 4, batch=64)    # no jitter: no stragglers
    truth = dataclasses.replace(LINE, net=scale.Link(LINE.net.alpha_s, LINE.net.beta_s_per_byte / 0.5),
                                backward_share=0.4)
    m = scale.Measurement(0.02, 0.0, 64)
    rates = {n: scale.predict(m, truth, n).examples_per_s for n in (8, 16, 64)}
    assert cli.main(["bench", "scale", "--report", str(tmp_path / "report.json"), "--gradient-bytes", "100000000",
                     "--tensors", "100", "--node", "8xNVLink", "--link", "25Gbit/s", "--backend", "horovod",
                     "--cycle-time-ms", "1", "--max-gpus", "64", "--measured", f"8={rates[8]:.3f}±2%",
                     "--measured", f"16={rates[16]:.3f}±2%"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^calibrated: overlap (39|40|41)% of the step, network at 50% of line rate;", out, re.M), out
    forecast = out[out.rindex("interval  measured"):].splitlines()[1:]
    row = {line.split()[0]: line.split() for line in forecast}
    assert row["16"][-2:] == [f"{rates[16]:,.1f}", "±2%"] and "measured" not in row["64"]
    low, high = (float(v.replace(",", "")) for v in row["64"][2].split("-"))
    assert low <= float(row["64"][1].replace(",", "")) <= high and low < high
    assert abs(float(row["64"][1].replace(",", "")) / rates[64] - 1) < 0.01     # the truth, forecast from 8 and 16


def _docs_scale_block(tmp_path, monkeypatch, capsys, found) -> tuple[list, list]:
    """The first docs/scaling.md `harness bench scale` line (continued over `\\`) whose first 3 lines satisfy
    `found(text)`, run as printed in a folder of the test's with a one-replica report of the step the page names
    (872 img/s at batch 64). Returns (the lines the page shows after it, the lines it printed)."""
    import shlex

    from scale_support import write_report

    from harness import cli

    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "scaling.md").read_text().splitlines()
    start = next(i for i, ln in enumerate(page) if ln.startswith("harness bench scale") and
                 found(" ".join(page[i:i + 3])))
    line = page[start]
    while line.endswith("\\"):
        start += 1
        line = line[:-1] + " " + page[start].strip()
    shown_at = page.index("```", page.index("```", start) + 1) + 1
    shown = page[shown_at:page.index("```", shown_at)]
    (tmp_path / "runs" / "bench" / "one").mkdir(parents=True)
    write_report(tmp_path / "runs" / "bench" / "one" / "report.json", step_times=(64 / 872,) * 4, batch=64)
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(line)
    assert argv[:3] == ["harness", "bench", "scale"] and "--measured" in argv
    assert cli.main(argv[1:]) == 0
    return shown, capsys.readouterr().out.splitlines()


def test_the_docs_calibration_line_runs_as_printed_and_prints_the_forecast_shown(tmp_path, monkeypatch, capsys):
    """docs/scaling.md's `harness bench scale ... --measured ...` line, run as printed: every line of the forecast
    the page shows is in what it prints."""
    shown, out = _docs_scale_block(tmp_path, monkeypatch, capsys, lambda text: "--measured" in text)
    assert len(shown) == 6 and [ln for ln in shown if ln not in out] == []


@pytest.mark.parametrize("backend", ["tf", "horovod"])
def test_the_bed_calibrated_on_two_hosts_predicts_three_and_four(tmp_path, backend):
    """benchmarks/cluster.py's calibrated rows (issue 48, item 3): bed rows made by the model with the hosts' links
    at 40% of the 2-host sweep's fit, each N with its own loopback compute (the bed's hosts share the cores); the
    2-host row alone recovers the 40% and the 3- and 4-host efficiencies follow."""
    import json

    cluster = _bench("cluster")

    def sweep(name, link):
        (tmp_path / name).write_text(json.dumps({"fit": {"alpha_s": link.alpha_s,
                                                         "beta_s_per_byte": link.beta_s_per_byte}}))
        return str(tmp_path / name)
    grad, batch = (4_000_000, 20), 8
    loop_link, sweep_link = scale.Link(1e-4, 1e-10), scale.Link(2e-4, 2e-8)   # loopback; 400 Mbit/s
    truth_link = scale.Link(sweep_link.alpha_s, sweep_link.beta_s_per_byte / 0.4)
    loop_json, sweep_json = sweep("loop.json", loop_link), sweep("bed.json", sweep_link)
    rows, truth = {}, {}
    for n in (2, 3, 4):
        m = scale.Measurement(0.1 + 0.02 * n, 0.0, batch)
        loop_step = scale.predict(m, cluster._setup(grad, backend, loop_link), n).step_s
        bed_step = scale.predict(m, cluster._setup(grad, backend, truth_link), n).step_s
        base = {"workers": n, "step_s": loop_step, "allreduce_json": loop_json, "examples_per_s": n * batch / loop_step}
        base["drift"] = 0.0
        rows[n] = (base, {"workers": n, "examples_per_s": n * batch / bed_step, "allreduce_json": sweep_json}, (),
                   [loop_step / bed_step])
        truth[n] = loop_step / bed_step
    out = cluster.calibrated_from_two(rows, grad, backend, batch)
    assert sorted(out) == [3, 4]
    for n, (predicted, share, low, high) in out.items():
        assert share == pytest.approx(0.4, rel=0.1)   # the fit's fine grid: steps of ~3%
        assert abs(predicted - truth[n]) < 0.005, (n, predicted, truth[n])
        assert low == predicted == high                # no drift in the 2-host row's baselines: no range
    assert 0.2 < min(truth.values()) and max(truth.values()) < 0.8   # the link matters: a wrong share fails


def test_a_bed_row_off_target_says_whether_the_beds_noise_covers_it():
    """cluster.py's row noise and why line, hand-computed: runs at 45%, 50% and 52% with loopback runs 20% apart:
    the median 50%, moved by the larger of 7% of it (a half range of 3.5 points) and 10% (half the drift):
    45-55%; 46.5-53.5% without the drift. A prediction of
    60% (58-62%) lies 3 points beyond it, one of 56% (54-58%) meets it."""
    cluster = _bench("cluster")
    measured = cluster.row_efficiency({"drift": 0.2}, [0.45, 0.5, 0.52])
    assert measured == pytest.approx((0.5, 0.45, 0.55))
    assert cluster.row_efficiency({"drift": 0.0}, [0.45, 0.5, 0.52]) == pytest.approx((0.5, 0.465, 0.535))
    off = cluster.noise_why(measured, (0.6, 0.58, 0.62), 3)
    assert off == ("measured 50.0% (45.0%-55.0%: 3 run(s) and their loopback drift), predicted 60.0% (58.0%-62.0%: "
                   "the 2-host row's noise through the fit): 3.0 points apart beyond the bed's noise: the model misses")
    assert cluster.noise_why(measured, (0.56, 0.54, 0.58), 3).endswith("the bed's noise covers the miss")
    loops = [{"workers": 2, "examples_per_s": r, "allreduce_json": "a.json"} for r in (90.0, 110.0, 100.0)]
    assert cluster.baseline(loops, 8) == dict(loops[0], examples_per_s=100.0, step_s=0.16, drift=0.2)


def test_a_bed_row_says_how_much_link_time_it_hid():
    """cluster.py's hidden_why, hand-computed from the 4-host tf row at 100 Mbit/s of 2026-12-06: step 108.7 ms
    against a 72.0 ms loopback step, all-reduce of the gradient 59.4 ms against 9.3 ms: 13.4 ms hidden."""
    cluster = _bench("cluster")
    base, row = {"step_s": 0.072, "allreduce_s": 0.0093}, {"step_s": 0.1087, "allreduce_s": 0.0594, "workers": 4}
    assert cluster.hidden_why(base, row, 2) == (
        "the row's step is 36.7 ms over loopback's, its all-reduce of the gradient 50.1 ms over loopback's: 13.4 ms "
        "of link time hidden (4 processes on 2 cores: one waiting on the link leaves its core to another)")
    assert cluster.hidden_why(base, dict(row, workers=2), 2).endswith(": 13.4 ms of link time hidden")


@pytest.mark.parametrize("point, node_rate, at8, at16", [
    # issue 67: before, aws-samples#2 gave 98.6% at 8 (its own run, 84.5%) and 98.5% at 16, interval 10.8-100%;
    # horovod#779 95.8% at 8 and 71.5% at 16 (published 91.9%), interval 2.4-93.4%
    ("aws-16-resnet50", 5000.0, 0.845, 0.842), ("hvd779-16", 6679.0, 0.957, 0.791)])
def test_one_node_alone_reproduces_its_run_and_the_forecast_does_not_rise(point, node_rate, at8, at16):
    """The two series of issue 67 (benchmarks/published_scaling.csv), each calibrated as `--measured 8=RATE±2%`
    does: the run is reproduced within its spread, its loss beyond the node's link is a fixed cost, the forecast
    does not rise across N, and the interval from one node to two is the model's error (±2 x 2 points) and the
    spread, with what the node leaves open printed beside it."""
    bench = _bench("published_scaling")
    row = next(r for r in bench.csv.DictReader(open(bench.CSV, newline="")) if r["point"] == point)
    m, s = bench._setup(row)
    runs = [calibrate.Run(8, node_rate, 0.02)]
    fit = calibrate.calibrate(m, s, runs)
    assert fit.free == ("fixed",) and calibrate.reproduction(m, fit, runs) == []
    assert re.fullmatch(r"one node \(8 GPUs\) lost [0-9.]+ ms of a [0-9.]+ ms step; .* are a fixed cost per step "
                        r"\(every N > 1 pays it\)", fit.note), fit.note
    ns = [2, 4, 8, 16, 32, 64, 128]
    forecasts = calibrate.forecast(m, s, runs, ns, fit)
    effs = [f.point.efficiency for f in forecasts]
    assert effs == sorted(effs, reverse=True)                  # never rises across N
    assert effs[2] == pytest.approx(at8, abs=0.001) and effs[3] == pytest.approx(at16, abs=0.001)
    f16 = forecasts[3]
    assert f16.efficiency_low <= f16.point.efficiency <= f16.efficiency_high
    assert (f16.efficiency_high - f16.efficiency_low) / 2 <= 0.04 + 0.02   # error per doubling + the run's spread
    assert f16.open_low < f16.efficiency_low                  # the network it did not measure: printed, not hidden
    text = calibrate.format_forecast(forecasts, runs)
    assert re.search(r"^  beyond 8 GPUs the interval is the runs' spread .* spans [0-9.]+%-[0-9.]+% at N = 16, "
                     r".*\(--measured 16=RATE\) determines them$", text, re.M), text


def test_one_node_faster_than_the_model_fits_the_overlap_and_an_impossible_run_says_why():
    """A node that loses less than the model's default overlap exposes: more of it hidden, not a negative fixed
    cost. A node faster than one replica's compute: not reproduced, and the line says why in numbers."""
    m = dataclasses.replace(M, step_s=0.02)
    truth = dataclasses.replace(LINE, backward_share=0.9)
    runs = [calibrate.Run(8, scale.predict(m, truth, 8).examples_per_s)]
    assert scale.predict(m, LINE, 8).examples_per_s < runs[0].examples_per_s * 0.99
    fit = calibrate.calibrate(m, LINE, runs)
    assert fit.free == ("overlap",) and calibrate.reproduction(m, fit, runs) == []
    assert "more of it is hidden" in fit.note
    fast = [calibrate.Run(8, 8 * 64 / 0.019)]
    (line,) = calibrate.reproduction(m, calibrate.calibrate(m, LINE, fast), fast)
    assert re.fullmatch(r"not reproduced: 8 GPUs measured [0-9,.]+ examples/s ±0%, the calibrated model [0-9,.]+ "
                        r"\(-[0-9.]+%\): the run's step 19.0 ms is shorter than one replica's compute 20.0 ms .*", line)


def test_the_docs_one_node_calibration_runs_as_printed(tmp_path, monkeypatch, capsys):
    """docs/scaling.md's one-node `--measured 8=...` line, run as printed: every line the page shows is in what it
    prints (issue 67)."""
    shown, out = _docs_scale_block(tmp_path, monkeypatch, capsys,
                                   lambda text: "--measured 8=" in text and "--measured 16=" not in text)
    assert len(shown) == 6 and [ln for ln in shown if ln not in out] == []
