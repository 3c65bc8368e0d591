"""`harness bench scale` (harness/bench/scale.py): every formula on hand-computed cases, the 80% crossing, the CLI on
a report written here in `harness bench train`'s format, and bad input as a ConfigError (exit 2)."""
import json
import math
import os
import subprocess
import sys

import pytest

from harness.bench import scale
from harness.bench.scale import Link, Measurement, Setup
from harness.errors import ConfigError
from scale_support import write_report as _report

NODE = Link(alpha_s=1e-6, beta_s_per_byte=1e-10)   # 10 GB/s, 1 µs
NET = Link(alpha_s=1e-5, beta_s_per_byte=1e-9)     # 1 GB/s, 10 µs


# --- all-reduce cost ---------------------------------------------------------------------------------------------
def test_ring_one_gpu_per_node_is_patarasuk_yuan():
    # 2(N-1)α + 2(N-1)/N·S·β = 2·3·10 µs + 1.5·1e6·1 ns = 60 µs + 1.5 ms
    assert scale.ring_seconds(1e6, 4, 1, NODE, NET) == pytest.approx(1.56e-3, rel=1e-12)


def test_ring_over_nodes_counts_network_hops_and_runs_at_the_slowest_link():
    # N=4, G=2: M=2 nodes; 2(N-M)=4 intra hops, 2(M-1)=2 network hops; bytes at the network's β
    assert scale.ring_seconds(1e6, 4, 2, NODE, NET) == pytest.approx(4e-6 + 2e-5 + 1.5e-3, rel=1e-12)
    # all in one node: only the node link, 2(N-1)=6 hops
    assert scale.ring_seconds(1e6, 4, 4, NODE, NET) == pytest.approx(6e-6 + 1.5e-4, rel=1e-12)
    assert scale.ring_seconds(1e6, 1, 4, NODE, NET) == 0.0


def test_tree_has_logarithmic_network_latency():
    # N=16, G=2, M=8: 2·[(G-1)·1 µs + log2(8)·10 µs] = 62 µs; bytes 2·S·β/0.9 at the network's β, S = 0.9 MB: 2 ms
    assert scale.tree_seconds(9e5, 16, 2, NODE, NET) == pytest.approx(62e-6 + 2e-3, rel=1e-12)
    # inside one node: the ring
    assert scale.tree_seconds(9e5, 4, 4, NODE, NET) == scale.ring_seconds(9e5, 4, 4, NODE, NET)


def test_hierarchical_is_reduce_scatter_ring_all_gather():
    # N=8, G=4, M=2, S=4 MB: in node (G-1)α + (G-1)/G·S·β = 3 µs + 0.3 ms, twice;
    # across 2α + 2·(1/2)·S·β = 20 µs + 4 ms
    assert scale.hierarchical_seconds(4e6, 8, 4, NODE, NET) == pytest.approx(2 * 3.03e-4 + 4.02e-3, rel=1e-12)
    # one GPU per node: the flat ring
    assert scale.hierarchical_seconds(4e6, 8, 1, NODE, NET) == scale.ring_seconds(4e6, 8, 1, NODE, NET)


# --- schedules: overlap and exposure -----------------------------------------------------------------------------
READY = [0.1, 0.2, 0.3, 0.4]   # 4 gradients over a backward pass 0 .. 0.4 s


def test_horovod_buffers_overlap_backward_when_the_link_keeps_up():
    out = scale.horovod_buffers([1.0] * 4, READY, fusion_bytes=1e9, cycle_s=0.0, cost=lambda b: 0.05)
    assert [(round(s, 9), round(e, 9), b) for s, e, b in out] == [(0.1, 0.15, 1.0), (0.2, 0.25, 1.0),
                                                                  (0.3, 0.35, 1.0), (0.4, 0.45, 1.0)]


