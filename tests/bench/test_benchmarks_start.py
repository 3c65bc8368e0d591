"""Every script in benchmarks/ starts and prints its figures: each runs at its `--smoke` size (seconds, figures
meaningless) as a real subprocess, the short in-process ones (SHARED) one after the other in one Python process
(each as `__main__` with its own argv and temporary folder: TensorFlow imported once, not once each), and the table
it prints is checked for its rows and for positive numbers in them.
The scripts are found by globbing benchmarks/, so a new benchmark without a smoke run here fails. The Makefile's
`bench` target names only scripts and commands that exist (issue 19, item 9: `make bench` stopped at a
SyntaxError that nothing ran)."""
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from harness.data.export import synth

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
NUM = r"([0-9][0-9,]*\.?[0-9]*)"  # a printed figure: 1,234.5 / 0.97 / 282
RUN_TIMEOUT_S = 420

# script -> its smoke runs: (extra arguments besides --smoke, {name: regex}); every regex must match a line of
# stdout (re.MULTILINE) and each of its groups must be a positive number. {points}, {images}, {tmp} are filled in.
_TABLE_PIPES = ("raw-seq", "raw-par", "raw-reader", "harness", "harness-alt", "per-record")
_STEP_ROW = r"^  {name}\s+" + NUM + r" (?:examples/s|µs/step) \(median; range"
_RATIO = r"^  {a} / {b} = " + NUM
RUNS = {
    "cluster.py": [([], {
        "title": r"^U-Net 16x16x4, per-replica batch 8, 3 timed steps after 2; gradient " + NUM + " bytes in 36 "
                 "tensors per step",
        "loopback": rf"^  tf\s+1\s+2\s+loopback\s+{NUM}\s+{NUM}\s+{NUM}\s*$",
        "loopback after": rf"^  tf\s+1\s+2\s+loopback after\s+{NUM}\s+{NUM}\s+{NUM}\s*$",
        "two hosts": rf"^  tf\s+2\s+2\s+100 Mbit/s\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}%\s+{NUM}%\s+[+-][0-9.]+\s+[0-9]+%  "
                     r"(?:compute|all-reduce \((?:latency|bandwidth)\)|fixed|stragglers)$",
        "checked": r"^predicted within ±10 points of measured: [01] of 1",
        "done": r"^done \[load average"})],
    "fit_ratio.py": [(["--data", "{images}", "--output", "{tmp}/fit", "--json", "{tmp}/fit.json"], {
        f"round 1 {name}": rf"^round 1 {name}\s+{NUM} examples/s" for name in ("harness", "fit_spe1", "fit_speK")} | {
        "ratio": rf"^harness/fit ratio \(unet, mixed_float16, batch 4\): {NUM} against steps_per_execution 1, {NUM} "
                 rf"against steps_per_execution \d+"})],
    "gcs_read.py": [([], {
        "title": r"^TensorFlow \S+, the client (?:on \d+ core\(s\), the bed on 1 of its own|and the bed sharing "
                 r"the one core); 4 patches of 16x16x8 float, GZIP, in 2 shards.*, \d+ at once, "
                 r"GCS_READ_CACHE_BLOCK_SIZE_MB=0, read buffers of 16 MiB \(bucket\) and 4 MiB \(local\),",
        **{f"row {pipe} {place}": rf"^  {pipe} {place}\s+{NUM}\s+\d+%\s+{NUM}$"
           for pipe in ("reader", "harness") for place in ("local", "bucket")},
        "reader ratio": rf"^  reader bucket / local\s+= {NUM} \[",
        "harness ratio": rf"^  harness bucket / local\s+= {NUM} \[.*\(target >= 0\.8: (?:ok|MISSED)\)$",
        "reads": rf"^  {NUM} media reads through the proxy; 0 refused$"})],
    "input_pipeline.py": [(["--points", "{points}"], {
        "header": r"^  pipeline\s+examples/s\s+spread\s+best\s+MB/s\s+CPU us/ex\s+cores\s+note$",
        **{f"row {pipe}": rf"^  {re.escape(pipe)}\s+{NUM}\s+\d+%\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s"
           for pipe in _TABLE_PIPES},
        "read limit ratio": rf"^  harness / read limit \(fastest raw read\) = {NUM} \[",
        "points": r"^== small records \(Earth Engine point export\): 4 shard\(s\), 256 records",   # 1 file, 4x
        "patches": r"^== large records \(256x256x8 float GZIP patches\): 2 shard\(s\), 4 records"})],
    "per_pixel.py": [([], {
        "title": r"^4 patches of 24x24x4 \(P=16, k=8\) in 2 shards, batch 2, pixel classifier \(64, 64\), 1 timed runs",
        **{f"row {name}": rf"^  {name}\s+{NUM} examples/s  spread" for name in ("per-pixel", "converted")},
        "same": r"^  pixels whose class differs: 0 of 1024$",
        "ratio": rf"^  per-pixel / converted = {NUM} \[{NUM}-{NUM}\] \(target >= 1\.0: (?:ok|MISSED)\)$"})],
    "predict.py": [([], {
        "title": r"^4 patches of 24x24x4 \(P=16, k=8\) in 2 shards, batch 2, U-Net, 1 timed runs",
        "predict": rf"^  predict\s+{NUM} examples/s  spread",
        "ceiling": rf"^  ceiling\s+{NUM} examples/s  spread",
        "ratio": rf"^  predict / ceiling = {NUM} \[{NUM}-{NUM}\]"})],
    "profile_overhead.py": [([], {
        "title": r"U-Net 16x16x4, batch 2, 1 timed pairs of 3 steps",
        "off": rf"^  timeline off\s+{NUM} examples/s \(median",
        "on": rf"^  timeline on\s+{NUM} examples/s \(median",
        "ratio": rf"^  on / off = {NUM} \(median of 1 adjacent pairs; ratio of medians {NUM}\)"})],
    "published_scaling.py": [([], {
        "title": r"^published vs predicted scaling efficiency \((\d+) points",
        **{f"row {point}": rf"^  {point}\s+\S+\s+{NUM}\s+{NUM}%\s+{NUM}%\s+[+-][0-9.]+\s+[0-9.]+\s+\S.*(?:ok|MISS|input)$"
           for point in ("horovod-512-vgg16", "hvd779-128", "aws-64-resnet50")},
        "summary": rf"^within ±5 points: \d+ of {NUM} checked points",
        "ceiling": rf"^the points ask the all-reduce to be exposed from {NUM} \(\S+\) to {NUM} .* reach at best "
                   rf"\d+ of {NUM} within ±5",
        "calibrated row": rf"^  hvd779-128\s+128\s+{NUM}%\s+{NUM}%\s+{NUM}%-{NUM}%\s+[+-][0-9.]+  (?:ok|MISS), "
                          r"(?:inside|OUTSIDE) the interval$",
        "calibrated": rf"^calibrated: within ±5 points: \d+ of {NUM} held-out points; inside the interval: \d+ of "
                      rf"{NUM}$",
        # the constant the CLI's interval uses is the figure this run computes
        "extrapolation": rf"^extrapolation error: {NUM} points RMS per doubling .*EXTRAPOLATION_POINTS = {NUM}: "
                         r"the same\)$",
        # issue 67: each series with a published node, calibrated on that node alone, reproduces it
        "one node row": rf"^  aws-16-resnet50\s+16\s+{NUM}%\s+{NUM}%\s+{NUM}%\s+{NUM}%-{NUM}%\s+[+-][0-9.]+  "
                        r"(?:ok|MISS), (?:inside|OUTSIDE) the interval$",
        "one node": rf"^one node alone: the node's run reproduced in (\d+) of \1 series; within ±5 points: \d+ of "
                    rf"{NUM} held-out points \(before issue 67: \d+ of {NUM}\); inside the interval: \d+ of {NUM}$"})],
    "reshard.py": [([], {
        "header": r"^  data\s+pipeline\s+examples/s\s+spread\s+MB/s$",
        **{f"row {data} {pipe}": rf"^  {data}\s+{pipe}\s+{NUM}\s+[0-9.]+%\s+{NUM}$"
           for data in ("GZIP export", "resharded") for pipe in ("read limit", "harness")},
        "gain": rf"^  gain, harness: {NUM}x"})],
    "quicklook.py": [([], {
        "title": r"^quick-look of image exports of N patches of 32x32x3 float \(GZIP, 4 shards\), at most 1024 pixels",
        **{f"row {n}": rf"^\s+{n}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+\(\d+x\d+ px, scale 1\)$"
           for n in (4, 16)},
        "growth": rf"^peak memory at 16 patches against 4: {NUM}x \(4x the area\)$"})],
    # the points alone, their job included (harness train naive then tuned): the patch cases run the same code on
    # another export (their smoke took ~25 s of the suite's budget)
    "startup.py": [([], {
        "title": r"^64 records of a table export \(4 float bands, a class\), GZIP, split over N shards; 2 run\(s\) per N",
        **{f"row {n} 1": rf"^\s+{n}\s+1\s+{NUM}\s+{NUM}\s+{NUM}\s+{n}$" for n in (2, 8)},   # every head read
        # none read: the checks passed on the first run (open, checks and their ms a shard, from the index: may
        # print 0.00, so not among the figures that must be positive; nor the growth, which may be -0.00)
        **{f"row {n} 2": rf"^\s+{n}\s+2(?:\s+\d+\.\d+){{3}}\s+0\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}$" for n in (2, 8)},
        "growth": r"^second run \(the record index read\), open \+ checks at 8 shards against 2: [+-]\d+\.\d+ s",
        "one pass": rf"^checks at 8 shards: one pass {NUM} s \(first run\) against {NUM} s one shard at a time "
                    rf"\({NUM}x\)$",
        # against the bytes: a 2 MB image export (15 patches of 64x64x8) in 4 shards, one run (the first: counting);
        # the memory above the imports may print 0 (matched, not required positive)
        "bytes title": r"^image exports of 64x64x8 float32 patches \(131,072 B of values a record\), GZIP, 4 shards",
        "bytes 0.002": rf"^\s+0\.002\s+15\s+1\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+\d+$",
        **{f"memory {name}": rf"^{name}: peak memory above the imports at 0.002 GB against 0.002 GB: \d+ against "
                             r"\d+ MiB \([+-]\d+%; target: within 20%\)$"
           for name in (r"first run \(counting\)", r"second run \(the record index read\)")},
        # on 1 worker then 2 (MWMS on loopback): 8 shards, each worker counts and checks its half on a first run
        "workers title": r"^64 records of a table export in 8 shards, on 1 worker and on 2 \(MWMS over loopback",
        "one worker": rf"^\s+1\s+1\s+0\s+{NUM}\s+{NUM}\s+8\s+8\s+{NUM}$",
        **{f"worker {rank} of 2": rf"^\s+2\s+1\s+{rank}\s+{NUM}\s+{NUM}\s+4\s+4\s+{NUM}$" for rank in (0, 1)},
        "per worker": r"^first run, shards counted per worker: 8 on 1 worker, 4 and 4 on 2 \(1/N: 4\)$"})],
    "tune.py": [(["--points", "{points}", "--cases", "points"], {
        **{f"{case}": rf"^== {case}: \d+ file\(s\), {NUM} records, batch {NUM}, {NUM} steps per epoch, 2 epochs, 1 runs"
           for case in ("points",)},
        **{f"row {pipe}": rf"^  {pipe}\s+{NUM}\s+{NUM}\s+{NUM}  parse=" for pipe in ("naive", "autotune", "tuned")},
        "confirmed": rf"^  confirmed, whole run: tuned {NUM}, grid \S+ {NUM}, autotune {NUM} examples/s \(median of 1 ",
        "grid": rf"^  tuned / best of the grid \(\S+\)\s+= {NUM} \[.*\(target >= 0\.9: (?:ok|MISSED)\)$",
        "autotune": rf"^  tuned / autotune\s+= {NUM} \[",
        **{f"predicted {phase}": rf"^  predicted / measured, {phase}\s+[+-]\d+% \[[+-]\d+% to [+-]\d+%\]  \(per run: "
           rf"{NUM}/{NUM}; target within 15%: (?:ok|MISSED)\)$" for phase in ("first epoch", "later epochs")},
        "job": rf"^  real/synthetic: before {NUM}, after {NUM} \(predicted after [0-9.]+\)$",
        **{f"whole {run}": rf"^    {run}\s+{NUM} s \[{NUM}-{NUM}\]  later epochs\s+{NUM} examples/s  \S"
           for run in ("default", "tuned", "grid best")},
        "vs default": rf"^  tuned / default, whole run\s+= (?:1 \(the same configuration; target >= 1\.0: ok\)|"
                      rf"{NUM} \[{NUM}-{NUM}\]  \(target >= 1\.0: (?:ok|MISSED)\)  \(epochs alone)",
        "vs grid": rf"^  tuned / grid best, whole run\s+= {NUM} \[{NUM}-{NUM}\]  \(target >= 0\.9: (?:ok|MISSED)\)  "
                   rf"\(epochs alone {NUM} \[",
        "whole summary": rf"^whole runs, tuned / default and tuned / grid's best \(medians\): points {NUM} and {NUM}; "
                         rf"both targets met on [01] of 1 cases$",
        "done": r"^done \[load average"})],
    # every case but the mirrored child in one run (the horovodrun group among them: one script process, not two);
    # the mirrored child runs the cases above under a strategy (fit_case, as in-process) through the same child-group
    # launch as horovodrun's: left to `make bench` (its smoke took ~40 s of the suite's budget)
    "step_loop.py": [
        (["--data", "{points}", "--cases", "points,unet,horovod,overhead"], {
            **{f"points {n}": _STEP_ROW.format(name=re.escape(n)) for n in (
                "harness auto", "harness steps_per_loop=1", "fit spe=1", "fit spe=8",   # smoke: spe 1 and 8 alone
                "harness auto, OneDeviceStrategy", "harness loop, hand-written input", "harness pipeline alone",
                "hand-written pipeline alone")},
            "points ratio": _RATIO.format(a="harness auto", b="fit spe=1") + r" \(target >= 1.0",
            "unet": r"^== U-Net: 16 records, 1 steps of global batch 16 per epoch",
            **{f"row {n}": _STEP_ROW.format(name=re.escape(n)) for n in (
                "harness auto, Keras 3 model", "fit spe=1, Keras 3 model", "harness auto, no BatchNorm",
                "harness auto, Keras 3, no BatchNorm")},
            "keras3 fit ratio": _RATIO.format(a=re.escape("harness auto, Keras 3 model"),
                                              b=re.escape("fit spe=1, Keras 3 model")) + r" \(target >= 1.0",
            "keras3 step ratio": _RATIO.format(a=re.escape("harness auto, Keras 3, no BatchNorm"),
                                               b=re.escape("harness auto, no BatchNorm")) + r" \(target >= 0.95",
            "keras3 ratio": _RATIO.format(a=re.escape("harness auto, Keras 3 model"), b="harness auto") +
                            r" \(target >= 0.95: (?:met|MISSED)\)  \(with BatchNormalization: Keras 3.s trained on",
            "overhead": r"^== per-step overhead: one-weight model, batch 1, 20 steps per epoch",
            "horovod all": _STEP_ROW.format(name="horovod 2 ranks, all"),
            "horovod rank 1": _STEP_ROW.format(name="horovod rank 1"),
            "overhead row": _STEP_ROW.format(name="fit spe=128"),
            "done": r"^done \[load average"})],
}
# Run in one Python process, one after the other (`_SHARED_RUNNER`): scripts that set nothing before TensorFlow
# loads (gcs_read.py routes the environment and the cores first: its own process) and whose child processes, if any,
# hand their output back to the script (step_loop.py's horovodrun, tune.py's harness train runs): each saves a
# process that imports TensorFlow (step_loop.py, tune.py and fit_ratio.py: 100 -> 92 CPU-s when they joined).
SHARED = ("published_scaling.py", "reshard.py", "input_pipeline.py", "profile_overhead.py", "per_pixel.py",
          "predict.py", "quicklook.py", "step_loop.py", "tune.py", "fit_ratio.py", "startup.py")
