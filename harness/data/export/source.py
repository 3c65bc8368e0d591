"""One dataset's shards, discovered, counted and checked once per run: `ShardSet`.

Everything downstream (the feature spec, the epoch plan, every input pipeline, the profile's facts) takes the
`ShardSet` instead of the paths, so discovery (`shards.discover_shards`: on `gs://` one listing per folder, which
carries each object's size and time), the files' identities (`index.identities`: from that listing, or one stat per
local file), their compression (remembered in the record index, else sniffed), the record counts
(`index.record_stats`) and the mixer lookup run once, however many pipelines are built from it.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, Optional, Sequence

from harness.data.export import gcs, index
from harness.data.export.shards import NONE, Mixer, Shard, discover_shards, find_mixer, sniff_compression
from harness.errors import TruncatedShardError

# Records of the first shard holding any read at its first look: what the spec inference (8) and the label check
# (`labels.check_first_labels`: 16) read of it, so it is read once.
FIRST_SHARD_RECORDS = 16


@dataclasses.dataclass(frozen=True)
class ShardSet:
    """The shards of one dataset in shard order, with their record counts and the export's mixer.

    Attributes:
      shards: every file, in order (zero-record shards included).
      stats: `index.ShardStats` per shard (records; serialized bytes, uncompressed).
      mixer: the export's mixer.json, or None (tables, mixer-less exports).
      sources: the folders, globs or paths as given.
      identities: `index.file_identity` per shard (path, size, modification time), taken once at discovery (on
        gs:// from its listing: `index.listed_identity`): the keys of the record index, of the checks passed
        (`index.passed`) and of the compressions found (`index.compressions`); empty when not known.
    """

    shards: tuple[Shard, ...]
    stats: tuple[index.ShardStats, ...]
    mixer: Optional[Mixer]
    sources: tuple[str, ...]
    identities: tuple[str, ...] = ()
    _heads: dict = dataclasses.field(default_factory=dict, compare=False, hash=False, repr=False)
    # {path: (its first records, serialized)} kept by the counting read (gs://: `index.Found`), each taken once
    _kept: dict = dataclasses.field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def counts(self) -> list[tuple[str, int]]:
        """`(path, records)` per shard, in order: what `harness.distribute.plan.make_plan` takes."""
        return [(s.path, st.records) for s, st in zip(self.shards, self.stats)]

    @property
    def files_with_records(self) -> list[str]:
        """The paths of the shards holding at least one record, in shard order (`sharding.files_with_records`)."""
        from harness.distribute.sharding import files_with_records
        return files_with_records(self.counts)

    def first_examples(self, shard: Shard, n: int) -> list:
        """The first `n` records of `shard` as `tf.train.Example`s (fewer if it holds fewer), read once per run
        and shared by the spec inference, `validate_spec` and `check_first_labels`: those its counting read kept
        (gs://, `index.Found`: no request), else `records.first_examples` (one read, one request on gs://). The
        first shard holding records is read FIRST_SHARD_RECORDS deep at once; a later ask for more records than
        were read reads again.

        Raises:
          the errors of `records.first_examples` (bad framing, compression, not an Example), at every ask.
        """
        from harness.data.export import records

        have = self._heads.get(shard.path)
        if have is not None and (len(have[0]) >= n or len(have[0]) < have[1]):  # enough, or the whole shard
            return have[0][:n]
        first = next((s for s, st in zip(self.shards, self.stats) if st.records > 0), None)
        asked = max(n, FIRST_SHARD_RECORDS) if first is not None and shard.path == first.path else n
        kept = self._kept.pop(shard.path, ())
        held = next((st.records for s, st in zip(self.shards, self.stats) if s.path == shard.path), None)
        if kept and len(kept) >= min(asked, held if held is not None else asked):
            examples = records.decode_examples(kept[:asked], shard.path)
        else:
            examples = records.first_examples(shard, asked)
        self._heads[shard.path] = (examples, asked)
        return examples[:n]

    def heads(self, skip: Sequence[bool] = ()) -> Iterator[tuple[Shard, Optional[object]]]:
        """`(shard, its record 0 as a tf.train.Example or SequenceExample)` for every shard in order, None for a
        zero-record shard (known from the counts: not read): what `validate_spec` and the label check read of
        each shard. Those the counting read kept (gs://, `index.Found`) are taken (once) without a read; the others
        read in one parallel pass (`records.first_records`: one request each on gs://), one record held at a time;
        the first shard holding records from `first_examples` (read once). `skip[i]` true: shard i is neither
        read nor yielded (its checks passed in an earlier run: `index.passed`).

        Raises:
          the errors of `records.first_records` and `records.decode_example`, naming the shard and record 0.
        """
        from harness.data.export import records

        skip = list(skip) or [False] * len(self.shards)
        first = next((i for i, st in enumerate(self.stats) if st.records > 0), None)
        rest = [i for i, st in enumerate(self.stats) if st.records > 0 and i != first and not skip[i]
                and self.shards[i].path not in self._kept]
        read = records.first_records([self.shards[i] for i in rest])
        for i, (shard, st) in enumerate(zip(self.shards, self.stats)):
            if skip[i]:
                continue
            if st.records == 0:
                yield shard, None
            elif i == first:
                yield shard, self.first_examples(shard, 1)[0]
            elif shard.path in self._kept:
                yield shard, records.decode_example(self._kept.pop(shard.path)[0], path=shard.path, index=0)
            else:
                j, raw = next(read, (None, None))
                if j is None or rest[j] != i:
                    raise TruncatedShardError(f"{shard.path}: record 0 could not be read, yet the shard was counted "
                                              f"with {st.records} record(s): it changed while the run started")
                yield shard, records.decode_example(raw, path=shard.path, index=0)

    @property
    def records(self) -> int:
        return sum(st.records for st in self.stats)

    def nbytes(self, paths: Optional[Iterable[str]] = None) -> int:
        """Serialized bytes of the records in `paths` (default: every shard)."""
        keep = None if paths is None else set(paths)
        return sum(st.bytes for s, st in zip(self.shards, self.stats) if keep is None or s.path in keep)


def open_shards(sources: Sequence[str], *, mixer: Optional[str] = None, split: Optional[index.Split] = None,
                tally: Optional[dict] = None) -> ShardSet:
    """Discover, order and count the shards of `sources` and find their mixer: once per dataset and run.

    Requests to a bucket (gs://), measured on the tests' bed (tests/data/export/test_gcs_listing.py): one listing
    page per 1000 objects of each folder (no stat per object: sizes and times come from the listing); per shard
    not in the record index under its identity, its read to the end (the count), which also keeps its first
    records for the checks (`index.Found`: the first shard's FIRST_SHARD_RECORDS, record 0 of the others); its
    compression is not sniffed but taken from the first such shard of its export (its first 12 bytes: one request
    per export), and a read that refutes it sniffs that shard and counts it again. A shard in the index costs no
    request. The mixer candidates are looked up in the listing, the mixer read in one request.

    `split`: the job's workers count a share each (`index.record_stats`: every worker must call this at the same
    point); `tally`: filled with what the counting did (`index.record_stats`) and its seconds ("seconds").

    Raises:
      the errors of `shards.discover_shards` (nothing found, a missing index, several exports in one folder;
      CompressionMismatchError excepted: no compression is declared here),
      `index.record_stats` (truncated or corrupt shard) and `shards.find_mixer` (a malformed mixer).
    """
    import time

    listed, keys = gcs.Listings(), []

    def remembered(found):   # identities from the listing (gs://) or a local stat; compressions from the index
        keys.extend(index.identities(found, listed=listed))
        return _compressions(found, keys)

    shards = discover_shards(list(sources), listed=listed, remembered=remembered)
    if len(keys) != len(shards):   # a discovery that did not ask (a stand-in): identities taken here
        keys[:] = index.identities(shards, listed=listed)
    start = time.perf_counter()
    found = index.Found(deep=shards[0].path, depth=FIRST_SHARD_RECORDS)
    stats = index.record_stats(shards, split=split, tally=tally, keys=keys, found=found)
    if tally is not None:
        tally["seconds"] = time.perf_counter() - start
    shards = [dataclasses.replace(s, compression=found.compressions.get(s.path, s.compression)) for s in shards]
    return ShardSet(shards=tuple(shards), stats=tuple(stats), mixer=find_mixer(shards, mixer, listed=listed),
                    sources=tuple(sources), identities=tuple(keys), _kept=found.heads)


def _compressions(shards: Sequence[Shard], keys: Sequence[str]) -> list[Optional[str]]:
    """Each shard's compression as discovery takes it (None: sniffed from its first bytes, a request each on
    gs://): the one the record index remembers under its identity; for a gs:// object the index does not hold
    (to be counted), "" when it is empty, else the sniffed compression of the first such object of its export
    (prefix), which the counting read verifies (`index.Found`: a refuted guess costs that shard a sniff and a
    second read)."""
    guesses: dict = {}
    out = []
    for shard, key, entry in zip(shards, keys, index.lookup(keys)):
        known = index.compression_of(entry)
        if known is None and entry is None and gcs.is_gcs(shard.path):
            if index.size_of(key) == 0:
                known = NONE
            else:
                if shard.prefix not in guesses:
                    guesses[shard.prefix] = sniff_compression(shard.path)
                known = guesses[shard.prefix]
        out.append(known)
    return out
