"""`harness demo` (`make demo`): the main job on embedded default data.

Writes a synthetic Earth Engine image export if absent (10 shards of 64x64 patches with a kernel margin of 8,
4 float bands, a `landcover` label, GZIP, mixer.json), then trains the U-Net with MirroredStrategy over 2 logical
CPU replicas on shards 0-7 and validates on shards 8-9 (the last rows of the export's grid: a spatial hold-out),
cropping the margin, printing the plan, a line per epoch and a summary, and writes the run's `report.html`.
"""
from __future__ import annotations

import glob
import os
import shutil

from harness.data.export import synth
from harness.train import job
from harness.train.options import TrainOptions

RECORDS, SHARDS, VALIDATION_SHARDS = 960, 10, 2


def ensure_data(data_dir: str) -> tuple[list[str], list[str]]:
    """Write the demo export under `data_dir` unless present; returns the training and validation shards."""
    if not glob.glob(os.path.join(data_dir, "demo-mixer.json")):
        synth.write_image_export(data_dir, prefix="demo", shards=SHARDS, records=RECORDS, patch_size=64,
                                 kernel_size=8, classes=4, seed=0)
        print(f"wrote {RECORDS} patches in {SHARDS} shards to {data_dir}")
    shards = sorted(glob.glob(os.path.join(data_dir, "demo-*.tfrecord.gz")))
    return shards[:-VALIDATION_SHARDS], shards[-VALIDATION_SHARDS:]


def run(*, output: str = "runs/demo", data_dir: str = "demo-data", epochs: int = 4) -> dict:
    """Write the demo export if absent and train on it from scratch; returns the job's summary."""
    from harness.distribute.strategy import make_strategy

    distribution = make_strategy("mirrored", num_cpu_replicas=2)  # before any other TensorFlow op
    train, validation = ensure_data(data_dir)
    # The demo always trains from scratch: its own output folder would otherwise resume from the last backup.
    shutil.rmtree(output, ignore_errors=True)
    options = TrainOptions(data=tuple(train), validation_data=tuple(validation), epochs=epochs,
                           per_replica_batch_size=16, strategy="mirrored", cpu_replicas=2, output=output,
                           learning_rate=3e-3)
    summary = job.run(options, data_config={"crop_margin": True}, distribution=distribution)
    from harness.train.report import page

    print(f"report: {page.write(output)} (one file, opens offline; the README's screenshot is of this page)")
    return summary
