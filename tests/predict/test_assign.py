"""Each worker's contiguous run of shards (`harness.distribute.sharding.contiguous_runs`)."""
import pytest

from harness.distribute.sharding import contiguous_runs


@pytest.mark.parametrize("counts, workers, expected", [
    ([5, 5, 5, 4, 4], 1, [range(0, 5)]),
    ([5, 5, 5, 4, 4], 2, [range(0, 2), range(2, 5)]),
    ([5, 5, 5, 4, 4], 3, [range(0, 2), range(2, 3), range(3, 5)]),
    ([10, 0, 0, 1], 2, [range(0, 1), range(1, 4)]),
    ([3, 3], 4, [range(0), range(0, 1), range(0), range(1, 2)]),
    ([0, 0], 2, [range(0, 2), range(0)]),
])
def test_runs_are_contiguous_cover_every_shard_once(counts, workers, expected):
    runs = contiguous_runs(counts, workers)
    assert runs == expected
    assert [i for r in runs for i in r] == list(range(len(counts)))
