"""`harness inspect EXPORT --quicklook OUT.png` (`harness.predict.maps.export_quicklook`) against the export's size:
image exports of N patches of P x P x 3 float bands (GZIP, 4 shards) drawn at 1024 pixels a side at most.

Per size, printed: the export's pixels and bytes, the quick-look's seconds against TFRecordDataset reading the same
files alone (the read limit: the quick-look decodes every record once, so its time grows with the bytes), and its
peak memory traced by tracemalloc (numpy's arrays and Python's objects: the picture and one record at a time) beside
the mosaic a hand-written script would hold (pixels x bands x 4 bytes). The memory should stay flat as the area
grows; the time should follow the bytes.

  python benchmarks/quicklook.py [--patches 16,64,256] [--patch-size 256]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402,F401  (environment defaults before TensorFlow)
import _smoke as smoke  # noqa: E402  (benchmarks/_smoke.py, beside this script)

SMOKE = dict(patches="4,16", patch_size=32)
BANDS = ("B4", "B3", "B2")


def _read_limit(shards) -> float:
    """Seconds for TFRecordDataset to read every record of the shards (no decoding)."""
    import tensorflow as tf

    start = time.perf_counter()
    for shard in shards:
        for _ in tf.data.TFRecordDataset(shard.path, compression_type=shard.compression):
            pass
    return time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--patches", default="16,64,256", help="export sizes, patches (comma-separated)")
    p.add_argument("--patch-size", type=int, default=256, help="P, pixels")
    a = smoke.parse(p, argv, SMOKE)
    from harness.data.export import shards as S, synth
    from harness.data.spec import infer
    from harness.predict import maps

    sizes = [int(n) for n in a.patches.split(",")]
    print(f"quick-look of image exports of N patches of {a.patch_size}x{a.patch_size}x{len(BANDS)} float (GZIP, 4 "
          f"shards), at most {maps.QUICKLOOK_PIXELS} pixels a side")
    print(f"  {'patches':>8} {'pixels':>12} {'kB':>10} {'quick-look s':>13} {'read s':>8} {'ratio':>6} "
          f"{'peak MiB':>9} {'mosaic MiB':>11}")
    with tempfile.TemporaryDirectory(prefix="harness-bench-quicklook-") as tmp:
        warm = os.path.join(tmp, "warm")   # imports (matplotlib) and TensorFlow's first reads out of the figures
        synth.write_image_export(warm, prefix="img", shards=1, records=1, bands=BANDS, label=None, patch_size=8)
        warm_shards = S.discover_shards([warm])
        maps.export_quicklook(warm_shards, S.find_mixer(warm_shards), infer.infer_spec(
            warm_shards, mixer=S.find_mixer(warm_shards)), list(BANDS), os.path.join(tmp, "warm.png"))
        peaks = []
        for n in sizes:
            folder = os.path.join(tmp, f"n{n}")
            synth.write_image_export(folder, prefix="img", shards=min(4, n), records=n, bands=BANDS, label=None,
                                     patch_size=a.patch_size, seed=n)
            shards = S.discover_shards([folder])
            mixer = S.find_mixer(shards)
            spec = infer.infer_spec(shards, mixer=mixer)
            size_kb = sum(os.path.getsize(s.path) for s in shards) / 1e3
            read_s = _read_limit(shards)
            tracemalloc.start()
            start = time.perf_counter()
            out = maps.export_quicklook(shards, mixer, spec, list(BANDS), os.path.join(tmp, f"q{n}.png"))
            seconds = time.perf_counter() - start
            peak = tracemalloc.get_traced_memory()[1] / 2 ** 20
            tracemalloc.stop()
            peaks.append(peak)
            side = mixer.patches_per_row * a.patch_size
            rows = -(-n // mixer.patches_per_row) * a.patch_size
            mosaic = side * rows * len(BANDS) * 4 / 2 ** 20
            print(f"  {n:>8} {side * rows:>12,} {size_kb:>10,.0f} {seconds:>13.3f} {read_s:>8.3f} "
                  f"{seconds / max(read_s, 1e-9):>6.1f} {peak:>9.2f} {mosaic:>11.3f}   ({out['width']}x"
                  f"{out['height']} px, scale {out['scale']})")
        print(f"peak memory at {sizes[-1]} patches against {sizes[0]}: {peaks[-1] / max(peaks[0], 1e-9):.2f}x "
              f"({sizes[-1] // sizes[0]}x the area)")


if __name__ == "__main__":
    main()
