"""The `make_bed` fixture: beds of hosts made of namespaces (bed.py), every one closed at the test's end."""
import pytest

from cluster.bed import Bed, unavailable_reason


def require_bed() -> None:
    """Skip the calling test, with the reason, where namespaces cannot be made (not root, no `ip`, ...)."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def make_bed():
    """A factory: make_bed(n, **kw) -> Bed (kw as Bed's). Skips where no bed can be made; every bed it made is
    closed when the test ends, also when it fails."""
    require_bed()
    beds = []

    def make(n: int, **kw) -> Bed:
        bed = Bed(n, **kw)
        beds.append(bed)
        return bed

    yield make
    for bed in beds:
        bed.close()