# argv: benchmarks/, the JSON list of [script, args, temporary folder], the JSON file of {script: {code, stdout}}
_SHARED_RUNNER = r"""
import contextlib, gc, io, json, os, runpy, sys, tempfile, time, traceback
bench, jobs, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
sys.path.insert(0, bench)   # as `python benchmarks/X.py` puts the script's folder first
results = {}
for script, args, tmpdir in jobs:
    cpu = time.process_time() + sum(os.times()[2:4])   # this process's and its waited children's
    os.environ["TMPDIR"] = tempfile.tempdir = tmpdir
    sys.argv = [os.path.join(bench, script), "--smoke", *args]
    printed, code = io.StringIO(), 0
    with contextlib.redirect_stdout(printed):
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else str(e.code)
        except BaseException:
            code = traceback.format_exc()
    results[script] = {"code": code, "stdout": printed.getvalue()}
    for keras in ("tf_keras", "keras"):   # a global policy set (fit_ratio.py's mixed_float16) not left to the next
        if keras in sys.modules:
            sys.modules[keras].mixed_precision.set_global_policy("float32")
    gc.collect()   # the script's datasets and iterators (their threads) gone before the next one
    print(f"{script}: exit {code}, {time.process_time() + sum(os.times()[2:4]) - cpu:.1f} CPU-s", file=sys.stderr,
          flush=True)
with open(out, "w") as f:
    json.dump(results, f)
"""
SHELL_ONLY = {"gpu_check.sh": "needs a GPU and a GPU build of TensorFlow (it stops at once without one): its "
                              "syntax is checked with bash -n; it runs on the GPU machine"}


