"""gs:// discovery from one listing per folder (harness/data/export/gcs.py `list_objects`, issue 62), in this process
against the tests' bucket bed (tests/gcs_bed.py: every request the proxy served is a line of `requests.log`):
TensorFlow's GCS file system and the JSON API listing both go through the bed's proxy, so the counts below are the
requests a run makes to Cloud Storage."""
import collections
import logging
import os
import urllib.parse
import uuid
from fractions import Fraction

import pytest

from harness.data.export import gcs as gcs_lib
from harness.data.export import index, shards as shards_lib, synth
from harness.data.export.source import open_shards

N = 12


@pytest.fixture
def folder(gcs, tmp_path, monkeypatch):
    """A fresh folder of the bucket (gs://bucket/<random>) and a record index of this test's own."""
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    return gcs.url(uuid.uuid4().hex[:12])


def _export(tmp_path, name, *, shards=N, seed=1, **kwargs):
    out = tmp_path / name
    synth.write_table_export(str(out), prefix="points", shards=shards, records=4 * shards, bands=["a", "b"],
                             label="class", classes=3, seed=seed, **kwargs)
    return out


def _startup(url):
    """What `harness train` reads of its training data before the first step: `open_shards` (discovery, identities,
    compressions, record counts, mixer), the spec inferred from the first shard, every shard's first record checked
    with the label rule (`inputs.prepare`'s plan half on one worker)."""
    from harness.data.spec import validate
    from harness.train.inputs import resolve_spec

    train = open_shards([url])
    spec = resolve_spec({"label": "class"}, train)
    validate.validate_shards(spec, train, labels=True)
    return train


def _run(gcs, url):
    """(`_startup` of `url` as a fresh process makes it: the bucket probe not yet made; the requests it made)."""
    gcs_lib.reset()
    before = len(gcs.requests())
    train = _startup(url)
    return train, gcs.requests()[before:]


def _per_object(requests, url) -> collections.Counter:
    """Requests per object under `url` (its name, as TensorFlow and the JSON API escape it: `/` as %2F)."""
    bucket, _, name = url[len("gs://"):].partition("/")
    quoted = urllib.parse.quote(name + "/", safe="")
    out = collections.Counter()
    for r in requests:
        path = r.split()[2].split("?")[0]
        if quoted in path:
            out[urllib.parse.unquote(path.rsplit("/", 1)[-1]).rsplit("/", 1)[-1]] += 1
    return out


def test_a_first_run_costs_one_request_a_shard_and_a_second_run_a_constant(gcs, folder, tmp_path):
    """12 GZIP shards on gs://. The first run makes 12 + 3 = 15 requests:
      1  the bucket probe (`gcs.check`: GET storage/v1/b/bucket, once a process);
      1  the listing of the folder (`gcs.list_objects`: sizes and `updated` times of every object; no stat, no
         folder test per object, the mixer candidates looked up in it);
      1  the first 12 bytes of the first shard: the export's compression, taken for every shard not in the record
         index (`source._compressions`), which each shard's count verifies;
      per shard 1: its read to the end (the count, `index.record_stats`), which keeps its first records
         (`index.Found`: 16 of the first shard for the spec, record 0 of the others for the checks), so neither
         the spec's inference nor `validate_shards` asks for any.
    Before: 3 x 12 + 3 = 39 (a sniff, the count, a first-record read per shard; the first shard's spec read 2
    more: its own sniff, then the read), and before issue 62's listing 4 x 12 + 8 = 56.
    The second run makes 3, whatever the number of shards: the probe, the listing, and the first shard's 16
    records for the spec (one read, its compression from the index: no sniff); every count, compression and check
    of a shard comes from the record index under its identity. Before: 4; before the listing 2 x 12 + 9 = 33.
    An object rewritten (another `updated` and generation) is another identity: 2 requests more than a second
    run (its sniff, the guess of its export's compression, then its count), its count and compression new.
    Every identity from the listing equals TensorFlow's `tf.io.gfile.stat` one (`index.file_identity`)."""
    local = _export(tmp_path, "export")
    url = f"{folder}/export"
    gcs.upload_tree(str(local), url)
    names = [f"points-{i:05d}.tfrecord.gz" for i in range(N)]

    first, got = _run(gcs, url)
    assert len(got) == N + 3, "\n".join(got)
    assert _per_object(got, url) == {**{n: 1 for n in names}, names[0]: 2}, "\n".join(got)
    assert [r.split()[2].split("?")[0] for r in got if r.startswith("GET www.googleapis.com")] == \
        ["/storage/v1/b/bucket", "/storage/v1/b/bucket/o"]                     # the probe, one listing
    assert first.counts == [(f"{url}/{n}", 4) for n in names]
    kept = index._load(os.path.join(os.environ["HARNESS_CACHE_DIR"], index.INDEX_NAME))
    assert [kept[k]["compression"] for k in first.identities] == ["GZIP"] * N

    second, got = _run(gcs, url)
    assert len(got) == 3 and _per_object(got, url) == {names[0]: 1}, "\n".join(got)
    assert second.identities == first.identities and second.counts == first.counts

    replacement = _export(tmp_path, "other", shards=2, seed=5, compressed=False)   # 4 records, uncompressed
    gcs.put(f"{url}/{names[5]}", (replacement / "points-00001.tfrecord").read_bytes())
    third, got = _run(gcs, url)
    assert len(got) == 3 + 2 and _per_object(got, url) == {names[0]: 1, names[5]: 2}, "\n".join(got)
    assert third.identities[5] != first.identities[5] and third.identities[:5] == first.identities[:5]
    assert third.shards[5].compression == "" and third.counts[5] == (f"{url}/{names[5]}", 4)

    # the listing's identities are TensorFlow's stat's (`updated` with microseconds here: the float conversion)
    assert list(third.identities) == [index.file_identity(f"{url}/{n}") for n in names]
    assert gcs_lib.counts()["fallbacks"] == 0