def test_horovod_fuses_what_became_ready_while_the_link_was_busy():
    out = scale.horovod_buffers([1.0] * 4, READY, fusion_bytes=1e9, cycle_s=0.0, cost=lambda b: 0.15)
    # 0.1-0.25 (g1); at 0.25 g2 is ready: 0.25-0.40; at 0.40 g3 and g4 are: one fused buffer 0.40-0.55
    assert [(round(s, 9), round(e, 9), b) for s, e, b in out] == [(0.1, 0.25, 1.0), (0.25, 0.4, 1.0),
                                                                  (0.4, 0.55, 2.0)]
    # a threshold of 1 byte (or 0: fusion off) keeps them apart
    out = scale.horovod_buffers([1.0] * 4, READY, fusion_bytes=0, cycle_s=0.0, cost=lambda b: 0.15)
    assert [b for _, _, b in out] == [1.0] * 4 and round(out[-1][1], 9) == 0.7


def test_horovod_cycle_delays_the_first_tick_after_readiness():
    # cycle 0.25 s: ticks at 0.1 (g1), 0.35 (g2, g3), 0.6 (g4)
    out = scale.horovod_buffers([1.0] * 4, READY, fusion_bytes=1e9, cycle_s=0.25, cost=lambda b: 0.01)
    assert [(round(s, 9), b) for s, _, b in out] == [(0.1, 1.0), (0.35, 2.0), (0.6, 1.0)]


def test_mwms_default_is_one_pack_after_backward():
    out = scale.mwms_buffers([1.0] * 4, READY, bytes_per_pack=0, cost=lambda b: 0.1 * b)
    assert [(round(s, 9), round(e, 9), b) for s, e, b in out] == [(0.4, 0.8, 4.0)]
    out = scale.mwms_buffers([1.0] * 4, READY, bytes_per_pack=2, cost=lambda b: 0.1 * b)
    assert [(round(s, 9), round(e, 9), b) for s, e, b in out] == [(0.2, 0.4, 2.0), (0.4, 0.6, 2.0)]


def test_gradient_ready_times_are_uniform_over_backward():
    assert scale.gradient_ready_times(4, 0.4, 0.2) == pytest.approx([0.3, 0.4, 0.5, 0.6])


def test_straggler_bound():
    # σ·sqrt(2 ln N): ln 512 = 9 ln 2 = 6.238325; sqrt(12.476649) = 3.532230
    assert scale.straggler_seconds(0.01, 512) == pytest.approx(0.0353223, abs=1e-7)
    assert scale.straggler_seconds(0.01, 1) == 0.0


# --- the prediction ----------------------------------------------------------------------------------------------
def test_predict_mwms_exposes_the_whole_all_reduce():
    m = Measurement(step_s=0.3, jitter_s=0.0, per_replica_batch=32)
    s = Setup(gradient_bytes=1e6, tensors=10, gpus_per_node=1, node=NODE, net=NET, backend="tf")
    p = scale.predict(m, s, 4)
    assert p.exposed_s == pytest.approx(1.56e-3, rel=1e-9) and p.comm_s == pytest.approx(1.56e-3, rel=1e-9)
    assert p.step_s == pytest.approx(0.30156, rel=1e-9)
    assert p.efficiency == pytest.approx(0.3 / 0.30156, rel=1e-9)
    assert p.examples_per_s == pytest.approx(4 * 32 / 0.30156, rel=1e-9)
    assert p.bottleneck == "compute"   # 0.5% of the step is under the 2% threshold
    one = scale.predict(m, s, 1)
    assert one.efficiency == 1.0 and one.examples_per_s == pytest.approx(32 / 0.3)


def test_predict_horovod_hides_what_fits_in_backward():
    # step 0.6 s, backward 0.4 s from 0.2 s; 4 tensors of 1 MB ready at 0.3 .. 0.6; each all-reduce 1.56 ms
    m = Measurement(step_s=0.6, jitter_s=0.0, per_replica_batch=8)
    s = Setup(gradient_bytes=4e6, tensors=4, gpus_per_node=1, node=NODE, net=NET, backend="horovod", cycle_s=0.0)
    p = scale.predict(m, s, 4)
    assert p.comm_s == pytest.approx(4 * 1.56e-3 + 0 * 1e-9, rel=1e-9) and p.exposed_s == pytest.approx(1.56e-3)