def _cases():
    """(script, run index) for every benchmarks/*.py (not `_*.py`: modules the scripts share); index None for a
    script that has no smoke run here."""
    for path in sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")):
        runs = RUNS.get(path.name)
        if not runs:
            yield pytest.param(path.name, None, id=path.name)
        for i in range(len(runs or ())):
            yield pytest.param(path.name, i, id=f"{path.name}-{i}" if len(runs) > 1 else path.name)


@pytest.fixture(scope="module")
def smoke_data(tmp_path_factory):
    """A synthetic point export (one GZIP file of 256 rows, label `class`) and image export (16x16 patches)."""
    out = tmp_path_factory.mktemp("smoke_data")
    synth.write_table_export(str(out / "points"), prefix="points", shards=1, records=256, seed=1)
    synth.write_image_export(str(out / "images"), prefix="img", shards=2, records=16, patch_size=16, classes=3,
                             seed=3)
    return {"points": str(out / "points" / "points.tfrecord.gz"), "images": str(out / "images")}


@pytest.fixture(scope="module")
def shared_runs(smoke_data, tmp_path_factory):
    """{script: (exit code, stdout, its temporary folder)} of the SHARED scripts, run in one Python process."""
    base = tmp_path_factory.mktemp("shared")
    jobs = []
    for script in SHARED:
        (extra, _), = RUNS[script]
        (base / script / "tmpdir").mkdir(parents=True)
        jobs.append([script, [a.format(tmp=base / script, **smoke_data) for a in extra], str(base / script / "tmpdir")])
    done = _run([sys.executable, "-c", _SHARED_RUNNER, str(BENCHMARKS), json.dumps(jobs), str(base / "out.json")],
                RUN_TIMEOUT_S)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    results = json.loads((base / "out.json").read_text())
    return {script: (results[script]["code"], results[script]["stdout"], base / script / "tmpdir", done.stderr)
            for script in SHARED}


