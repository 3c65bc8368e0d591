"""`harness train` and `harness demo`."""
from __future__ import annotations

_NOT_OPTIONS = ("command", "verbose", "config", "handler")


def options_from_args(args):
    """Merge the YAML config (`--config`: `data:` and `train:` sections) with the flags given (flags win).

    Returns:
      `(TrainOptions, data section)` (`harness.train.options.merge_options`).
    Raises:
      ConfigError: for broken YAML, unknown keys or bad values, naming them.
    """
    from harness.train.options import load_config, merge_options

    config = load_config(args.config) if getattr(args, "config", None) else {}
    given = {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in _NOT_OPTIONS}
    return merge_options(config, given)


def train(args) -> int:
    """`harness train ...` (see `harness train --help`)."""
    from harness.train import job

    options, data = options_from_args(args)
    job.run(options, data_config=data)
    return 0


def demo(args) -> int:
    """`harness demo [--output DIR] [--data-dir DIR] [--epochs N]` (`make demo`)."""
    from harness.train import demo as demo_lib

    demo_lib.run(output=args.output, data_dir=args.data_dir, epochs=args.epochs)
    return 0
