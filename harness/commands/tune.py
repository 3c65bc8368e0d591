"""`harness tune`: probe the input pipeline's stages on your data, decide its levers, write a run config."""
from __future__ import annotations

from harness.commands.args import POSITIVE, command
from harness.commands.train import _NOT_OPTIONS, train_args


_TUNE_ONLY = ("write", "workers", "probe_records")


def _check_writable(path: str) -> None:
    """Raises ConfigError naming `--write PATH` when its folder does not exist or cannot be written."""
    import os

    from harness.errors import ConfigError

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"--write {path}: the folder {folder} does not exist (create it, or give another path); "
                          "checked before probing")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ConfigError(f"--write {path}: cannot be written here (permissions); checked before probing")


def tune(args) -> int:
    """`harness tune --data PATH [train options] [--write FILE]` (`harness.train.job.tune`: the tuner of
    `harness train --tune`)."""
    from harness.train import job
    from harness.train.measure.tune import config_text
    from harness.train.options import DATA_FLAGS, load_config, merge_options

    _check_writable(args.write)   # before the probes: a bad path loses nothing
    config = load_config(args.config) if getattr(args, "config", None) else {}
    given = {k: v for k, v in vars(args).items()
             if not k.startswith("_") and k not in _NOT_OPTIONS and k not in _TUNE_ONLY}
    options, data = merge_options(config, given)
    decision, _ = job.tune(options, data, workers=args.workers, records=args.probe_records)
    train = dict(config.get("train") or {})
    train.update({k: v for k, v in given.items() if k not in DATA_FLAGS})
    shown = decision.levers_set()
    for key, value in decision.train_options().items():
        if key in train and train[key] != value:
            print(f"tune: {key} {train[key]!r} was given; the config written sets the tuned {shown[key]!r}")
    with open(args.write, "w") as f:
        f.write(config_text(decision, train, data))
    print(f"config: {args.write} (harness train --config {args.write})")
    return 0


def add_parsers(sub) -> None:
    """`harness tune`."""
    p = command(sub, "tune", tune,
                "Probe each input stage on your data, decide the pipeline's levers and write a config for train",
                usage="%(prog)s --data EXPORT [--label NAME] [--write tune.yaml] [train's options]")
    train_args(p)
    p.add_argument("--write", default="tune.yaml", metavar="FILE", help="the run config written")
    p.add_argument("--workers", type=POSITIVE, default=1, help="training workers, one per host (each reads its share)")
    p.add_argument("--probe-records", type=POSITIVE, default=256, help="records each stage's probe reads")