def _run(cmd: list, timeout_s: float, tmpdir: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="", **({"TMPDIR": str(tmpdir)} if tmpdir else {}))
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.parametrize("script, index", list(_cases()))
def test_benchmark_starts_and_prints_its_figures(script, index, smoke_data, tmp_path, request):
    assert index is not None, (f"benchmarks/{script} has no smoke run: give it a --smoke size (seconds) and add "
                               f"it to RUNS in {pathlib.Path(__file__).name}")
    if script == "cluster.py":   # hosts of network namespaces: root and iproute2 (tests/cluster/bed.py)
        from cluster.bed import unavailable_reason
        if unavailable_reason():
            pytest.skip(f"benchmarks/cluster.py needs the bed: {unavailable_reason()}")
    extra, shape = RUNS[script][index]
    if script in SHARED:
        code, stdout, tmpdir, stderr = request.getfixturevalue("shared_runs")[script]
        done = subprocess.CompletedProcess([script], code, stdout, stderr)
    else:
        args = [a.format(tmp=tmp_path, **smoke_data) for a in extra]
        tmpdir = tmp_path / "tmpdir"
        tmpdir.mkdir()
        done = _run([sys.executable, str(BENCHMARKS / script), "--smoke", *args], RUN_TIMEOUT_S, tmpdir)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    # nothing left in the temporary folder but autograph's converted functions (TensorFlow never deletes those)
    left = [p.name for p in tmpdir.iterdir() if not p.name.startswith("__autograph_generated_file")]
    assert not left, f"benchmarks/{script} left {left} in its temporary folder"
    missing = []
    for name, pattern in shape.items():
        m = re.search(pattern, done.stdout, re.MULTILINE)
        if m is None:
            missing.append(name)
            continue
        for value in m.groups():   # (a pattern's alternative that did not match leaves its groups None)
            assert value is None or float(value.replace(",", "")) > 0, f"{name}: {m.group(0)!r}"
    assert not missing, f"benchmarks/{script} printed no {missing}:\n{done.stdout[-4000:]}"
    if script == "fit_ratio.py":   # --json: the same figures, one per round and variant
        result = json.loads((tmpdir.parent / "fit.json").read_text())   # {tmp}: the temporary folder's parent
        assert {k: len(v) for k, v in result["examples_per_s"].items()} == {"harness": 1, "fit_spe1": 1,
                                                                            "fit_speK": 1}
        assert result["model"] == "unet" and result["global_batch"] == 4 and result["ratio_fit_spe1"] > 0


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.iterdir()
                                          if p.suffix not in (".py", "", ".csv")))   # .csv: a benchmark's data
