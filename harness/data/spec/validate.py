"""A spec checked against the shards before any training: `validate_spec` (the first record of every shard) and
`check_feature` (one feature against one record's schema)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Mapping, Optional, Sequence

import numpy as np

from harness.data.export import records
from harness.data.export.records import BYTES, EMPTY, FLOAT, INT64, FeatureInfo
from harness.data.export.shards import Shard
from harness.data.spec.dataspec import IMAGE, DataSpec, _closest
from harness.data.spec.infer import _square, _values
from harness.errors import (EmptyFeatureError, FeatureDtypeError, FeatureLengthError, MissingFeatureError,
                            SchemaDriftError, SpecError, SpecMismatchError)

log = logging.getLogger(__name__)


# The version of the checks below: part of every `check_digest`, so that a change to what they check makes every
# shard's first record read and checked again, whatever the record index remembers.
CHECKS_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ValidationReport:
    """Result of validate_spec: shards checked (first record), zero-record shards skipped (not an error), and
    shards not read because they passed the same checks in an earlier run (`passed_before`: their identity in the
    record index with this `check_digest`)."""

    checked: tuple[str, ...]
    empty: tuple[str, ...]
    passed_before: int = 0
    by_other_workers: int = 0


def check_digest(spec: DataSpec, labels: bool) -> str:
    """16 hex digits naming the checks of `validate_shards`: CHECKS_VERSION, the spec (`to_config`: features,
    dtypes, sizes, label rule) and whether the label rule is checked. A shard whose identity (path, size,
    modification time) passed a digest's checks passes them again without a read (`index.passed`)."""
    text = json.dumps({"checks": CHECKS_VERSION, "spec": spec.to_config(), "labels": labels}, sort_keys=True,
                      default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _side_text(n: int) -> str:
    side = _square(n)
    return f" ({n} = {side}x{side})" if side and n > 1 else ""


def check_feature(spec: DataSpec, name: str, schema: Mapping[str, FeatureInfo],
                  where: str) -> Optional[SpecMismatchError]:
    """The mismatch between the declared feature `name` and one record's schema, or None if it matches.

    `where` names the file and record ("path: record 0").
    """
    expected_dtype, n = spec.dtype_of(name), spec.values_of(name)
    role = "label" if name == spec.label else "band"
    if spec.sequence and name in schema and spec.is_array(name):
        return _check_steps(spec, name, schema[name], where)
    if name not in schema:
        hint = _closest(name, list(schema))
        return MissingFeatureError(f"{where}: {role} {name!r} declared but absent; " +
                                   (f"closest available key: {hint!r}" if hint else f"available: {list(schema)}"))
    info = schema[name]
    if info.dtype == EMPTY or info.length == 0 or (info.dtype == BYTES and info.nbytes == 0):
        return EmptyFeatureError(f"{where}: {role} {name!r} is present but holds no values "
                                 f"(expected {expected_dtype}, {n} values)")
    if spec.sequence and info.sequence:
        return FeatureLengthError(f"{where}: {role} {name!r}: expected one value in the SequenceExample's context, "
                                  f"found a feature list of {info.length} steps (declare its depth: "
                                  f"depths: {{{name}: {info.length}}})")
    if info.dtype != expected_dtype:
        note = ""
        if role == "label" and expected_dtype == INT64 and info.dtype == FLOAT:
            note = ("; Earth Engine stores every number as float (class 3 as 3.0): declare the label 'float', "
                    "the harness casts it to int32")
        return FeatureDtypeError(f"{where}: {role} {name!r}: expected dtype {expected_dtype}, found "
                                 f"{info.dtype}{note}")
    found = _values(info)
    if info.dtype == BYTES and info.length != 1:
        return FeatureLengthError(f"{where}: {role} {name!r}: expected one bytes string of {n} bytes, found "
                                  f"{info.length} strings")
    if found != n:
        unit = "bytes" if info.dtype == BYTES else "values"
        planes = spec.feature_depth(name)
        depth = (f" x {planes} planes ({'collapsed ' + ', '.join(spec.collapsed[name]) if name in spec.collapsed else 'depth ' + str(planes)})"
                 if spec.is_array(name) else "")
        if spec.kind == IMAGE:
            declared = f"{n} {unit} ({spec.stored_size}x{spec.stored_size} patch: P={spec.patch_size} + " \
                       f"margin {spec.kernel_margin}{depth})"
        else:
            declared = f"{n} value{'s' if n != 1 else ''} (table{depth})"
        return FeatureLengthError(f"{where}: {role} {name!r}: expected {declared}, found {found} "
                                  f"{unit}{_side_text(found)}")
    return None


def _check_steps(spec: DataSpec, name: str, info: FeatureInfo, where: str) -> Optional[SpecMismatchError]:
    """A sequence record's feature list: one value per step, at most `depth` steps (shorter ones are padded with
    0, Earth Engine's default value, as tensorDepths pads)."""
    depth = spec.feature_depth(name)
    if not info.sequence:
        return FeatureLengthError(f"{where}: band {name!r}: expected a feature list of up to {depth} steps (an "
                                  f"array band of a SequenceExample), found {info.length} value(s) in the context")
    if info.dtype not in (EMPTY, spec.dtype_of(name)) and info.length:
        return FeatureDtypeError(f"{where}: band {name!r}: expected dtype {spec.dtype_of(name)}, found {info.dtype}")
    if info.length > depth:
        return FeatureLengthError(f"{where}: band {name!r}: expected up to {depth} steps (depth {depth}), found "
                                  f"{info.length}: declare depths: {{{name}: {info.length}}}")
    if info.nbytes > 1:
        return FeatureLengthError(f"{where}: band {name!r}: expected one value per step, found {info.nbytes}")
    return None


def validate_spec(spec: DataSpec, shards: Sequence[Shard], *, read=None, heads=None, each=None,
                  passed: Sequence[Shard] = ()) -> ValidationReport:
    """Check the spec against the first record of every shard, before any training.

    Also a cheap framing check of each shard (its first record is read with its compression). `read`: the first
    records' reader, as infer_spec's, one shard at a time; `heads`: instead, `(shard, record 0 or None)` for every
    shard in order (`ShardSet.heads`: one parallel pass, one record held at a time; what every caller with a
    `ShardSet` gives); `each`: `fn(shard, record 0)` called on each shard's record as it is checked (the label
    check: `labels.check_record`), so that the records are read once. `passed`: shards not in `heads` because
    they passed these checks before (they count as matching shards: a shard that differs is schema drift).

    Returns:
      a ValidationReport; zero-record shards are listed there and logged, not an error.

    Raises:
      MissingFeatureError: a declared feature is absent (the message names the closest key: `Landcover` vs
        `landcover`).
      FeatureDtypeError: stored with another dtype (e.g. label declared int64 but stored float).
      FeatureLengthError: another number of values (e.g. 256 values where a 4x4 patch was declared).
      EmptyFeatureError: present but empty.
      SchemaDriftError: a declared feature matches in some shards and not in others (message lists both).
      CompressionMismatchError, NotTFRecordError, TruncatedShardError, NotExampleError: bad shard framing/content.
      SpecError: if every shard is empty.
    """
    problems: dict[str, list[tuple[Shard, SpecMismatchError]]] = {f: [] for f in spec.features}
    good: dict[str, list[tuple[Shard, FeatureInfo]]] = {f: [] for f in spec.features}
    checked, empty = [], []
    if heads is None:
        heads = ((s, next(iter((read or records.first_examples)(s, 1)), None)) for s in shards)
    for shard, example in heads:
        if example is None:
            empty.append(shard.path)
            continue
        checked.append(shard.path)
        schema = records.schema_of(example)
        fine = True
        for f in spec.features:
            err = check_feature(spec, f, schema, f"{shard.path}: record 0")
            if err is None:
                good[f].append((shard, schema[f]))
            else:
                problems[f].append((shard, err))
                fine = False
        if each is not None and fine:
            each(shard, example)
    if empty:
        log.warning("%d zero-record shard(s) skipped (counted, not an error): %s", len(empty), ", ".join(empty))
    if not checked and not passed:
        raise SpecError(f"all {len(shards)} shard(s) hold zero records")
    for f in spec.features:
        if not problems[f]:
            continue
        shard, err = problems[f][0]
        matched = [s for s, _ in good[f]] + list(passed)
        if not matched:
            raise err
        raise SchemaDriftError(f"shards differ for feature {f!r}: {len(matched)} shard(s) match the spec (e.g. "
                               f"{matched[0].path}) but {len(problems[f])} do not; first: {err}")
    return ValidationReport(tuple(checked), tuple(empty), len(passed))


def validate_shards(spec: DataSpec, shards, *, labels: bool = False, split=None) -> ValidationReport:
    """`validate_spec` over a `ShardSet`'s first records, read in one parallel pass (`ShardSet.heads`), with
    `labels` the label rule checked on each shard's record 0 as it passes and on the first 16 records of the first
    shard holding any (`labels.check_first_labels`): every check of the first records in one read of them.

    A shard whose identity (`ShardSet.identities`: path, size, modification time) passed the same checks in an
    earlier run (`check_digest`, remembered in the record index: `index.passed`) is not read again: a second run
    of 10,000 unchanged shards reads one (the first, which the spec's inference reads anyway). The shards that
    pass here are remembered (with `labels`, for the checks without the label rule too).

    `split` (`index.Split`, every worker calling this at the same point): worker r reads the first records of the
    shards r::N not passed before, and the workers' verdicts are gathered (one value each), so a job of N workers
    reads each head once, not N times. Every worker gathers exactly once, whatever its own record index holds
    (workers that read their indexes at other moments may skip other shards: the collectives may not depend on
    it). When any worker's share fails, every worker checks every shard, so each
    raises the same named error (the data are the same) rather than waiting for one that stopped.

    Raises:
      the errors of `validate_spec` and, with `labels`, LabelValueError naming the shard and record.
    """
    from harness.data.export import index
    from harness.data.spec import labels as labels_lib

    each = (lambda shard, ex: labels_lib.check_record(spec, f"{shard.path}: record 0", ex)) if labels else None
    digest, keys = check_digest(spec, labels), list(shards.identities)
    n = len(shards.shards)
    skip = index.passed(keys, digest) if keys else [False] * n
    gathered = split is not None and split.workers > 1   # then every worker gathers, whatever its index holds:
    others = [False] * n                                 # the collectives may not depend on a worker's own files
    if gathered:
        others = [not skip[i] and i % split.workers != split.rank for i in range(n)]
    local = [a or b for a, b in zip(skip, others)]
    assumed = [s for s, st, a in zip(shards.shards, shards.stats, local) if a and st.records]

    def check(skipped, passed):
        return validate_spec(spec, list(shards.shards), heads=shards.heads(skipped), each=each, passed=passed)

    if not gathered:
        report = check(skip, assumed)
    else:
        try:
            report, failed = check(local, assumed), None
        except Exception as e:   # noqa: BLE001  (told to the others, then raised by every worker alike)
            report, failed = None, e
        verdicts = split.gather([0.0 if failed is not None else 1.0])
        if failed is not None or float(np.min(verdicts)) < 1.0:
            check(skip, [s for s, st, done in zip(shards.shards, shards.stats, skip) if done and st.records])
            if failed is not None:
                raise failed
            raise SpecError("another worker's check of the first records failed (see its log); every shard "
                            "passed here")
    report = dataclasses.replace(report, passed_before=sum(skip), by_other_workers=sum(others))
    if labels:
        first = next(s for s, st in zip(shards.shards, shards.stats) if st.records > 0)   # validate_spec: one exists
        labels_lib.check_first_labels(spec, [first], read=shards.first_examples)
    if keys and not all(skip):
        index.mark_passed([k for k, done in zip(keys, skip) if not done],
                          [digest] + ([check_digest(spec, False)] if labels else []))
    return report