def test_predict_rejects_what_it_cannot_model():
    m = Measurement(step_s=0.1, jitter_s=0.0, per_replica_batch=8)
    with pytest.raises(ConfigError, match="backend 'byteps'"):
        scale.predict(m, Setup(1e6, 1, 1, NODE, NET, backend="byteps"), 2)
    with pytest.raises(ConfigError, match="all-reduce 'butterfly'"):
        scale.predict(m, Setup(1e6, 1, 1, NODE, NET, algorithm="butterfly"), 2)
    with pytest.raises(ConfigError, match="n >= 1"):
        scale.predict(m, Setup(1e6, 1, 1, NODE, NET), 0)


def test_bandwidth_bottleneck_is_named():
    m = Measurement(step_s=0.01, jitter_s=0.0, per_replica_batch=8)
    s = Setup(gradient_bytes=1e8, tensors=1, gpus_per_node=1, node=NODE, net=NET, backend="tf")
    assert scale.predict(m, s, 8).bottleneck == "all-reduce (bandwidth)"
    s = Setup(gradient_bytes=8, tensors=1, gpus_per_node=1, node=NODE, net=Link(1e-2, 1e-9), backend="tf")
    assert scale.predict(m, s, 8).bottleneck == "all-reduce (latency)"


def test_crossing_of_80_percent():
    # only jitter: E(N) = 1 / (1 + 0.1·sqrt(2 ln N)): 0.895 (2), 0.857 (4), 0.831 (8), 0.809 (16), 0.792 (32)
    m = Measurement(step_s=1.0, jitter_s=0.1, per_replica_batch=1)
    s = Setup(gradient_bytes=0.0, tensors=1, gpus_per_node=1, node=NODE, net=Link(0.0, 0.0), backend="tf")
    points = scale.sweep(m, s, 64)
    assert [p.n for p in points] == [1, 2, 4, 8, 16, 32, 64]
    assert points[4].efficiency == pytest.approx(1 / (1 + 0.1 * math.sqrt(2 * math.log(16))))
    assert scale.crossing(points) == 32 and points[-2].bottleneck == "stragglers"
    assert scale.crossing(points, target=0.5) is None


def test_fixed_from_node():
    # 4 GPUs in one node, step 0.1 s, batch 10: modelled node step 0.1 + intra ring of 1 MB (all exposed, MWMS)
    m = Measurement(step_s=0.1, jitter_s=0.0, per_replica_batch=10)
    s = Setup(gradient_bytes=1e6, tensors=1, gpus_per_node=4, node=NODE, net=NET, backend="tf")
    ring = 6e-6 + 1.5e-4
    node_rate = 4 * 10 / (0.1 + ring + 0.02)   # the node measured 20 ms slower per step than the model
    assert scale.fixed_from_node(m, s, node_rate) == pytest.approx(0.02, rel=1e-9)
    with pytest.raises(ConfigError):
        scale.fixed_from_node(m, Setup(1e6, 1, 1, NODE, NET), 100.0)


# --- parsing -----------------------------------------------------------------------------------------------------
def test_parse_link_and_node():
    link = scale.parse_link("25Gbit/s,5us")
    assert link.beta_s_per_byte == pytest.approx(1 / 3.125e9) and link.alpha_s == pytest.approx(5e-6)
    link = scale.parse_link("12.5GB/s")
    assert link.beta_s_per_byte == pytest.approx(1 / 12.5e9) and link.alpha_s == scale.NET_HOP_S
    assert scale.parse_node("4xNVLink") == (4, scale.NODE_LINKS["nvlink"])
    g, link = scale.parse_node("8x100GB/s,2us")
    assert g == 8 and link.beta_s_per_byte == pytest.approx(1e-11) and link.alpha_s == pytest.approx(2e-6)


@pytest.mark.parametrize("text", ["fast", "25Gb/s", "25Gbit/s,5parsecs", "1.2.3Gbit/s", "25Gbit/s,5us,1", ""])
def test_parse_link_rejects(text):
    with pytest.raises(ConfigError, match="--link"):
        scale.parse_link(text)


@pytest.mark.parametrize("text", ["NVLink", "0xNVLink", "4xCarrierPigeon"])
def test_parse_node_rejects(text):
    with pytest.raises(ConfigError, match="--node"):
        scale.parse_node(text)