def test_other_benchmark_scripts_parse(script):
    assert script in SHELL_ONLY, f"benchmarks/{script}: neither a Python benchmark nor listed in SHELL_ONLY"
    done = _run(["bash", "-n", str(BENCHMARKS / script)], 60)
    assert done.returncode == 0, done.stderr
    pytest.skip(f"benchmarks/{script} parses (bash -n); not run: {SHELL_ONLY[script]}")


def _make_recipe(target: str) -> list[str]:
    """The recipe lines of a Makefile target, with $(PY) and $(VENV) expanded from the Makefile's own values."""
    text = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+) \??:?= (.*)$", text, re.MULTILINE))
    lines, inside = [], False
    for line in text.splitlines():
        if re.match(rf"^{target}:", line):
            inside = True
        elif inside and line.startswith("\t"):
            lines.append(line.strip())
        elif inside:
            break
    expand = lambda s: re.sub(r"\$\((\w+)\)", lambda m: expand(variables[m.group(1)]), s)  # noqa: E731
    return [expand(line) for line in lines]


def test_make_bench_names_what_exists():
    from harness.cli import build_parser

    lines = _make_recipe("bench")
    assert lines, "the Makefile has no bench recipe"
    for line in lines:
        argv = shlex.split(line)
        if argv[0].endswith("/python"):
            script = ROOT / argv[1]
            assert script.is_file() and script.parent == BENCHMARKS, line
            assert script.name in RUNS, f"{line}: no smoke run in this file"
            compile(script.read_text(), str(script), "exec")
        elif argv[0].endswith("/harness"):   # the console script: the arguments parse as harness parses them
            args = build_parser().parse_args(argv[1:])
            assert args.command == "bench", line
        else:
            pytest.fail(f"make bench line neither a benchmarks/ script nor the harness CLI: {line}")
