"""`harness.bench.timeline`: the gradient profile read from hand-written Horovod timelines (whole, cut short, wrong),
and the scaling model placing each gradient as the profile says (hand-computed)."""
import json

import pytest

from harness.bench import scale, timeline
from harness.errors import ConfigError

from scale_support import GRAD_A, GRAD_B, horovod_events as _events, write_timeline as _write


@pytest.mark.parametrize("cut", ["", "comma", "event", "braces"])
def test_profile_leads_bytes_and_order(tmp_path, cut):
    events = _events(steps=5, b_offsets_s=(0.004, 0.004, 0.004, 0.006, 0.005))
    p = timeline.gradient_profile(_write(tmp_path / "t.json", events, cut=cut))
    # steps 0 and 1 skipped; A leads B by 4, 6 and 5 ms in steps 2-4: median 5 ms; B is the last: 0. Cut inside the
    # last event (the metric's), every gradient is whole. The steps' last submissions (B) at 3.004, 4.006, 5.005 s:
    # period median(1.002, 0.999) = 1.0005 s
    assert p.names == (GRAD_A, GRAD_B)
    assert p.leads_s == pytest.approx((0.005, 0.0), abs=1e-9)
    assert p.nbytes == (400, 16) and p.gradient_bytes == 416
    assert p.steps == 3 and p.period_s == pytest.approx(1.0005) and p.unfinished == 0
    assert p.bytes_within(1e-3) == pytest.approx(16 / 416)
    assert [x for pair in p.pairs() for x in pair] == pytest.approx([0.005 / 1.0005, 400, 0.0, 16])
    assert ("2 tensors, 416 bytes, median of 3 steps of 1000.5 ms; first submitted 5.0 ms before the last"
            in timeline.describe(p))


def _broken(events, pid, phase, **change):
    """`events` with the `phase` event ("B" NEGOTIATE_ALLREDUCE or the ALLREDUCE "E" with args) of `pid`'s
    first step changed."""
    out, done = [], False
    for e in events:
        if not done and e.get("pid") == pid and (
                (phase == "B" and e.get("name") == "NEGOTIATE_ALLREDUCE") or (phase == "E" and e.get("ph") == "E"
                                                                               and "args" in e)):
            e, done = {**e, **change}, True
        out.append(e)
    return out


@pytest.mark.parametrize("case, expected", [
    ("no gradients", "no gradient all-reduce"),
    ("few steps", "3 step\\(s\\) of gradient all-reduces, need more than 3"),
    ("not json", "not a Horovod timeline"),
    ("missing", "--timeline .*missing.json: No such file"),
    ("latin-1", "codec can't decode"),
    ("numbers", "event #0 is int, not a trace event object"),
    ("shape", "shape '\\(10, 10\\)' is not a list of sizes"),
    ("dtype", "dtype '<unknown>' is not one of Horovod's"),
    ("ts", "event #\\d+ .*KeyError\\('ts'\\)"),
    ("nan", "event #\\d+ is not JSON"),
    ("zero bytes", "the gradients hold 0 bytes"),
    ("misaligned", "submitted 3 to 5 times: their steps do not line up"),
])
def test_profile_refuses_what_it_cannot_read(tmp_path, case, expected):
    path = tmp_path / "t.json"
    events = _events(steps=5, b_offsets_s=(0.004,) * 5)
    if case == "no gradients":
        _write(path, [e for e in events if e.get("pid") in (0, 3)])
    elif case == "few steps":
        _write(path, _events(steps=3))
    elif case == "not json":
        path.write_text("epoch 1/5 step 3")
    elif case == "missing":
        path = tmp_path / "missing.json"
    elif case == "latin-1":
        path.write_bytes(b'[{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "caf\xe9"}}]')
    elif case == "numbers":
        path.write_text("[1, 2, 3]")
    elif case == "shape":
        _write(path, _broken(events, 1, "E", args={"dtype": "float32", "shape": "(10, 10)"}))
    elif case == "dtype":
        _write(path, _broken(events, 1, "E", args={"dtype": "<unknown>", "shape": "[4]"}))
    elif case == "ts":
        _write(path, [{k: v for k, v in e.items() if k != "ts"} if i == 4 else e for i, e in enumerate(events)])
    elif case == "nan":
        _write(path, events)
        path.write_text(path.read_text().replace('"ts": 2000000', '"ts": NaN', 1))
    elif case == "zero bytes":
        _write(path, [dict(e, args={"dtype": "float32", "shape": "[0]"}) if e.get("ph") == "E" and "args" in e else e
                      for e in events])
    elif case == "misaligned":   # A's first two submissions missing: A seen 3 times, B 5
        gone = [i for i, e in enumerate(events) if e.get("pid") == 1 and e.get("name") == "NEGOTIATE_ALLREDUCE"][:2]
        _write(path, [e for i, e in enumerate(events) if not any(g <= i < g + 7 for g in gone)])
    with pytest.raises(ConfigError, match=expected):
        timeline.gradient_profile(str(path))