def test_a_glob_and_a_file_named_alone_are_listed_the_mixer_looked_up_in_the_listing(gcs, folder, tmp_path):
    """A glob is one listing of every object under its part before the wildcard (the mixer beside the shards
    included: no request for it but its read, one request: `shards.read_whole`, where TensorFlow's GFile made two,
    a stat and the read); a file named alone is one object lookup; what they find is what TensorFlow's glob and
    stat find."""
    local = tmp_path / "scene"
    synth.write_image_export(str(local), prefix="scene", shards=3, records=6, bands=["B1"], label=None,
                             patch_size=4, seed=3)
    url = f"{folder}/scene"
    gcs.upload_tree(str(local), url)
    gcs.put(f"{url}/sub/scene-00000.tfrecord.gz", (local / "scene-00000.tfrecord.gz").read_bytes())  # not matched
    gcs_lib.reset()
    before = len(gcs.requests())
    listed = gcs_lib.Listings()
    found = shards_lib.discover_shards([f"{url}/*.tfrecord.gz"], listed=listed)
    mixer = shards_lib.find_mixer(found, listed=listed)
    got = gcs.requests()[before:]
    import tensorflow as tf

    assert [s.path for s in found] == sorted(tf.io.gfile.glob(f"{url}/*.tfrecord.gz"))
    assert mixer is not None and mixer.total_patches == 6
    listing = [r for r in got if r.startswith("GET www.googleapis.com /storage/v1/b/bucket/o?")]
    assert len(listing) == 1 and "delimiter" not in listing[0], got
    assert _per_object(got, url) == {**{s.path.rsplit("/", 1)[1]: 1 for s in found}, "scene-mixer.json": 1}, got
    assert index.identities(found, listed=listed) == [index.file_identity(s.path) for s in found]

    before = len(gcs.requests())
    alone = gcs_lib.Listings()
    assert [s.path for s in shards_lib.discover_shards([found[1].path], listed=alone)] == [found[1].path]
    assert list(alone.objects) == [found[1].path]
    lookups = [r for r in gcs.requests()[before:] if r.startswith("GET www.googleapis.com")]
    assert [r.split()[2].split("?")[0].rsplit("/", 1)[1] for r in lookups] == \
        ["o", urllib.parse.quote(found[1].path[len("gs://bucket/"):], safe="")], lookups   # folder test, lookup
    with pytest.raises(shards_lib.ShardDiscoveryError, match="does not exist"):
        shards_lib.discover_shards([f"{url}/nothing.tfrecord.gz"])
    with pytest.raises(shards_lib.ShardDiscoveryError, match="matches only folders"):
        shards_lib.discover_shards([f"{url}/su*"])


