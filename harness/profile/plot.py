"""The step timeline plot: one row per worker, each step a bar of input stall (red) then compute (blue), warm-up
steps hatched, accelerator utilization (or CPU utilization where there is no GPU, said so) on a second axis."""
from __future__ import annotations


def plot_timeline(report: dict, path: str) -> str:
    """Draw `report`'s parts into a PNG at `path`; returns `path`."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    parts = sorted(report["parts"], key=lambda p: p["rank"])
    fig, axes = plt.subplots(len(parts), 1, figsize=(12, 2.2 * len(parts) + 0.8), squeeze=False, sharex=False)
    for ax, part in zip(axes[:, 0], parts):
        _row(ax, part)
    s = report["summary"]
    fig.suptitle(f"{report['kind']}: input stall {100 * s['input_stall_share']:.1f}% (worker "
                 f"{s['input_stall_worker']}), {s['examples_per_s']:.1f} examples/s: {s['verdict']}", fontsize=10)
    axes[-1, 0].set_xlabel("seconds since the start of training (this worker's clock)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _row(ax, part: dict) -> None:
    steps = part["steps"]
    for warmup, hatch in ((True, "//"), (False, None)):
        chosen = [s for s in steps if s["warmup"] == warmup]
        ax.broken_barh([(s["start_s"], s["input_wait_s"]) for s in chosen], (0.1, 0.8), color="tab:red",
                       hatch=hatch, lw=0)
        ax.broken_barh([(s["start_s"] + s["input_wait_s"], s["compute_s"]) for s in chosen], (0.1, 0.8),
                       color="tab:blue", hatch=hatch, lw=0, alpha=0.8)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_ylabel(f"worker {part['rank']}", rotation=0, ha="right", va="center")
    twin = ax.twinx()
    samples = part["samples"]
    t = [x["t_s"] for x in samples]
    if part["gpu_available"]:
        gpu = [sum(x["gpu_util"]) / len(x["gpu_util"]) if x["gpu_util"] else float("nan") for x in samples]
        twin.plot(t, gpu, color="black", lw=1, label="GPU utilization %")
        label = "GPU %"
    else:
        twin.plot(t, [x["cpu_percent"] for x in samples], color="gray", lw=1, ls="--", label="CPU %")
        twin.text(0.99, 0.9, "no GPU (dashed: CPU %)", transform=ax.transAxes, ha="right", va="top", fontsize=8)
        label = "CPU %"
    twin.set_ylim(0, 105)
    twin.set_ylabel(label, fontsize=8)
    if steps:
        ax.set_xlim(0, max(s["start_s"] + s["step_s"] for s in steps) * 1.01)
    ax.legend(handles=_legend_handles(), loc="upper left", fontsize=7, ncol=3)


def _legend_handles():
    from matplotlib.patches import Patch
    return [Patch(color="tab:red", label="input stall"), Patch(color="tab:blue", label="compute"),
            Patch(facecolor="white", edgecolor="gray", hatch="//", label="warm-up")]
