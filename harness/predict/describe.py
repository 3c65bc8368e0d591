"""`harness inspect` of a `harness predict` output folder: the predictions read as what they are (the run that
made them, the export they map, the bands written, and each map's size, CRS and class counts), not as an export
to train on. The maps are read by `harness.predict.maps` (the one home of the map formats)."""
from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import tensorflow as tf

from harness.predict import maps as maps_lib
from harness.predict.writer import MANIFEST


def describe(paths: Sequence[str]) -> Optional[dict]:
    """The predictions in `paths` when it is one predict output folder (it holds `predict.json`), else None.

    Returns:
      {"folder", "model_sha256", "source": [[input shard name, records], ...], "bands": the model's input bands,
       "options": the predict options that name the run, "outputs": the TFRecord/CSV files, "maps": [one dict per
       GeoTIFF: "file", "width", "height" (pixels), "crs", "bands" (band descriptions), "dtype", "overviews"
       (decimation factors), and for a class map "class_counts" {class name: pixels}, "nodata" (the value the map
       declares) and "nodata_pixels" (pixels holding it)]}.
    """
    if len(paths) != 1:
        return None
    folder = str(paths[0]).rstrip("/")
    manifest_path = os.path.join(folder, MANIFEST)
    if not tf.io.gfile.isdir(folder) or not tf.io.gfile.exists(manifest_path):
        return None
    with tf.io.gfile.GFile(manifest_path) as f:
        manifest = json.load(f)
    maps = maps_lib.describe_maps(folder)   # the map first
    return {"folder": folder, "model_sha256": manifest["model_sha256"], "source": manifest["data"],
            "bands": manifest["bands"], "options": manifest["options"], "outputs": manifest["outputs"],
            "maps": maps}


def format_text(pred: dict) -> str:
    """What `harness inspect` prints of `describe`'s result."""
    records = sum(n for _, n in pred["source"])
    lines = [f"predictions (predict.json): model sha256 {pred['model_sha256'][:12]}..., bands "
             f"{', '.join(pred['bands'])}; {records} records of {len(pred['source'])} input shard(s) "
             f"({pred['source'][0][0]}{', ...' if len(pred['source']) > 1 else ''})"]
    for m in pred["maps"]:
        lines.append(f"  map {m['file']}: {m['width']} x {m['height']} pixels, {m['crs']}, {m['dtype']} bands "
                     f"{', '.join(b or '?' for b in m['bands'])}, overviews {m['overviews'] or 'none'}")
        if "class_counts" in m:
            total = sum(m["class_counts"].values()) or 1
            lines.append("    pixels per class: " + ", ".join(f"{n} {c} ({100 * c / total:.1f}%)"
                                                              for n, c in m["class_counts"].items()) +
                         f"; nodata (value {m['nodata']}, declared in the map): {m['nodata_pixels']} pixels")
    return "\n".join(lines)
