"""What the check before the first step costs (harness/train/model/loadable.py): the CPU seconds of
`loadable.check` on a small U-Net (the built-in one's layers, 64x64 patches of 4 bands, in each Keras; the run skips
the built-in model itself, so this is the figure for a U-Net of the user's) and on a small model of the user's
(tests/train/model/user_models/: the registered subclassed model, in each Keras), each the median of `--repeats`
checks after one to warm up. Prints one line per model.

    python tests/train/model/scripts/loadable_cost.py [--repeats 5] [--side 64]
"""
import argparse
import pathlib
import resource
import statistics
import sys
from types import MappingProxyType

MODELS = pathlib.Path(__file__).resolve().parents[1] / "user_models"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(repeats: int = 5, side: int = 64, say=print) -> dict:
    """`{name: median CPU-s}` of `loadable.check` per model (each also printed by `say`)."""
    import harness  # noqa: F401  (tf.keras resolves to tf-keras, as in every harness process)
    from harness.train.model import loadable, parts, user
    from harness.train.options import TrainOptions

    bands = ("B2", "B3", "B4", "B8")

    def inputs(shape, kind):
        return user.ModelInputs(input_shape=shape, patch_size=shape[0] if kind == "image" else None, bands=bands,
                                band_groups=MappingProxyType({}), num_classes=3, task="classification", kind=kind,
                                label_shape=shape[:2] if kind == "image" else (), policy="float32")

    cases = []
    for kind in ("tf_keras", "keras3"):
        image = inputs((side, side, 4), "image")
        unet = parts.builtin_model("image", image.input_shape, 3, mean=[0.0] * 4, variance=[1.0] * 4,
                                   keras_kind=kind)
        cases.append((f"U-Net {side}x{side}x4 ({kind})", unet, image, None))
        builder = user.resolve(TrainOptions(data=("d",), model=f"{MODELS / (kind + '_models.py')}:subclassed"))
        table = inputs((4,), "table")
        model = builder.fn(table)
        user.check_model(model, table, origin=builder.origin)
        cases.append((f"user subclassed model with a custom layer ({kind})", model, table, builder.code))
    out = {}
    for name, model, described, code in cases:
        seconds = []
        for _ in range(repeats + 1):
            start = _cpu()
            loadable.check(model, described, origin=name, code=code)
            seconds.append(_cpu() - start)
        out[name] = statistics.median(seconds[1:])
        say(f"{name}: {out[name]:.3f} CPU-s per check (median of {repeats}; first {seconds[0]:.3f})")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--side", type=int, default=64)
    args = parser.parse_args(argv)
    measure(args.repeats, args.side)
    return 0


if __name__ == "__main__":
    sys.exit(main())
