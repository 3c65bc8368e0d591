"""One dataset's shards, discovered, counted and checked once per run: `ShardSet`.

Everything downstream (the feature spec, the epoch plan, every input pipeline, the profile's facts) takes the
`ShardSet` instead of the paths, so discovery (`shards.discover_shards`), the record index (`index.record_stats`:
one stat per file, a network round trip on `gs://`) and the mixer lookup run once, however many pipelines are
built from it.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional, Sequence

from harness.data import index
from harness.data.shards import Mixer, Shard, discover_shards, find_mixer


@dataclasses.dataclass(frozen=True)
class ShardSet:
    """The shards of one dataset in shard order, with their record counts and the export's mixer.

    Attributes:
      shards: every file, in order (zero-record shards included).
      stats: `index.ShardStats` per shard (records; serialized bytes, uncompressed).
      mixer: the export's mixer.json, or None (tables, mixer-less exports).
      sources: the folders, globs or paths as given.
    """

    shards: tuple[Shard, ...]
    stats: tuple[index.ShardStats, ...]
    mixer: Optional[Mixer]
    sources: tuple[str, ...]

    @property
    def counts(self) -> list[tuple[str, int]]:
        """`(path, records)` per shard, in order: what `harness.distribute.plan.make_plan` takes."""
        return [(s.path, st.records) for s, st in zip(self.shards, self.stats)]

    @property
    def records(self) -> int:
        return sum(st.records for st in self.stats)

    def nbytes(self, paths: Optional[Iterable[str]] = None) -> int:
        """Serialized bytes of the records in `paths` (default: every shard)."""
        keep = None if paths is None else set(paths)
        return sum(st.bytes for s, st in zip(self.shards, self.stats) if keep is None or s.path in keep)


def open_shards(sources: Sequence[str], *, mixer: Optional[str] = None) -> ShardSet:
    """Discover, order and count the shards of `sources` and find their mixer: once per dataset and run.

    Raises:
      the errors of `shards.discover_shards` (nothing found, a missing index, several exports in one folder),
      `index.record_stats` (truncated or corrupt shard) and `shards.find_mixer` (a malformed mixer).
    """
    shards = discover_shards(list(sources))
    return ShardSet(shards=tuple(shards), stats=tuple(index.record_stats(shards)),
                    mixer=find_mixer(shards, mixer), sources=tuple(sources))
