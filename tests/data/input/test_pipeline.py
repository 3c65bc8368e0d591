import logging

import numpy as np
import pytest
import tensorflow as tf

from harness.data.input import pipeline as P, augment, stages
from harness.data.export import shards as S
from harness.data.spec import infer as SP
from harness.errors import BatchSizeError


@pytest.fixture(scope="module")
def image(image_export):
    found = S.discover_shards(str(image_export))
    return found, SP.infer_spec(found, mixer=S.find_mixer(found))


@pytest.fixture(scope="module")
def table(table_export):
    found = S.discover_shards(str(table_export))
    return found, SP.infer_spec(found)


def _build(found, spec, batch, *, input_pipeline_id=0, num_input_pipelines=1, **options):
    """P.build_dataset with PipelineOptions(per_replica_batch_size=batch, **options)."""
    return P.build_dataset(found, spec, stages.PipelineOptions(per_replica_batch_size=batch, **options),
                           input_pipeline_id=input_pipeline_id, num_input_pipelines=num_input_pipelines)

def _all(ds):
    return [tf.nest.map_structure(lambda t: t.numpy(), b) for b in ds]


def test_image_shapes_dtypes_and_crop(image):
    found, spec = image
    (x, y), = _all(_build(found, spec, 10, training=False))
    assert x.shape == (10, 12, 12, 3) and x.dtype == np.float32 and y.shape == (10, 12, 12) and y.dtype == np.int32
    (xc, yc), = _all(_build(found, spec.replace(crop_margin=True), 10, training=False))
    np.testing.assert_array_equal(xc, x[:, 2:10, 2:10])  # rows/cols [k/2, k/2 + P]
    np.testing.assert_array_equal(yc, y[:, 2:10, 2:10])
    (xr, yr), = _all(_build(found, spec.replace(resize=24), 10, training=False))
    assert xr.shape == (10, 24, 24, 3) and yr.shape == (10, 24, 24)
    np.testing.assert_array_equal(yr[:, ::2, ::2], y)  # nearest neighbour keeps the mask's classes in place


def test_band_groups_dict_and_time(image):
    found, spec = image
    grouped = spec.replace(bands=(), band_groups={"t0": ("B2",), "t1": ("B3",), "t2": ("B4",)})
    (x, _), = _all(_build(found, grouped, 10, training=False))
    (flat, _), = _all(_build(found, spec, 10, training=False))
    assert set(x) == {"t0", "t1", "t2"} and x["t1"].shape == (10, 12, 12, 1)
    np.testing.assert_array_equal(x["t2"][..., 0], flat[..., 2])
    (xt, _), = _all(_build(found, grouped.replace(group_delivery="time"), 5, training=False))[:1]
    assert xt.shape == (5, 3, 12, 12, 1)


def test_table_real_points_labels_int32(shared_data):
    found = S.discover_shards(str(shared_data / "gee-aces-points/testing.tfrecord.gz"))
    spec = SP.infer_spec(found)
    batches = _all(_build(found, spec, 100, training=False))
    assert len(batches) == 13 and [len(b[1]) for b in batches[-2:]] == [100, 19]   # every record, the last partial
    x, y = batches[0]
    assert x.shape == (100, 8) and x.dtype == np.float32 and y.shape == (100,) and y.dtype == np.int32
    assert set(np.unique(np.concatenate([b[1] for b in batches]))) <= {0, 1, 2, 3, 4}


def test_vectorized_and_per_record_parse_agree(image, monkeypatch):
    found, spec = image
    a = _all(_build(found, spec, 5, training=False))
    monkeypatch.setattr(stages, "VECTORIZE_MAX_RECORD_BYTES", 0)
    b = _all(_build(found, spec, 5, training=False))
    (xa, ya), (xb, yb) = [(np.concatenate([x for x, _ in r]), np.concatenate([y for _, y in r])) for r in (a, b)]
    ia, ib = np.argsort(xa[:, 0, 0, 0]), np.argsort(xb[:, 0, 0, 0])  # the interleave order may differ
    np.testing.assert_array_equal(xa[ia], xb[ib])
    np.testing.assert_array_equal(ya[ia], yb[ib])


