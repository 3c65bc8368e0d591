"""The `data:` section of a run config read value by value: each value checked for type and range, errors naming
`data.<key>` (`DataSpec.from_config` and `refine` build a spec from them)."""
from __future__ import annotations

import math
import numbers
from typing import Mapping, Optional, Sequence

from harness.data.export.records import BYTES, FLOAT, INT64
from harness.errors import SpecError

DTYPES = (FLOAT, INT64, BYTES)

_CONFIG_KEYS = frozenset({"kind", "bands", "label", "dtype", "dtypes", "patch_size", "kernel_margin", "crop_margin",
                          "resize", "band_groups", "group_delivery", "num_classes", "task",
                          "ignore_label", "class_names", "depths", "collapsed", "sequence", "input_nodata",
                          "input_fill"})


def _got(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def _count(config: Mapping, key: str, *, minimum: int) -> Optional[int]:
    """config[key] as an int >= minimum, or None when absent or null. YAML `true` is refused: bool is an int."""
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise SpecError(f"data.{key}: expected {expected}, got {_got(value)}")
    return int(value)


def _number(config: Mapping, key: str) -> Optional[float]:
    """config[key] as a finite int or float, or None when absent or null (YAML `true` is refused)."""
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise SpecError(f"data.{key}: expected a finite number, got {_got(value)}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _choice(config: Mapping, key: str, allowed: Sequence[str], default: str) -> str:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or value not in allowed:
        raise SpecError(f"data.{key}: expected one of {', '.join(allowed)}; got {_got(value)}")
    return value


def _flag(config: Mapping, key: str) -> bool:
    value = config.get(key, False)
    if not isinstance(value, bool):
        raise SpecError(f"data.{key}: expected true or false, got {_got(value)}")
    return value


def _label(value) -> Optional[str]:
    if value is not None and (not isinstance(value, str) or not value):
        raise SpecError(f"data.label: expected a feature name (a string), got {_got(value)}")
    return value


def _names(value, where: str, what: str = "band") -> tuple[str, ...]:
    """A list of band (or class) names; a bare string is refused rather than split into characters."""
    leaf = where.rpartition(".")[2]
    if isinstance(value, str):
        raise SpecError(f"data.{where}: expected a list of {what} names, got {_got(value)}; write {leaf}: [{value}]")
    if not isinstance(value, (list, tuple)):
        raise SpecError(f"data.{where}: expected a list of {what} names, got {_got(value)}")
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name:
            raise SpecError(f"data.{where}[{i}]: expected a {what} name (a string; quote names YAML reads as "
                            f"numbers), got {_got(name)}")
    return tuple(value)


def _mapping(value, key: str, what: str) -> Mapping:
    """A config value that must be a mapping: {} when absent, else SpecError naming `data.<key>` and `what`."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"data.{key}: expected a mapping {what}, got {_got(value)}")
    return value


def _band_groups(value) -> dict[str, tuple[str, ...]]:
    value = _mapping(value, "band_groups", "group: [bands]")
    return {str(g): _names(b, f"band_groups.{g}") for g, b in value.items()}


def _depths(value) -> dict[str, int]:
    value = _mapping(value, "depths", "band: depth (tensorDepths)")
    for name, d in value.items():
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
            raise SpecError(f"data.depths.{name}: expected a positive integer, got {_got(d)}")
    return {str(n): int(d) for n, d in value.items()}


def _collapsed(value) -> dict[str, tuple[str, ...]]:
    value = _mapping(value, "collapsed", "feature: [bands] (collapseBands)")
    return {str(f): _names(b, f"collapsed.{f}") for f, b in value.items()}


def _fills(value) -> dict[str, float]:
    value = _mapping(value, "input_fill", "channel: value")
    return {str(c): _number(value, c) for c in value}


def _dtypes(value) -> dict[str, str]:
    value = _mapping(value, "dtypes", "feature: dtype")
    for name, dt in value.items():
        if not isinstance(dt, str) or dt not in DTYPES:
            raise SpecError(f"data.dtypes.{name}: expected one of {', '.join(DTYPES)}; got {_got(dt)}")
    return {str(n): dt for n, dt in value.items()}
