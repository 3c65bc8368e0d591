"""`harness.bench.timeline`: the gradient profile read from hand-written Horovod timelines (whole, cut short, wrong),
and the scaling model placing each gradient as the profile says (hand-computed)."""
import json

import pytest

from harness.bench import scale, timeline
from harness.errors import ConfigError

GRAD_A = "while/DistributedGradientTape_Allreduce/cond/then/HorovodAllreduce_gradient_tape_dense_MatMul_0"
GRAD_B = "while/DistributedGradientTape_Allreduce/cond/then/HorovodAllreduce_gradient_tape_dense_BiasAdd_0"
METRIC = "while/HorovodAllreduce_Sum_0"


def _events(steps=4, b_offsets_s=(0.004, 0.004, 0.004, 0.006)):
    """Horovod's format: metadata per tensor, then per step NEGOTIATE_ALLREDUCE (B), a rank mark (X), E, ALLREDUCE
    (B), GLOO_ALLREDUCE (B, E), E with dtype and shape. A (float32 [10, 10]) at 1 s + k, B (float16 [8]) after it
    by b_offsets_s[k], the metric 1 ms after B."""
    ev = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1}}]
    tensors = {1: (GRAD_A, "float32", "[10, 10]"), 2: (GRAD_B, "float16", "[8]"), 3: (METRIC, "float32", "[1]")}
    for pid, (name, _, _) in tensors.items():
        ev.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
    for k in range(steps):
        t = {1: 1.0 + k, 2: 1.0 + k + b_offsets_s[k], 3: 1.001 + k + b_offsets_s[k]}
        for pid, (_, dtype, shape) in tensors.items():
            us = int(round(t[pid] * 1e6))
            ev += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": us, "pid": pid},
                   {"ph": "X", "name": "0", "ts": us, "pid": pid, "dur": 0},
                   {"ph": "E", "ts": us + 10, "pid": pid},
                   {"ph": "B", "name": "ALLREDUCE", "ts": us + 20, "pid": pid},
                   {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": us + 21, "pid": pid},
                   {"ph": "E", "ts": us + 500, "pid": pid},
                   {"ph": "E", "ts": us + 501, "pid": pid, "args": {"dtype": dtype, "shape": shape}}]
    return ev


def _write(path, events, *, cut=False):
    text = json.dumps(events)
    if cut:   # a killed process: no closing bracket, a trailing comma, half an event
        text = text[:-1] + ',\n{"ph": "B", "na'
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("cut", [False, True], ids=["whole", "cut short"])
def test_profile_leads_bytes_and_order(tmp_path, cut):
    p = timeline.gradient_profile(_write(tmp_path / "t.json", _events(), cut=cut))
    # steps 0 and 1 skipped; A leads B by 4 ms and 6 ms in steps 2 and 3: median 5 ms; B is the last: 0
    assert p.names == (GRAD_A, GRAD_B)
    assert p.leads_s == pytest.approx((0.005, 0.0), abs=1e-9)
    assert p.nbytes == (400, 16)
    assert p.steps == 2
    assert p.gradient_bytes == 416
    assert p.bytes_within(1e-3) == pytest.approx(16 / 416)
    assert p.pairs() == ((p.leads_s[0], 400), (0.0, 16))
    assert "2 tensors, 416 bytes, median of 2 steps; first submitted 5.0 ms before the last" in timeline.describe(p)


def test_profile_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(ConfigError, match="no gradient all-reduce"):
        timeline.gradient_profile(_write(tmp_path / "m.json", [e for e in _events() if e.get("pid") in (0, 3)]))
    with pytest.raises(ConfigError, match="2 step\\(s\\) of gradient all-reduces, need more than 2"):
        timeline.gradient_profile(_write(tmp_path / "s.json", _events(steps=2)))
    (tmp_path / "x.json").write_text("epoch 1/5 step 3")
    with pytest.raises(ConfigError, match="not a Horovod timeline"):
        timeline.gradient_profile(str(tmp_path / "x.json"))
    with pytest.raises(ConfigError, match="--timeline .*missing.json"):
        timeline.gradient_profile(str(tmp_path / "missing.json"))


