"""What identifies a point of a table export, and whether Earth Engine can place it.

Earth Engine's TFRecord table export writes each feature's properties, not its geometry ("Each property of the
ee.Feature is encoded as a tf.train.Feature", developers.google.com/earth-engine/guides/tfrecord#exporting-tables):
a point keeps its location only where the user sampled it as properties (`ee.Image.pixelLonLat()` adds the bands
`longitude` and `latitude`) or copied its id (`system:index`). `harness predict` copies those properties beside the
predictions by default, and prints an `earthengine upload table` line only when the rows carry a location the
CLI's `--x_column`/`--y_column` (CSV and TFRecord tables; points in EPSG:4326 unless `--crs`) or
`--primary_geometry_column` can read (earthengine-api ee/cli/commands.py, `upload table`).
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

# Property names (case-insensitive) kept by default: ids, and coordinates or geometry.
IDS = ("system:index", "id", "fid", "uid", "objectid", "point_id", "plot_id", "sample_id")
LONGITUDES, LATITUDES = ("longitude", "lon", "lng", "long"), ("latitude", "lat")
GEOMETRIES = (".geo", "geo", "geometry", "wkt")
PROJECTED = ("x", "y")   # kept, but not a location the CLI reads as such (it takes x/y as EPSG:4326 by default)

NO_LOCATION = ("no upload: the rows carry no location (no longitude/latitude or .geo property in the export; "
               "Earth Engine's TFRecord table export writes properties, not geometry), so Earth Engine would make "
               "a table without geometry. Sample the coordinates with the bands (ee.Image.pixelLonLat() adds "
               "longitude and latitude) and they are kept beside the predictions, or join the table to the points "
               "by an id property kept with --keep")


def identifying(names: Iterable[str], *, exclude: Sequence[str] = ()) -> list[str]:
    """The properties among `names` that identify or locate a record, less `exclude` (the model's bands and the
    label), in the order ids (and names ending in `_id`), geometry, longitude, latitude, x, y (a property map
    has no order of its own: Example features are keyed by name)."""
    kinds = [{n.lower() for n in kind} for kind in (IDS, GEOMETRIES, LONGITUDES, LATITUDES, PROJECTED)]

    def kind(name: str) -> int:
        low = name.lower()
        return next((i for i, k in enumerate(kinds) if low in k), 0 if low.endswith("_id") else -1)

    return sorted((n for n in names if n not in exclude and kind(n) >= 0), key=lambda n: (kind(n), n.lower()))


def location_flags(columns: Sequence[str]) -> Optional[list[str]]:
    """The `earthengine upload table` flags that give the rows their location from `columns`, or None when no
    column holds one: a geometry column (`--primary_geometry_column`), else a longitude and a latitude column
    (`--x_column`, `--y_column`)."""
    lower = {c.lower(): c for c in columns}
    for name in GEOMETRIES:
        if name in lower:
            return [f"--primary_geometry_column={lower[name]}"]
    x = next((lower[n] for n in LONGITUDES if n in lower), None)
    y = next((lower[n] for n in LATITUDES if n in lower), None)
    return [f"--x_column={x}", f"--y_column={y}"] if x and y else None