@pytest.mark.parametrize("token", [None, "refused-token"])
def test_without_a_token_or_when_the_api_refuses_discovery_goes_tensorflows_way_counted_and_logged_once(
        gcs, folder, tmp_path, monkeypatch, caplog, token):
    """No token at hand (as with a key file, whose token TensorFlow signs itself) or the JSON API refusing it (the
    bed answers 401): the listing is not used; TensorFlow lists and stats as before, the same shards and
    identities, and the fallback is counted (`gcs.counts`) and logged once however many listings fell back."""
    local = _export(tmp_path, "export", shards=3)
    url = f"{folder}/export"
    gcs.upload_tree(str(local), url)
    want = open_shards([url])
    gcs_lib.reset()
    gcs_lib.check([url])   # the bucket probe passed with the bed's token; the listings get `token`
    monkeypatch.setattr(gcs_lib, "_token_expiring", lambda *a: (token, 3600.0 if token else 0.0))
    with caplog.at_level(logging.WARNING, logger="harness.data.export.gcs"):
        got = open_shards([url])
        again = open_shards([f"{url}/*.tfrecord.gz"])
    assert got.identities == again.identities == want.identities and got.counts == want.counts
    assert gcs_lib.counts()["fallbacks"] == 2
    warned = [r.getMessage() for r in caplog.records if "JSON API's listing is unavailable" in r.getMessage()]
    assert len(warned) == 1, warned
    assert ("no access token at hand" if token is None else "HTTP 401") in warned[0]


def test_a_listing_is_read_page_by_page(monkeypatch):
    """Pages of LIST_PAGE objects: the request for the next names the previous answer's nextPageToken (the emulator
    of the bed answers in one page, so the paging is checked on stand-in answers)."""
    pages = {None: {"items": [{"name": "d/a", "size": "3", "updated": "2024-01-02T03:04:05.678Z",
                               "generation": "7"}], "prefixes": ["d/sub/"], "nextPageToken": "p2"},
             "p2": {"items": [{"name": "d/b", "size": "5", "updated": "2024-01-02T03:04:06Z", "generation": "8"}]}}
    asked = []

    def get_json(url, api_url, environ):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(api_url).query)
        asked.append(query)
        return pages[query.get("pageToken", [None])[0]]

    monkeypatch.setattr(gcs_lib, "_get_json", get_json)
    objects, folders = gcs_lib.list_objects("gs://b/d/")
    assert [(o.path, o.size, o.generation) for o in objects] == [("gs://b/d/a", 3, 7), ("gs://b/d/b", 5, 8)]
    assert folders == ["gs://b/d/sub/"]
    assert [q.get("pageToken") for q in asked] == [None, ["p2"]]
    assert all(q["maxResults"] == ["1000"] and q["delimiter"] == ["/"] and q["prefix"] == ["d/"] for q in asked)
    assert asked[0]["fields"] == ["items(name,size,updated,generation),prefixes,nextPageToken"]


def test_updated_is_converted_as_tensorflows_stat_converts_it():
    """TensorFlow reads the seconds into a C float (time_util.cc `ParseRfc3339Time`): 24.896 s is 24.8959999 s,
    and the fraction times 1e9 is rounded to a float again, so the nanoseconds end in ...936, not ...000; 59.999999 s
    is the float 60.0, which timegm carries into the next minute (here the next day: 2024-03-01)."""
    assert gcs_lib.rfc3339_ns("2016-04-29T23:15:24.896Z") == 1461971724_895999936
    assert gcs_lib.rfc3339_ns("1970-01-01T00:00:00Z") == 0
    assert gcs_lib.rfc3339_ns("2024-02-29T23:59:59.999999Z") == 1709251200 * 10**9
    assert gcs_lib._f32(Fraction("0.1")) == Fraction(13421773, 2**27)                # float(0.1f)
    with pytest.raises(ValueError):
        gcs_lib.rfc3339_ns("yesterday")


