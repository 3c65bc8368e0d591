"""Training throughput and per-step all-reduce time across hosts of the bed (tests/cluster/bed.py), at link caps.

For each link cap (`--caps`, Mbit/s each way, tc tbf) and each host count (`--hosts`), one worker per host runs
`harness bench train --data synthetic` under MultiWorkerMirroredStrategy (TF_CONFIG with the hosts' addresses),
then `harness bench allreduce --sizes G` with G the model's gradient bytes (float32 trainable weights), the
all-reduce of one step as training runs it. Beside each host count, the same number of processes on one host
(TF_CONFIG on localhost, loopback: no cap) : the bed's hosts share this machine's CPUs, so the two rows differ only
in the link. Printed per row: examples/s (the job's, from the chief's report.json), the step time (global batch /
examples/s), the all-reduce time of G bytes, and the scaling efficiency against the one-process run
(examples/s / (N x one process's examples/s); the model, per-replica batch and steps are the same).

The figures depend on this machine's cores (all hosts share them: N processes on 2 cores are CPU-bound before any
link is): what the table shows is the link's share, by the N-hosts row against the one-host row at the same N.

  python benchmarks/cluster.py [--hosts 1,2,4] [--caps 100,1000] [--steps 30] [--patch-size 32] [--smoke]

Needs root and network namespaces (the bed); says why and exits 0 without them.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import harness  # noqa: E402,F401  (environment defaults before TensorFlow)

BIN = pathlib.Path(sys.executable).parent
PORT = 20000
RUN_TIMEOUT_S = 900
# --smoke: the one-process row and 2 hosts at one cap (no loopback row), 3 steps: `make test` runs it
# (tests/bench/test_benchmarks_start.py)
SMOKE = dict(hosts=(2,), caps=(100.0,), steps=3, warmup=2, patch_size=16, rounds=2, repeats=2)


def _env(tf_config: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "HOROVOD_", "OMPI_"))}
    env.update(TF_CONFIG=json.dumps(tf_config), TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
               CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", HARNESS_WORKER_WAIT_S="120",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _run_job(placements, args: list, logs: pathlib.Path) -> None:
    """Run `harness ARGS` as one worker per (host, address) in placements, all to their end (bounded); raises with the
    first failing worker's log."""
    workers = [f"{address}:{PORT + i}" for i, (_, address) in enumerate(placements)]
    procs, files = [], []
    try:
        for i, (host, _) in enumerate(placements):
            files.append(open(logs / f"worker{i}.log", "w"))
            config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
            procs.append(host.popen([BIN / "harness", *args], env=_env(config), stdout=files[-1],
                                    stderr=subprocess.STDOUT, cwd=str(ROOT), start_new_session=True))
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.5)
        for i, p in enumerate(procs):
            if p.poll() is None or p.returncode != 0:
                raise RuntimeError(f"worker {i} of {' '.join(map(str, args[:3]))}: "
                                   f"{'timed out' if p.poll() is None else f'exit {p.returncode}'}\n"
                                   + (logs / f"worker{i}.log").read_text()[-3000:])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
        for f in files:
            f.close()