def _setup(**kw):
    # 2 ranks, one per node: ring cost 2α + S·β, α = 0, β = 10 µs per byte
    net = scale.Link(alpha_s=0.0, beta_s_per_byte=1e-5)
    return scale.Setup(gradient_bytes=4000, tensors=2, gpus_per_node=1, node=net, net=net, backend="horovod",
                       fusion_bytes=1e9, cycle_s=0.0, **kw)


def test_scale_places_gradients_as_the_profile_says():
    m = scale.Measurement(step_s=0.1, jitter_s=0.0, per_replica_batch=8)
    # measured: 1000 B ready 50 ms before the end (0.05-0.06 s), 3000 B at the end (0.10-0.13 s): 30 ms exposed
    measured = scale.predict(m, _setup(ready_profile=((0.0, 3000), (0.05, 1000))), 2)
    assert measured.exposed_s == pytest.approx(0.03)
    assert measured.comm_s == pytest.approx(0.04)
    # even spread: 2000 B at 2/3 of the step before the end ... 0.0667-0.0867 s, 2000 B at 0.1-0.12 s: 20 ms
    even = scale.predict(m, _setup(), 2)
    assert even.exposed_s == pytest.approx(0.02)
    # the profile's bytes are scaled to gradient_bytes: fp16 gradients (2000 B) halve both: 15 ms exposed
    half = scale.predict(m, scale.Setup(**{**_setup(ready_profile=((0.05, 1000), (0.0, 3000))).__dict__,
                                           "gradient_bytes": 2000}), 2)
    assert half.exposed_s == pytest.approx(0.015)


def test_the_readme_lines_run_as_printed(tmp_path, monkeypatch):
    """The README's `horovodrun ... --timeline-filename runs/bench/timeline.json harness bench train ...` and
    `harness bench scale ... --timeline runs/bench/timeline.json ...`, run as printed in a folder of the test's (2
    real Horovod ranks; a one-replica report.json written there in place of runs/bench/one's): the profile has the
    bench model's gradients and the line the README shows; the table says the timeline placed them."""
    import os
    import pathlib
    import shlex
    import sys

    import procs
    from scale_support import write_report

    root = pathlib.Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text().splitlines()
    record = next(ln for ln in readme if ln.startswith("horovodrun -np 2") and "--timeline-filename" in ln)
    predict = next(ln for ln in readme if ln.startswith("harness bench scale") and "--timeline" in ln)
    shown = readme[readme.index(predict) + 1]
    bin_dir = pathlib.Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith(("HOROVOD_", "OMPI_"))}
    env.update(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2", PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")
    work = tmp_path / "cwd"
    (work / "runs" / "bench" / "one").mkdir(parents=True)
    write_report(work / "runs" / "bench" / "one" / "report.json")
    monkeypatch.chdir(work)   # the lines' relative paths
    argv = shlex.split(record)
    procs.run([bin_dir / argv[0], *argv[1:]], env=env, timeout=300)
    argv = shlex.split(predict)
    out = procs.run([bin_dir / argv[0], *argv[1:]], env=env, timeout=300)
    from harness.train import models
    weights = models.builtin_model("image", (16, 16, 4), 4).trainable_weights
    nbytes = sum(int(w.shape.num_elements()) * w.dtype.size for w in weights)
    line = next(ln for ln in out.splitlines() if ln.startswith("gradient profile:"))
    assert line.startswith(f"gradient profile: {len(weights)} tensors, {nbytes:,} bytes, median of "), line
    assert shown.split(" bytes,")[0] == line.split(" bytes,")[0], (shown, line)
    assert "gradients ready as the timeline measured" in out and "efficiency falls below" in out, out[-3000:]