def _ids(batches):
    return [round(float(v), 6) for x, _ in batches for v in x[:, 0]]


@pytest.mark.parametrize("pipelines", [2, 3])  # 2 files: by file for 2, by record for 3
def test_input_pipelines_split_records_once(table, pipelines):
    found, spec = table
    every = sorted(_ids(_all(_build(found, spec, 1, training=False))))
    parts = [_ids(_all(_build(found, spec, 1, training=False, input_pipeline_id=i, num_input_pipelines=pipelines)))
             for i in range(pipelines)]
    assert sorted(sum(parts, [])) == every and len(every) == 64


def test_evaluation_is_deterministic(table):
    found, spec = table
    assert _ids(_all(_build(found, spec, 8, training=False))) == \
        _ids(_all(_build(found, spec, 8, training=False)))


def test_records_per_epoch_keeps_first_n_of_each_epoch(table, caplog):
    caplog.set_level(logging.INFO)
    found, spec = table
    ds = _build(found, spec, 8, training=True, records_per_epoch=40, seed=0, cache="none")
    ids = _ids(_all(ds.take(15)))  # 3 epochs of 5 steps: training repeats forever
    epochs = [ids[i:i + 40] for i in range(0, 120, 40)]
    assert all(len(set(e)) == 40 for e in epochs)  # no record twice within an epoch
    assert epochs[0] != epochs[1]  # reshuffled each epoch
    assert "24 of this input pipeline's 64 records are read and dropped each epoch" in caplog.text
    with pytest.raises(BatchSizeError, match="exceeds"):
        _build(found, spec, 8, training=True, records_per_epoch=65)


def _has_filter(ds) -> bool:
    return b"FilterDataset" in ds._as_serialized_graph().numpy()


