"""Published scaling points beside what `harness.bench.scale` predicts from the inputs the same sources give.

Every row of `benchmarks/published_scaling.csv` holds a published efficiency (with its source) and the inputs taken
from public sources (each with its own source column): single-GPU examples/s and per-GPU batch, trainable
parameters (float32 gradients: 4 bytes each) and tensor count, GPUs per node, intra-node link, network, Horovod's
fusion threshold and cycle time of the time; where the source also gives one full node's examples/s, the model's
one free parameter T_fixed is measured from it (`fixed_from_node`) and that node point is an input, not a check.
Nothing is fitted to the checked points: step jitter is not published for these runs, so it enters as 0,
as does T_fixed where no node measurement is published, and the links run at their line rate with
NCCL's per-hop latencies (`harness.bench.scale.NODE_LINKS`, `NET_HOP_S`). The table prints published vs
predicted and the difference in points; rows off by more than 5 points are marked MISS, and the summary line
says how many.

    python benchmarks/published_scaling.py [--csv PATH] [--smoke]
"""
import argparse
import dataclasses
import csv
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from harness.bench import scale  # noqa: E402

CSV = pathlib.Path(__file__).with_name("published_scaling.csv")
TOLERANCE_POINTS = 5.0


def predict_row(row: dict) -> scale.Point:
    """The prediction for one CSV row (module docstring)."""
    batch = int(row["per_replica_batch"])
    m = scale.Measurement(step_s=batch / float(row["single_gpu_examples_per_s"]), jitter_s=0.0,
                          per_replica_batch=batch)
    s = scale.Setup(gradient_bytes=4 * int(row["trainable_parameters"]), tensors=int(row["tensors"]),
                    gpus_per_node=int(row["gpus_per_node"]), node=scale.parse_node(f"1x{row['node_link']}")[1],
                    net=scale.parse_link(row["net_link"]), backend=row["backend"],
                    fusion_bytes=float(row["fusion_mib"]) * 2 ** 20, cycle_s=float(row["cycle_ms"]) / 1e3)
    if row["node_examples_per_s"]:   # one full node measured: its per-step cost beyond the model (T_fixed)
        s = dataclasses.replace(s, fixed_s=scale.fixed_from_node(m, s, float(row["node_examples_per_s"])))
    return scale.predict(m, s, int(row["gpus"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--csv", default=str(CSV), help="published points (default: beside this script)")
    parser.add_argument("--smoke", action="store_true", help="same run (the model is pure Python: milliseconds)")
    args = parser.parse_args(argv)
    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    print(f"published vs predicted scaling efficiency ({len(rows)} points; jitter 0: not published; T_fixed from a "
          "published one-node run where there is one, else 0)")
    print(f"  {'point':<24} {'model':<12} {'N':>4} {'published':>9} {'predicted':>9} {'diff':>6}  "
          f"{'exposed ms':>10}  {'bottleneck':<24} check")
    misses = []
    for row in rows:
        p = predict_row(row)
        published = float(row["published_efficiency"])
        diff = (p.efficiency - published) * 100
        is_input = row["node_examples_per_s"] and p.n == int(row["gpus_per_node"])
        ok = abs(diff) <= TOLERANCE_POINTS
        if not ok and not is_input:
            misses.append(row["point"])
        print(f"  {row['point']:<24} {row['model']:<12} {p.n:>4} {published:>9.1%} {p.efficiency:>9.1%} "
              f"{diff:>+6.1f}  {p.exposed_s * 1e3:>10.1f}  {p.bottleneck:<24} "
              f"{'input' if is_input else 'ok' if ok else 'MISS'}")
    checked = [r for r in rows if not (r["node_examples_per_s"] and r["gpus"] == r["gpus_per_node"])]
    print(f"within ±{TOLERANCE_POINTS:g} points: {len(checked) - len(misses)} of {len(checked)} checked points"
          + (f"; not reproduced: {', '.join(misses)}" if misses else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