# --- the CLI ------------------------------------------------------------------------------------------------------
def _cli(*argv):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "harness.cli", "bench", "scale", *argv], capture_output=True,
                          text=True, env=env, timeout=300)


def test_measurement_from_report(tmp_path):
    m, shapes = scale.measurement_from_report(str(_report(tmp_path / "r.json")))
    assert m.step_s == pytest.approx(0.115) and m.per_replica_batch == 16
    assert m.jitter_s == pytest.approx(0.012909944, rel=1e-6)   # stdev of 0.10, 0.12, 0.11, 0.13; warm-up left out
    assert shapes["input_shape"] == [16, 16, 4]


def test_cli_prints_the_table_the_crossing_and_the_plot(tmp_path):
    report = _report(tmp_path / "report.json")
    done = _cli("--report", str(report), "--gradient-bytes", "100000000", "--tensors", "10", "--link",
                "1Gbit/s,10us", "--node", "2xPCIe", "--backend", "horovod", "--max-gpus", "16", "--plot",
                str(tmp_path / "scale.png"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rows = [line.split() for line in lines if line.strip() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 2, 4, 8, 16]
    m = Measurement(0.115, 0.012909944320, 16)
    s = Setup(1e8, 10, 2, scale.NODE_LINKS["pcie"], scale.parse_link("1Gbit/s,10us"), backend="horovod")
    for r in rows:
        p = scale.predict(m, s, int(r[0]))
        assert float(r[2].rstrip("%")) == pytest.approx(p.efficiency * 100, abs=0.06)
    cross = scale.crossing(scale.sweep(m, s, 16))
    assert f"efficiency falls below 80% at N = {cross}" in done.stdout
    assert any(line.strip().startswith("fusion threshold 32 MiB") for line in lines)
    assert (tmp_path / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_reads_the_gradients_from_the_reports_model(tmp_path):
    report = _report(tmp_path / "report.json")
    done = _cli("--report", str(report), "--max-gpus", "4")
    assert done.returncode == 0, done.stderr
    # the harness U-Net for 16x16x4, 4 classes (harness/train/builtin.py): bytes and tensors from its weights
    from harness.train.model import builtin
    model = builtin.builtin_model("image", (16, 16, 4), 4)
    nbytes = sum(int(w.shape.num_elements()) * w.dtype.size for w in model.trainable_weights)
    assert f"gradient {nbytes / 1e6:.2f} MB in {len(model.trainable_weights)} tensors" in done.stdout


@pytest.mark.parametrize("case", ["not-json", "train-run", "two-replicas", "one-step", "bad-link", "both-links",
                                  "bad-timeline", "empty-timeline-path", "timeline-tensors"])
def test_cli_bad_input_is_a_config_error(tmp_path, case):
    report = tmp_path / "report.json"
    extra = ["--gradient-bytes", "1000", "--tensors", "1"]
    if case == "not-json":
        report.write_text("hello")
    elif case == "train-run":
        _report(report, kind="train")
    elif case == "two-replicas":
        _report(report, replicas=2)
    elif case == "one-step":
        _report(report, step_times=(0.1,))
    else:
        _report(report)
    if case == "bad-link":
        extra += ["--link", "25Gb/s"]
    if case == "both-links":
        allreduce = tmp_path / "allreduce.json"
        allreduce.write_text(json.dumps({"workers": 2, "fit": {"alpha_s": 1e-5, "beta_s_per_byte": 1e-9}}))
        extra += ["--allreduce", str(allreduce), "--link", "1Gbit/s"]
    if case == "bad-timeline":
        (tmp_path / "timeline.json").write_bytes(b"\x89PNG\r\n")
        extra += ["--timeline", str(tmp_path / "timeline.json")]
    if case == "empty-timeline-path":
        extra += ["--timeline", ""]
    if case == "timeline-tensors":
        from scale_support import horovod_events, write_timeline
        extra += ["--timeline", write_timeline(tmp_path / "timeline.json", horovod_events(5, (0.004,) * 5)), "--tensors", "50",
                  "--gradient-bytes", "1000"]
    done = _cli("--report", str(report), *extra)
    assert done.returncode == 2, (done.stdout, done.stderr)
    expected = {"not-json": "not a `harness bench train` report.json", "train-run": "kind 'train'",
                "two-replicas": "ran 2 replicas", "one-step": "1 timed step(s)", "bad-link": "--link '25Gb/s'",
                "both-links": "not both", "bad-timeline": "codec can't decode",
                "empty-timeline-path": "--timeline : ", "timeline-tensors": "--tensors 50: the timeline"}[case]
    assert expected in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_allreduce_json_gives_the_network_link(tmp_path):
    path = tmp_path / "allreduce.json"
    path.write_text(json.dumps({"workers": 2, "backend": "tf", "rows": [],
                                "fit": {"alpha_s": 2e-5, "beta_s_per_byte": 4e-10, "r2": 0.99, "residuals_s": []}}))
    assert scale.link_from_allreduce(str(path)) == Link(2e-5, 4e-10)
    path.write_text(json.dumps({"workers": 1, "fit": None}))
    with pytest.raises(ConfigError, match="1 worker"):
        scale.link_from_allreduce(str(path))


def test_the_readme_lines_run_as_printed(tmp_path):
    """docs/scaling.md's `harness bench scale ...` line (continued over `\\`), run with a report.json written here in
    place of runs/bench/one/report.json: it prints the table header and the rows the page shows."""
    import pathlib
    import shlex

    readme = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "scaling.md").read_text().splitlines()
    start = next(i for i, ln in enumerate(readme) if ln.startswith("harness bench scale --report"))
    line = readme[start]
    while line.endswith("\\"):
        start += 1
        line = line[:-1] + " " + readme[start].strip()
    argv = shlex.split(line)
    report = _report(tmp_path / "report.json")
    argv = [str(report) if a == "runs/bench/one/report.json" else str(tmp_path / a) if a.endswith(".png") else a
            for a in argv]
    assert argv[:3] == ["harness", "bench", "scale"]
    done = _cli(*argv[3:])
    assert done.returncode == 0, done.stderr
    header = next(ln for ln in readme if ln.strip().startswith("N   examples/s"))
    assert header in done.stdout.splitlines()
    assert (tmp_path / "scale.png").is_file() and "efficiency falls below 80% at N = " in done.stdout


def _published_scaling():
    """benchmarks/published_scaling.py as a module (benchmarks/ is not a package)."""
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "published_scaling.py")
    spec = importlib.util.spec_from_file_location("published_scaling", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_published_ceiling_helpers_on_a_hand_computed_point():
    ps = _published_scaling()
    # compute 100 ms, all-reduce 40 ms of which the schedule leaves 10 ms exposed, fixed 5 ms, no stragglers
    p = scale.Point(n=8, step_s=0.115, compute_s=0.1, comm_s=0.04, exposed_s=0.01, fixed_s=0.005, straggler_s=0.0,
                    examples_per_s=1.0, efficiency=0.1 / 0.115, bottleneck="all-reduce (bandwidth)")
    # eta 1: the model as it is; eta 0: all 40 ms exposed; eta 0.5: 10 + 0.5·30 = 25 ms exposed
    assert ps.efficiency_with_overlap(p, 1.0) == pytest.approx(0.1 / 0.115)
    assert ps.efficiency_with_overlap(p, 0.0) == pytest.approx(0.1 / 0.145)
    assert ps.efficiency_with_overlap(p, 0.5) == pytest.approx(0.1 / 0.13)
    # published 80%: step 125 ms, less compute and fixed: 20 ms exposed of 40 ms
    assert ps.implied_exposed_share({"published_efficiency": "0.8"}, p) == pytest.approx(0.5)


def test_published_points_ask_more_than_one_shared_overlap_can_give():
    ps = _published_scaling()
    import csv
    with open(ps.CSV, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["gpus"] != r["gpus_per_node"] or not r["node_examples_per_s"]]
    line = ps.ceiling(rows)
    best = int(line.split("reach at best ")[1].split(" of ")[0])
    assert 0 < best < len(rows), line
    shares = [ps.implied_exposed_share(r, ps.predict_row(r)) for r in rows]
    assert min(shares) < 0.2 and max(shares) > 0.9, shares