def test_a_second_run_sniffs_no_shard_whose_identity_the_index_holds(tmp_path, monkeypatch):
    """Local as on gs://: the compression found by the first run is in each shard's index entry; the second run
    reads no first bytes; a rewritten shard (another size and mtime) is sniffed again."""
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    local = _export(tmp_path, "export", shards=4)
    sniffed = []
    sniff = shards_lib.sniff_compression
    monkeypatch.setattr(shards_lib, "sniff_compression", lambda path: sniffed.append(path) or sniff(path))
    first = open_shards([str(local)])
    assert len(sniffed) == 4
    del sniffed[:]
    assert open_shards([str(local)]).shards == first.shards and sniffed == []
    other = _export(tmp_path, "other", shards=2, seed=4, compressed=False)
    os.replace(other / "points-00000.tfrecord", local / "points-00002.tfrecord.gz")
    third = open_shards([str(local)])
    assert sniffed == [str(local / "points-00002.tfrecord.gz")] and third.shards[2].compression == ""
    assert [s.compression for s in third.shards] == ["GZIP", "GZIP", "", "GZIP"]


def test_first_records_not_kept_by_the_count_cost_one_request_each_and_a_long_one_two(gcs, folder, tmp_path,
                                                                                      monkeypatch):
    """Where the counting read keeps no first record (its HEADS_KEPT_BYTES passed: 0 here; or the count came from
    the index), the checks read each shard's record 0 from one read of its head (`records.first_records`: 256 KiB,
    one request) and the spec the first shard's 16 records (one request): a first run of 12 shards then makes
    12 + 3 + 12 = 27. A record 0 longer than the head read (300 KB here, uncompressed or GZIP of random bytes)
    costs one request more, where TensorFlow's 256 KiB buffer made one per 256 KiB; the records are TensorFlow's."""
    import numpy as np
    import tensorflow as tf

    from harness.data.export import records

    local = _export(tmp_path, "export")
    url = f"{folder}/export"
    gcs.upload_tree(str(local), url)
    monkeypatch.setattr(index, "HEADS_KEPT_BYTES", 0)
    first, got = _run(gcs, url)
    assert len(got) == 2 * N + 3 and _per_object(got, url) == {**{n.rsplit("/", 1)[1]: 2 for n, _ in first.counts},
                                                               first.shards[0].path.rsplit("/", 1)[1]: 3}, got

    rng = np.random.default_rng(7)
    long, short = rng.bytes(300_000), rng.bytes(1000)
    shards = []
    for gz in (False, True):
        for name, head in (("long", long), ("short", short)):
            path = tmp_path / f"{name}{int(gz)}.tfrecord"
            with tf.io.TFRecordWriter(str(path), "GZIP" if gz else "") as w:
                for r in (head, short, long):
                    w.write(r)
            shards.append(shards_lib.Shard(f"{folder}/{path.name}", "", None, "GZIP" if gz else ""))
            gcs.put(shards[-1].path, path.read_bytes())
    before = len(gcs.requests())
    assert list(records.first_records(shards)) == [(0, long), (1, short), (2, long), (3, short)]
    assert _per_object(gcs.requests()[before:], folder) == {"long0.tfrecord": 2, "short0.tfrecord": 1,
                                                            "long1.tfrecord": 2, "short1.tfrecord": 1}


def test_an_export_compressed_otherwise_than_its_first_shard_is_counted_right(gcs, folder, tmp_path):
    """Shard 3 of a GZIP export uncompressed (under its .gz name): the export's compression, taken from shard 0's
    first bytes, is refuted by shard 3's count read, which sniffs it and counts it again (requests beyond the N + 3:
    the shards the failed pipeline had read, read again one by one, and shard 3's sniff); its compression is found
    and kept in the index, so the second run makes 3 requests as for any export."""
    local = _export(tmp_path, "export")
    other = _export(tmp_path, "other", shards=2, seed=5, compressed=False)
    os.replace(other / "points-00001.tfrecord", local / "points-00003.tfrecord.gz")
    url = f"{folder}/export"
    gcs.upload_tree(str(local), url)
    first, got = _run(gcs, url)
    assert [s.compression for s in first.shards] == ["GZIP"] * 3 + [""] + ["GZIP"] * (N - 4)
    assert first.counts == [(f"{url}/points-{i:05d}.tfrecord.gz", 4) for i in range(N)]
    assert N + 3 < len(got) <= 2 * N + 6, "\n".join(got)
    second, got = _run(gcs, url)
    assert len(got) == 3 and second.shards == first.shards, "\n".join(got)
