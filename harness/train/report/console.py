"""What the chief prints of a run: one line per epoch."""
from __future__ import annotations

from harness.choices import EPOCH_METRICS

EPOCH_KEYS = EPOCH_METRICS[1:]   # the loss is printed first


def format_epoch(logs: dict, epochs: int) -> str:
    """One line per epoch: `epoch 2/5 step 40: loss 0.41 val_loss 0.45 val_accuracy 0.83 (1200 records) | 812
    examples/s, input stall 3.1%`, and under loss scaling `, 3 updates skipped, loss scale 16384`."""
    parts = [f"epoch {logs['epoch']}/{epochs} step {logs['step']}: loss {logs['loss']:.4f}"]
    for key in EPOCH_KEYS:
        if key in logs:
            parts.append(f"{key} {logs[key]:.4f}")
    if "val_records" in logs:
        parts.append(f"({logs['val_records']} records)")
    line = " ".join(parts) + (f" | {logs['examples_per_s']:.1f} examples/s, "
                              f"input stall {100 * logs['input_stall_share']:.1f}%")
    if "skipped_updates" in logs:
        line += f", {logs['skipped_updates']} updates skipped, loss scale {logs['loss_scale']:g}"
    return line


class EpochLines:
    """The controller's action that prints `format_epoch` on the chief after each epoch's evaluation."""

    def __init__(self, context, epochs: int):
        self.is_chief, self.epochs = context.is_chief, epochs

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        if self.is_chief:
            print(format_epoch(logs, self.epochs), flush=True)