def gradient_bytes(patch_size: int, bands: int, classes: int) -> int:
    """float32 bytes of the built-in U-Net's trainable weights at this patch (what one step all-reduces)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    from harness.train import models

    model = models.builtin_model("image", (patch_size, patch_size, bands), classes)
    return 4 * sum(int(w.shape.num_elements()) for w in model.trainable_weights)


def measure(placements, opts, grad_bytes: int, work: pathlib.Path) -> dict:
    """One row: bench train then bench allreduce on `placements` ((host, address) per worker)."""
    work.mkdir(parents=True)
    _run_job(placements, ["bench", "train", "--data", "synthetic", "--steps", str(opts.steps), "--warmup",
                          str(opts.warmup), "--patch-size", str(opts.patch_size), "--per-replica-batch-size",
                          str(opts.batch), "--no-plot", "--no-trace", "--no-sampling", "--output", str(work / "train")],
             work)
    summary = json.loads((work / "train" / "report.json").read_text())["summary"]
    _run_job(placements, ["bench", "allreduce", "--sizes", str(grad_bytes), "--rounds", str(opts.rounds),
                          "--repeats", str(opts.repeats), "--output", str(work / "allreduce")], work)
    allreduce = json.loads((work / "allreduce" / "allreduce.json").read_text())["rows"][0]
    n = len(placements)
    return {"workers": n, "examples_per_s": summary["examples_per_s"],
            "step_s": n * opts.batch / summary["examples_per_s"], "allreduce_s": allreduce["seconds"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="1,2,4", help="host counts, comma-separated")
    p.add_argument("--caps", default="100,1000", help="link caps in Mbit/s, comma-separated")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--patch-size", type=int, default=32)
    p.add_argument("--batch", type=int, default=8, help="per-replica batch")
    p.add_argument("--rounds", type=int, default=10, help="bench allreduce --rounds")
    p.add_argument("--repeats", type=int, default=3, help="bench allreduce --repeats")
    p.add_argument("--smoke", action="store_true", help="1 process and 2 hosts, one cap, 3 steps: the script starts")
    opts = p.parse_args(argv)
    hosts = [int(h) for h in opts.hosts.split(",")]
    caps = [float(c) for c in opts.caps.split(",")]
    if opts.smoke:
        hosts, caps = list(SMOKE["hosts"]), list(SMOKE["caps"])
        for key in ("steps", "warmup", "patch_size", "rounds", "repeats"):
            setattr(opts, key, SMOKE[key])

    from cluster.bed import Bed, unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"cluster benchmark skipped: {reason}")
        return 0
    grad_bytes = gradient_bytes(opts.patch_size, 4, 4)
    print(f"U-Net {opts.patch_size}x{opts.patch_size}x4, per-replica batch {opts.batch}, {opts.steps} timed steps "
          f"after {opts.warmup}; gradient {grad_bytes:,} bytes per step; {os.cpu_count()} cores shared by all hosts "
          f"[load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}]", flush=True)
    print(f"  {'hosts':>5} {'procs':>5} {'link':>14} {'examples/s':>11} {'step ms':>8} {'all-reduce ms':>14} "
          f"{'efficiency':>10}", flush=True)
    with tempfile.TemporaryDirectory(prefix="harness-cluster-bench-") as tmp:
        tmp = pathlib.Path(tmp)
        rows, one = [], None

        def show(hosts_n, procs, link, row):
            eff = row["examples_per_s"] / (row["workers"] * one["examples_per_s"])
            print(f"  {hosts_n:>5} {procs:>5} {link:>14} {row['examples_per_s']:>11.1f} {row['step_s'] * 1e3:>8.1f} "
                  f"{row['allreduce_s'] * 1e3:>14.2f} {eff:>10.2f}", flush=True)
            rows.append(dict(row, hosts=hosts_n, link=link, efficiency=eff))

        with Bed(1) as bed:   # one host: 1 process, then N processes on loopback
            h = bed.hosts[0]
            one = measure([(h, "localhost")], opts, grad_bytes, tmp / "one")
            show(1, 1, "none", one)
            for n in ([] if opts.smoke else sorted(set(hosts) - {1})):
                show(1, n, "loopback", measure([(h, "localhost")] * n, opts, grad_bytes, tmp / f"one-{n}"))
        for cap in caps:
            for n in sorted(set(hosts) - {1}):
                with Bed(n, cap_mbit=cap) as bed:
                    row = measure([(h, h.address) for h in bed.hosts], opts, grad_bytes, tmp / f"bed-{n}-{cap:g}")
                show(n, n, f"{cap:g} Mbit/s", row)
    print(f"done [load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