def _setup(**kw):
    # 2 ranks, one per node: ring cost 2α + S·β, α = 0, β = 10 µs per byte
    net = scale.Link(alpha_s=0.0, beta_s_per_byte=1e-5)
    return scale.Setup(gradient_bytes=4000, tensors=2, gpus_per_node=1, node=net, net=net, backend="horovod",
                       fusion_bytes=1e9, cycle_s=0.0, **kw)


def test_scale_places_gradients_as_the_profile_says():
    m = scale.Measurement(step_s=0.1, jitter_s=0.0, per_replica_batch=8)
    # measured: 1000 B ready half the step before the end (0.05-0.06 s), 3000 B at the end (0.10-0.13 s): 30 ms
    measured = scale.predict(m, _setup(ready_profile=((0.0, 3000), (0.5, 1000))), 2)
    assert measured.exposed_s == pytest.approx(0.03)
    assert measured.comm_s == pytest.approx(0.04)
    # even spread: 2000 B at 2/3 of the step before the end ... 0.0667-0.0867 s, 2000 B at 0.1-0.12 s: 20 ms
    even = scale.predict(m, _setup(), 2)
    assert even.exposed_s == pytest.approx(0.02)
    # the profile's bytes are scaled to gradient_bytes: fp16 gradients (2000 B) halve both: 15 ms exposed
    half = scale.predict(m, scale.Setup(**{**_setup(ready_profile=((0.5, 1000), (0.0, 3000))).__dict__,
                                           "gradient_bytes": 2000}), 2)
    assert half.exposed_s == pytest.approx(0.015)
    # the leads are shares of the step: twice the step (batch x2) puts 1000 B at 0.1-0.11 s, 3000 B at 0.2-0.23 s
    double = scale.predict(scale.Measurement(step_s=0.2, jitter_s=0.0, per_replica_batch=16),
                           _setup(ready_profile=((0.0, 3000), (0.5, 1000))), 2)
    assert double.exposed_s == pytest.approx(0.03)


def test_the_readme_lines_run_as_printed(tmp_path, monkeypatch):
    """docs/scaling.md's `horovodrun ... --timeline-filename runs/bench/timeline.json harness bench train ...` and
    `harness bench scale ... --timeline runs/bench/timeline.json ...`, run as printed in a folder of the test's (2
    real Horovod ranks; a one-replica report.json written there in place of runs/bench/one's; the scale line in this
    process, it trains nothing): the profile has the bench model's gradients and the line the page shows; the table
    says the timeline placed them.

    The recording line is also `bench train --backend horovod`'s test (it was tests/bench/test_bench_train.py's own
    horovodrun launch): the step `harness train --backend horovod` runs (one replica per rank, Horovod's
    all-reduce), both ranks' steps in rank 0's report (before: no --backend, and under horovodrun each rank ran
    alone, one replica each, a report written twice)."""
    import os
    import pathlib
    import shlex
    import sys

    import procs
    from predict_support import cli_in_process
    from scale_support import write_report

    root = pathlib.Path(__file__).resolve().parents[2]
    readme = (root / "docs" / "scaling.md").read_text().splitlines()
    record = next(ln for ln in readme if ln.startswith("horovodrun -np 2") and "--timeline-filename" in ln)
    predict = next(ln for ln in readme if ln.startswith("harness bench scale") and "--timeline" in ln)
    shown = readme[readme.index(predict) + 1]
    bin_dir = pathlib.Path(sys.executable).parent
    env = procs.outer_free()
    env.update(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2", PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")
    work = tmp_path / "cwd"
    (work / "runs" / "bench" / "one").mkdir(parents=True)
    write_report(work / "runs" / "bench" / "one" / "report.json")
    monkeypatch.chdir(work)   # the lines' relative paths
    argv = shlex.split(record)
    assert argv[0] == "horovodrun", record
    recorded = procs.run(argv, env=env, timeout=300)
    from harness.cli import build_parser
    train = build_parser().parse_args(argv[argv.index("harness") + 1:])
    report = json.loads((work / train.output / "report.json").read_text())
    assert report["summary"]["replicas_in_sync"] == 2, recorded[-3000:]
    assert [p["rank"] for p in report["parts"]] == [0, 1]
    assert all(len(p["steps"]) == train.steps + train.warmup for p in report["parts"])
    assert "(horovod)" in report["config"]["context"] and report["config"]["backend"] == "horovod"
    assert recorded.count("bench train: synthetic batches") == 1, recorded[-3000:]   # the chief alone reports
    argv = shlex.split(predict)
    assert argv[0] == "harness", predict
    out = cli_in_process(*argv[1:]).stdout
    from harness.train.model import builtin
    weights = builtin.builtin_model("image", (16, 16, 4), 4).trainable_weights
    nbytes = sum(int(w.shape.num_elements()) * w.dtype.size for w in weights)
    line = next(ln for ln in out.splitlines() if ln.startswith("gradient profile:"))
    assert line.startswith(f"gradient profile: {len(weights)} tensors, {nbytes:,} bytes, median of "), line
    assert shown.split(" bytes,")[0] == line.split(" bytes,")[0], (shown, line)
    assert "gradients ready as the timeline measured" in out and "efficiency falls below" in out, out[-3000:]