@pytest.mark.parametrize("batch", [8, 7])  # 64 records: every record kept (8), or the last 64 % 7 = 1 dropped (7)
def test_one_worker_epoch_keeps_every_whole_batch_without_a_filter(table, batch, caplog):
    """One input pipeline keeping every whole batch of its records: each epoch holds 64 // batch batches of
    distinct records, reshuffled (the dropped remainder too), cut by batch(drop_remainder) alone, with no
    per-batch keep test (enumerate + filter) in the graph."""
    caplog.set_level(logging.INFO)
    found, spec = table
    keep = 64 // batch * batch
    ds = _build(found, spec, batch, training=True, records_per_epoch=keep, seed=1, cache="memory")
    assert not _has_filter(ds)
    ids = _ids(_all(ds.take(3 * (64 // batch))))
    epochs = [ids[i:i + keep] for i in range(0, 3 * keep, keep)]
    every = set(_ids(_all(_build(found, spec, 1, training=False))))
    assert all(len(set(e)) == keep and set(e) <= every for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    if keep < 64:
        assert len({frozenset(every - set(e)) for e in epochs}) > 1  # another record dropped each epoch
        assert f"{64 - keep} of this input pipeline's 64 records are read and dropped each epoch" in caplog.text
    partial = _build(found, spec, 8, training=True, records_per_epoch=40, seed=1, cache="memory")
    assert _has_filter(partial)  # fewer than every whole batch: the first 5 of 8 are kept by the filter


def test_record_sharding_trains_on_parsed_read_batches_exactly_once(table):
    """3 pipelines over 2 files shard by record: each pipeline's epoch holds distinct records, the pipelines'
    epochs are disjoint, and a pipeline reshuffles its own records each epoch."""
    found, spec = table
    shards = [set(_ids(_all(_build(found, spec, 1, training=False, input_pipeline_id=i, num_input_pipelines=3))))
              for i in range(3)]
    assert sorted(map(len, shards)) == [21, 21, 22] and len(set().union(*shards)) == 64
    for i in range(3):
        ds = _build(found, spec, 4, training=True, records_per_epoch=20, seed=5, input_pipeline_id=i,
                    num_input_pipelines=3)
        ids = _ids(_all(ds.take(10)))  # 2 epochs of 5 steps
        assert len(set(ids[:20])) == len(set(ids[20:])) == 20 and ids[:20] != ids[20:]
        assert set(ids) <= shards[i]  # only this pipeline's records: disjoint from the others'


def test_augment_moves_image_and_mask_together(image):
    found, spec = image
    x = np.random.default_rng(0).normal(size=(16, 12, 12, 5)).astype(np.float32)
    y = x.argmax(-1).astype(np.int32)  # the mask is a per-pixel function of the bands
    xa, ya = augment.augment_batch(spec, tf.constant(x), tf.constant(y), tf.constant([1, 2], tf.int64))
    xa, ya = xa.numpy(), ya.numpy()
    np.testing.assert_array_equal(ya, xa.argmax(-1))
    for i in range(16):  # each example is one of the 8 flips/rotations of its input
        variants = [np.rot90(v, k) for v in (x[i], x[i][:, ::-1]) for k in range(4)]
        assert any(np.array_equal(xa[i], v) for v in variants)
    assert not np.array_equal(xa, x)


def test_augment_time_stacked_groups(image):
    found, spec = image
    grouped = spec.replace(bands=(), band_groups={"t0": ("B2", "B3"), "t1": ("B4", "B8")}, group_delivery="time")
    x = np.random.default_rng(1).normal(size=(8, 2, 12, 12, 2)).astype(np.float32)
    y = x[:, 1].argmax(-1).astype(np.int32)
    xa, ya = augment.augment_batch(grouped, tf.constant(x), tf.constant(y), tf.constant([3, 4], tf.int64))
    np.testing.assert_array_equal(ya.numpy(), xa.numpy()[:, 1].argmax(-1))


def test_training_dataset_augments_and_repeats(image):
    found, spec = image
    ds = _build(found, spec.replace(crop_margin=True), 4, training=True, augment=True, seed=1)
    batches = _all(ds.take(6))  # 24 > 10 records: repeats
    assert all(x.shape == (4, 8, 8, 3) and y.shape == (4, 8, 8) for x, y in batches)


def test_cache_choice_and_file_cache(table, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    assert stages.choose_cache("auto", 10, cache_dir=None, name="n", available=1000).kind == "memory"
    c = stages.choose_cache("auto", 900, cache_dir=str(tmp_path), name="n", available=1000)
    assert c.kind == "file" and c.path == str(tmp_path / "n") and "exceed" in c.reason
    assert stages.choose_cache("auto", 900, cache_dir=None, name="n", available=1000).kind == "none"
    found, spec = table
    ds = _build(found, spec, 8, training=False, cache="file", cache_dir=str(tmp_path / "c"))
    assert len(_all(ds)) == 8 and list((tmp_path / "c").iterdir())
    assert "cache: file" in caplog.text


def _cache_indexes(folder) -> list:
    """The finished tf.data file caches in folder (one `<name>.index` each)."""
    return sorted(p.name for p in folder.glob("harness-*.index"))


def test_file_cache_of_a_reexport_reads_the_new_records(tmp_path):
    """Issue 11.1: the same file names re-exported with other records, the same cache_dir: the second read gets
    the new records (uncompressed, same record count: same sizes; rewritten within a second: only the
    nanosecond mtime tells the files apart)."""
    from harness.data.export import synth
    export, cache = tmp_path / "export", tmp_path / "cache"

    def read(seed):
        synth.write_table_export(str(export), prefix="points", shards=2, records=64, compressed=False, seed=seed)
        found = S.discover_shards(str(export))
        spec = SP.infer_spec(found)
        cached = _all(_build(found, spec, 8, training=False, cache="file", cache_dir=str(cache)))
        fresh = _all(_build(found, spec, 8, training=False, cache="none"))
        return cached, fresh

    first, _ = read(seed=1)
    second, fresh = read(seed=2)
    assert len(second) == len(fresh) == 8
    for (x, y), (fx, fy) in zip(second, fresh):
        np.testing.assert_array_equal(x, fx)
        np.testing.assert_array_equal(y, fy)
    assert not np.array_equal(first[0][0], second[0][0])
    assert len(_cache_indexes(cache)) == 2


def test_file_cache_name_follows_the_spec_and_the_pipeline_version(table, tmp_path, monkeypatch):
    found, spec = table
    cache = tmp_path / "cache"

    def build(spec):
        _all(_build(found, spec, 8, training=False, cache="file", cache_dir=str(cache)))
        return _cache_indexes(cache)

    one = build(spec)
    assert build(spec) == one and len(one) == 1  # same inputs: the cache is reused
    two = build(spec.replace(bands=spec.bands[:2]))
    assert len(two) == 2
    monkeypatch.setattr(P, "PIPELINE_VERSION", P.PIPELINE_VERSION + 1)
    assert len(build(spec)) == 3


def test_eval_smaller_than_batch_is_one_partial_batch(table):
    """64 records, batch 100: the whole pass is one batch of 64 (every record scored once, issue 19 item 6)."""
    found, spec = table
    batches = list(_build(found, spec, 100, training=False))
    assert [int(b[1].shape[0]) for b in batches] == [64]


def test_build_checks_the_spec_before_any_batch(image):
    from harness.errors import MissingFeatureError
    found, spec = image
    with pytest.raises(MissingFeatureError, match="'LandCover'.*closest available key: 'landcover'"):
        _build(found, spec.replace(label="LandCover"), 2, training=True)


def test_read_batch_size_follows_record_bytes(monkeypatch):
    monkeypatch.setattr(stages, "READ_BATCH_BYTES", 256 * 1024)
    assert stages.read_batch_size(220) == 256 * 1024 // 220 == 1191  # the point export's records
    assert stages.read_batch_size(1) == stages.READ_BATCH_MAX
    assert stages.read_batch_size(60_000) == 4 and stages.read_batch_size(2_000_000) == 1


@pytest.mark.parametrize("read_batch", [1, 5, 32, 4096])  # 32 records per file: partial read batches at file ends
def test_read_batches_yield_every_record_once_in_one_order(table, monkeypatch, read_batch):
    found, spec = table
    reference = _ids(_all(_build(found, spec, 1, training=False)))
    monkeypatch.setattr(stages, "READ_BATCH_BYTES", float("inf"))
    monkeypatch.setattr(stages, "READ_BATCH_MAX", read_batch)
    ids = _ids(_all(_build(found, spec, 7, training=False)))
    assert len(ids) == 64 and set(ids) == set(reference)  # 9 batches of 7, then 1: every record once
    assert ids == _ids(_all(_build(found, spec, 7, training=False)))


@pytest.mark.parametrize("max_records, cached", [(10 ** 6, "UnbatchDataset"), (63, "ParallelMapDataset")])
def test_memory_cache_of_parsed_read_batches_reshuffles_each_epoch(table, monkeypatch, max_records, cached):
    """Records cached (up to MEMORY_CACHE_MAX_RECORDS: no unbatch each epoch) or read batches (above it): every
    record once per epoch, reshuffled."""
    found, spec = table
    monkeypatch.setattr(stages, "READ_BATCH_BYTES", float("inf"))
    monkeypatch.setattr(stages, "READ_BATCH_MAX", 5)
    every = sorted(_ids(_all(_build(found, spec, 1, training=False))))
    monkeypatch.setattr(stages, "MEMORY_CACHE_MAX_RECORDS", max_records)  # the table's pipeline holds 64 records
    ds = _build(found, spec, 8, training=True, cache="memory", seed=3)
    assert _cache_input_op(ds).startswith(cached)
    ids = _ids(_all(ds.take(24)))  # 3 epochs of 64 records
    epochs = [ids[i:i + 64] for i in range(0, 192, 64)]
    assert all(sorted(e) == every for e in epochs)  # the cache returns every record once per epoch
    assert epochs[0] != epochs[1] != epochs[2]


def test_color_jitter_closed_form_inputs_only():
    """Brightness scales every band by b, contrast moves each image band around its spatial mean by c, with
    (b − 1, c − 1) = (0.2, 0.5) × the stateless uniform draws of the seed; tables get brightness alone."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(3, 4, 4, 2)).astype(np.float32)
    seed = tf.constant([5, 6], tf.int64)
    u = tf.random.stateless_uniform([3, 2], seed=seed, minval=-1.0, maxval=1.0).numpy()
    b, c = 1 + 0.2 * u[:, 0], 1 + 0.5 * u[:, 1]
    scaled = x * b[:, None, None, None]
    mean = scaled.mean(axis=(1, 2), keepdims=True)
    want = mean + c[:, None, None, None] * (scaled - mean)
    got = augment.color_jitter(tf.constant(x), seed, brightness=0.2, contrast=0.5).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, x)
    rows = rng.normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_allclose(augment.color_jitter(tf.constant(rows), seed, brightness=0.2, contrast=0.5).numpy(),
                               rows * b[:, None], rtol=1e-6)


def test_training_dataset_jitters_inputs_not_labels(image):
    """The 10 records in one training batch, matched to the evaluation pass by their (untouched) masks: the bands
    are changed, by a brightness factor within [0.7, 1.3] of their mean (contrast keeps the mean)."""
    found, spec = image
    spec = spec.replace(crop_margin=True)
    (x, y), = _all(_build(found, spec, 10, training=False))
    (xj, yj), = _all(_build(found, spec, 10, training=True, seed=1, cache="none", brightness=0.3,
                            contrast=0.3).take(1))
    index = {m.tobytes(): i for i, m in enumerate(y)}
    assert len(index) == 10 and sorted(index) == sorted(m.tobytes() for m in yj)  # the same masks, unchanged
    for xe, ye in zip(xj, yj):
        xo = x[index[ye.tobytes()]]
        assert not np.allclose(xe, xo)
        assert 0.7 - 1e-5 < xe.mean() / xo.mean() < 1.3 + 1e-5


def _cache_input_op(ds) -> str:
    """The op of the dataset node feeding the cache in `ds`'s graph."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef.FromString(ds._as_serialized_graph().numpy())
    nodes = {n.name: n for n in graph.node}
    cache = next(n for n in graph.node if n.op.startswith("CacheDataset"))
    return nodes[cache.input[0].split(":")[0]].op


def test_cached_large_records_are_parsed_before_the_cache(image, monkeypatch):
    """Large records cached: parsed once into the cache (later epochs parse nothing), each record once per epoch,
    reshuffled; the same tensors as the uncached pipeline, which parses only the records kept."""
    found, spec = image
    monkeypatch.setattr(stages, "VECTORIZE_MAX_RECORD_BYTES", -1)  # every record "large": parse per record
    cached = _build(found, spec, 2, training=True, records_per_epoch=10, cache="memory", seed=4)
    assert _cache_input_op(cached).startswith("ParallelMapDataset") and not _has_filter(cached)
    batches = _all(cached.take(10))  # 2 epochs of 5 steps
    flat = [x.tobytes() for b in batches for x in b[0]]
    assert len(set(flat[:10])) == len(set(flat[10:])) == 10 and flat[:10] != flat[10:]
    uncached = _all(_build(found, spec, 2, training=False, cache="none"))
    assert set(flat[:10]) == set(flat[10:]) == {x.tobytes() for b in uncached for x in b[0]}


@pytest.mark.parametrize("cache", ["memory", "none"])
def test_an_epoch_read_again_from_its_number_is_in_the_same_order_past_the_batches_skipped(table, cache):
    """A run resumed inside epoch 2 after 3 of its 5 batches (first_epoch 1, skip_batches 3) draws the batches the
    uninterrupted run drew from its 9th on: each epoch's order is a function of the seed and its number alone."""
    found, spec = table
    kwargs = dict(training=True, records_per_epoch=40, seed=7, cache=cache)
    whole = _ids(_all(_build(found, spec, 8, **kwargs).take(15)))   # epochs 1-3, 5 batches each
    resumed = _ids(_all(_build(found, spec, 8, first_epoch=1, skip_batches=3, **kwargs).take(7)))
    assert resumed == whole[8 * 8:]
    assert all(len(set(whole[i:i + 40])) == 40 for i in (0, 40, 80)) and whole[40:80] != whole[:40]  # reshuffled


@pytest.mark.parametrize("cache", ["memory", "none"])
def test_a_global_seed_set_by_the_model_file_leaves_the_epochs_order_as_it_was(table, cache):
    """`keras.utils.set_random_seed(0)` at the top of a model file (as the Keras guides write it) made TensorFlow
    compare the epoch's tensor seed to 0 in Python: OperatorNotAllowedInGraphError before the first step. With any
    global seed the epochs are drawn in the order drawn without one (the order is the harness's seed's alone)."""
    found, spec = table
    kwargs = dict(training=True, records_per_epoch=40, seed=7, cache=cache)
    unseeded = _ids(_all(_build(found, spec, 8, **kwargs).take(10)))
    try:
        for seed in (0, 5):
            tf.random.set_seed(seed)
            assert _ids(_all(_build(found, spec, 8, **kwargs).take(10))) == unseeded, seed
    finally:
        tf.random.set_seed(None)


def test_the_pipeline_is_sized_by_the_workers_resources(table):
    """The worker's CPUs (harness.distribute.resources) set the files read at once and tf.data's autotuning
    budget (default: every core of the host); its memory the cache='auto' budget."""
    from harness.distribute import resources

    found, spec = table
    one = resources.combine(local_size=2, host_cpus=8, affinity_cpus=2, cgroup_cpus=None,
                            host_available_bytes=1000, cgroup_memory=(None, None))  # 1 CPU, 500 bytes each
    plan = P.plan_pipeline(found, spec, stages.PipelineOptions(per_replica_batch_size=8, training=True, cache="auto"),
                           resources=one)
    assert (plan.parallel_reads, plan.cpu_budget, plan.cache.kind) == (1, 1, "none")
    assert "of memory and no --cache-dir" in plan.cache.reason
    options = P.apply_plan(plan, spec).options()
    assert options.autotune.cpu_budget == 1 and options.threading.private_threadpool_size is None   # a share
    assert plan.describe().endswith("prefetch: autotune, tf.data autotuning within 1 CPU")


def test_a_pod_limited_to_one_cpu_runs_one_map_call_at_a_time(table):
    """tf.data's cpu_budget alone let an AUTOTUNE map run one call per core (tensorflow/tensorflow#62821): the
    plan of a worker in a pod limited to 1 CPU of 2 ran 2 calls at once; its thread limit holds it to 1."""
    import os
    import threading
    import time

    from harness.distribute import resources

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one schedulable core: nothing to hold back")
    lock, calls = threading.Lock(), {"now": 0, "most": 0}

    def work(i):
        with lock:
            calls["now"] += 1
            calls["most"] = max(calls["most"], calls["now"])
        time.sleep(0.02)
        with lock:
            calls["now"] -= 1
        return i

    def most_at_once(cgroup_cpus):
        calls["most"] = 0
        pod = resources.combine(local_size=1, host_cpus=2, affinity_cpus=2, cgroup_cpus=cgroup_cpus,
                                host_available_bytes=10 ** 9)
        plan = P.plan_pipeline(*table, stages.PipelineOptions(per_replica_batch_size=8, training=False), resources=pod)
        ds = tf.data.Dataset.range(32).map(lambda i: tf.numpy_function(work, [i], tf.int64),
                                           num_parallel_calls=tf.data.AUTOTUNE)
        for _ in P._prefetch(ds, plan):
            pass
        return calls["most"]

    assert most_at_once(1) == 1 and most_at_once(None) == 2
    assert resources.quota_threads(resources.combine(local_size=2, host_cpus=8, affinity_cpus=8, cgroup_cpus=None,
                                                     host_available_bytes=1)) is None   # a share, not a limit
