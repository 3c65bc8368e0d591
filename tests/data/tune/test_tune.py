"""`harness.data.tune.levers`: every decision on given stage rates, checked against figures computed by hand (no
TensorFlow)."""
import dataclasses
import math

import pytest

from harness.data.tune import model as tune_model, levers
from harness.data.input import stages
from harness.data.tune.model import BATCHES, RECORDS, StageRate
from harness.errors import ConfigError

PATCH = 65536  # bytes of one decoded 64x64x4 float32 patch


def measured(*, read=20000.0, read_bytes=30000.0, inflate=2000.0, parse_records=1000.0, decode_records=4000.0,
             parse_batches=2000.0, decode_batches=2000.0, augment=2000.0, batch=1e6, compute=500.0,
             on_cpu=True, decoded=PATCH):
    return tune_model.Measured(
        read=StageRate("read", read, read_bytes),
        inflate=StageRate("inflate", inflate, 60000.0) if inflate else None,   # parse: auto reads batches
        parse={RECORDS: StageRate("parse", parse_records, decoded), BATCHES: StageRate("parse", parse_batches, decoded)},
        decode={RECORDS: StageRate("decode", decode_records, decoded),
                BATCHES: StageRate("decode", decode_batches, decoded)},
        augment=StageRate("augment", augment, decoded) if augment else None,
        batch=StageRate("batch", batch, decoded, 1), compute=compute, compute_on_cpu=on_cpu)


def workload(**kw):
    base = dict(records=1000, files=4, batch_size=16, epochs=5, cpus=2, memory_bytes=8 * 10 ** 9)
    base.update(kw)
    return tune_model.Workload(**base)


# --- Plumber's allocation ------------------------------------------------------------------------------------
def test_allocation_shares_the_cores_by_cost_until_a_cap_binds():
    chain = [StageRate("a", 1000, 1, 1), StageRate("b", 500, 1), StageRate("c", 250, 1)]
    a = tune_model.allocate(chain, 4)       # 4 / (1/1000 + 1/500 + 1/250) = 571.4; a's cap 1000 does not bind
    assert a.rate == pytest.approx(4 / 0.007) and a.bound == "cores"
    assert a.cores == pytest.approx({"a": 4 / 7, "b": 8 / 7, "c": 16 / 7})
    a = tune_model.allocate(chain, 8)       # 8 / 0.007 = 1142.9 > 1 core x 1000: a binds
    assert a.rate == pytest.approx(1000) and a.bound == "a" and a.cores == pytest.approx({"a": 1, "b": 2, "c": 4})
    with pytest.raises(ConfigError, match="cores > 0"):
        tune_model.allocate(chain, 0)


def test_a_file_reader_reads_and_inflates_on_one_thread():
    r = tune_model.combined("read", [StageRate("read", 20000, 30000), StageRate("inflate", 5000, 66000)], max_cores=3)
    assert r.per_core == pytest.approx(4000) and r.out_bytes == 66000 and r.max_cores == 3


def test_end_to_end_on_shared_cores_adds_the_step_and_the_pipeline():
    chain = [StageRate("p", 2000, 1), StageRate("q", 2000, 1)]
    a = tune_model.allocate(chain, 2)      # 2000 examples/s
    # 2 / (2/500 + 1/1000) = 400 on the step's cores; min(500, 2000) with an accelerator
    assert tune_model.end_to_end(a, chain, 500, compute_on_cpu=True, cores=2) == pytest.approx(400)
    assert tune_model.end_to_end(a, chain, 500, compute_on_cpu=False, cores=2) == pytest.approx(500)
    assert tune_model.end_to_end(a, chain, 5000, compute_on_cpu=False, cores=2) == pytest.approx(2000)


# --- each lever ----------------------------------------------------------------------------------------------
def test_parse_placement_is_the_cheaper_parse_plus_decode():
    # records: 1/1000 + 1/4000 = 1.25 ms per example (800/s); batches: 1/2000 + 1/2000 = 1 ms (1000/s)
    c = levers.choose_parse(measured())
    assert c.value == BATCHES and "1,000 examples/s per core, one per read batch, against 800" in c.reason
    assert levers.choose_parse(measured(parse_records=4000)).value == RECORDS  # 1/4000 + 1/4000: 2000/s


def test_cache_in_memory_after_decode_before_the_random_augmentation():
    c, after = levers.decide_cache(measured(), workload(memory_bytes=200 * 10 ** 6), BATCHES)
    # 1000 x 65536 B = 65.5 MB <= 50% of 200 MB
    assert c.value == "memory" and "after decode, before augment (random): 65.5 MB" in c.reason
    assert [s.name for s in after] == ["augment", "batch"]
    c, after = levers.decide_cache(measured(augment=0), workload(memory_bytes=200 * 10 ** 6), BATCHES)
    assert c.value == "memory" and [s.name for s in after] == ["batch"]


def test_no_cache_for_one_epoch_or_without_room():
    c, after = levers.decide_cache(measured(), workload(epochs=1), BATCHES)
    assert c.value == "none" and [s.name for s in after] == ["read", "parse", "decode", "augment", "batch"]
    c, _ = levers.decide_cache(measured(), workload(memory_bytes=100 * 10 ** 6), BATCHES)  # 65.5 > 50 MB
    assert c.value == "none" and "no cache_dir" in c.reason
    c, _ = levers.decide_cache(measured(), workload(memory_bytes=100 * 10 ** 6, disk_bytes=10 ** 8), BATCHES)
    assert c.value == "none" and "free disk" in c.reason   # 65.5 MB > 50% of 100 MB


def test_file_cache_only_when_reading_it_beats_recomputing():
    w = workload(memory_bytes=100 * 10 ** 6, disk_bytes=10 ** 10)
    # cache read: 20000 x 30000 B/s per core / 65536 B = 9155 examples/s per core, beside augment and batch
    c, after = levers.decide_cache(measured(), w, BATCHES)
    assert c.value == "file" and after[0].name == "cache read"
    assert after[0].per_core == pytest.approx(20000 * 30000 / PATCH)
    # a slow disk read (100 x 30000 B/s per core / 65536 B: 45.8 examples/s per core, 2 cores: 92/s) against a
    # cheap recompute (the reader at 100/s per core, 2 cores: 200/s; the rest 10^6/s)
    slow = measured(read=100, inflate=10 ** 6, parse_batches=10 ** 6, decode_batches=10 ** 6, augment=10 ** 6)
    c, after = levers.decide_cache(slow, w, BATCHES)
    assert c.value == "none" and after[0].name == "read"
    assert "a file cache would read at 92 examples/s, recomputing gives 200" in c.reason


def test_parallel_reads_are_the_readers_cores_rounded_up_within_the_files():
    first = tune_model.Allocation(rate=1000, cores={"read": 2.3, "parse": 1}, bound="cores")
    fill = tune_model.Allocation(rate=1500, cores={"read": 3.4, "parse": 1.5}, bound="cores")
    assert levers.decide_reads([first], workload(files=8)).value == 3
    assert levers.decide_reads([first], workload(files=2)).value == 2
    assert levers.decide_reads([first, fill], workload(files=8)).value == 4   # the buffer's fill: 3.4 cores
    assert "3.40 cores at 1,500 examples/s" in levers.decide_reads([first, fill], workload(files=8)).reason
    low = tune_model.Allocation(rate=1, cores={"read": 0.2}, bound="cores")
    assert levers.decide_reads([low], workload()).value == 1


def test_an_epoch_through_a_full_shuffle_buffer_fills_then_drains():
    up = [StageRate("read", 1000, 1, 1), StageRate("decode", 1000, 1)]
    down = [StageRate("batch", 4000, 1, 1)]
    # whole chain on 2 cores: min(2 / (1/1000 + 1/1000 + 1/4000), caps 1000, 4000) = 888.9; the fill alone:
    # min(2 / (2/1000), 1000) = 1000; the drain alone: min(2 / (1/4000), 4000) = 4000
    whole = 2 / (2 / 1000 + 1 / 4000)
    assert tune_model.epoch_rate(up, down, 2, 100, 0) == pytest.approx(whole)
    # B = N = 100: 100/1000 + 100/4000 = 0.125 s -> 800/s
    assert tune_model.epoch_rate(up, down, 2, 100, 100) == pytest.approx(800)
    # B = 40 of 100: 40/1000 + 60/888.9 + 40/4000 = 0.1175 s
    assert tune_model.epoch_rate(up, down, 2, 100, 40) == pytest.approx(100 / (0.04 + 60 / whole + 0.01))
    assert tune_model.epoch_rate(up, down, 2, 100, 500) == pytest.approx(800)       # a buffer beyond the epoch: B = N
    assert tune_model.epoch_rate([], down, 2, 100, 100) == pytest.approx(4000)      # a cached epoch: the drain alone
    with pytest.raises(ConfigError, match="records >= 1"):
        tune_model.epoch_rate(up, down, 2, 0, 0)
    # a fresh iterator's start of 75 ms runs before any record: the fill takes 0.075 + max(100 x (1/1000 + 1/1000)
    # / 2, 100 / 1000 (the read's cap)) = 0.175 s, the drain 0.025 s: 100 / 0.2 s = 500/s
    assert tune_model.epoch_rate(up, down, 2, 100, 100, start_s=0.075) == pytest.approx(500)
    # the reader alone above the buffer, capped at one core: the start still comes first, though a core is idle
    # (0.05 + max(0.1 / 2, 0.1) = 0.15 s, then the drain's 0.025 s)
    assert tune_model.epoch_rate(up[:1], down, 2, 100, 100, start_s=0.05) == pytest.approx(100 / 0.175)
    assert tune_model.epoch_rate(up[:1], down, 2, 100, 100, start_s=0.15) == pytest.approx(100 / 0.275)
    # no buffer: the start before the whole chain's phase, 0.1 + max(100 x 0.00225 / 2, 0.1, 0.025) = 0.2125 s
    assert tune_model.epoch_rate(up, down, 2, 100, 0, start_s=0.1) == pytest.approx(100 / 0.2125)
    with pytest.raises(ConfigError, match="start >= 0"):
        tune_model.epoch_rate(up, down, 2, 100, 100, start_s=-0.01)
    with pytest.raises(ConfigError, match="a stage"):
        tune_model.epoch_rate([], [], 2, 100, 100)


def test_the_pipelines_start_is_paid_once_in_the_first_epoch():
    w = workload(memory_bytes=200 * 10 ** 6, shuffle_buffer=1000)
    base = levers.decide(measured(), w)
    started = levers.decide(dataclasses.replace(measured(), start_s=0.12), w)
    # the start runs before any record, whatever binds the fill: the first epoch's seconds grow by the start, the
    # later epochs' do not; the levers stay
    assert w.records / started.first_epoch == pytest.approx(w.records / base.first_epoch + 0.12)
    assert started.steady == pytest.approx(base.steady) and started.levers == base.levers


def test_read_batches_are_split_into_records_above_the_shuffle_buffer():
    m = dataclasses.replace(measured(), unbatch=StageRate("unbatch", 5000, PATCH, 1))
    w = workload(memory_bytes=200 * 10 ** 6, shuffle_buffer=1000)
    assert [s.name for s in tune_model.uncached_chain(m, w, BATCHES)] == ["read", "parse", "decode", "unbatch",
                                                                         "augment", "batch"]
    assert "unbatch" not in [s.name for s in tune_model.uncached_chain(m, w, RECORDS)]
    up, down = tune_model.upstream_of_shuffle(tune_model.uncached_chain(m, w, BATCHES))
    assert [s.name for s in up] == ["read", "parse", "decode", "unbatch"] and [s.name for s in down] == [
        "augment", "batch"]
    # the fill: 2 / (1/20000 + 1/2000 + 1/2000 + 1/2000 + 1/5000) = 1142.9 (the unbatch's cap 5000 does not bind);
    # the drain 2 / (1/2000 + 1e-6) = 3992: 1000 / (1000/1142.9 + 1000/3992)
    fill, drain = 2 / (1 / 20000 + 3 / 2000 + 1 / 5000), 2 / (1 / 2000 + 1e-6)
    assert levers.decide(m, w).first_epoch == pytest.approx(1 / (1 / fill + 1 / drain))
    # a memory cache of records (at most stages.MEMORY_CACHE_MAX_RECORDS): no unbatch in later epochs; of more,
    # read batches cached and split every epoch, above the buffer
    assert levers.decide(m, w).steady == pytest.approx(drain)
    big = stages.MEMORY_CACHE_MAX_RECORDS + 1
    c, later = levers.decide_cache(measured(decoded=40), workload(records=big), BATCHES)
    assert c.value == "memory" and [s.name for s in later] == ["augment", "batch"]
    c, later = levers.decide_cache(dataclasses.replace(measured(decoded=40), unbatch=StageRate("unbatch", 5000, 40, 1)),
                                 workload(records=big), BATCHES)
    assert c.value == "memory" and [s.name for s in later] == ["unbatch", "augment", "batch"]


def test_a_batch_copied_on_several_threads_may_use_their_cores():
    m = dataclasses.replace(measured(augment=0), batch=StageRate("batch", 3000, PATCH, 1.6))
    d = levers.decide(m, workload(memory_bytes=200 * 10 ** 6))
    assert d.steady == pytest.approx(1.6 * 3000)   # 2 cores / (1/3000) = 6000 > its cap 1.6 x 3000
    m = dataclasses.replace(m, batch=StageRate("batch", 3000, PATCH, 1))
    assert levers.decide(m, workload(memory_bytes=200 * 10 ** 6)).steady == pytest.approx(3000)


def test_an_augmentation_that_scales_short_of_its_threads_caps_the_later_epochs():
    # the probe's measured cap (`probe.parallel_cores`): 1.5 cores' worth of its one-core rate on 2 threads
    m = dataclasses.replace(measured(), augment=StageRate("augment", 400, PATCH, 1.5))
    d = levers.decide(m, workload(memory_bytes=200 * 10 ** 6))
    assert d.value("cache") == "auto" and "the default kept (auto: memory)" in d.levers[4].reason
    assert d.steady == pytest.approx(1.5 * 400)   # 2 / (1/400 + 1/1e6) = 799.7 > the cap 600
    d = levers.decide(dataclasses.replace(m, augment=StageRate("augment", 400, PATCH)), workload(memory_bytes=200e6))
    assert d.steady == pytest.approx(2 / (1 / 400 + 1 / 1e6))


def test_map_parallelism_is_the_busiest_maps_cores():
    a = tune_model.Allocation(rate=1, cores={"read": 0.5, "parse": 1.2, "decode": 0.9, "augment": 1.5}, bound="cores")
    b = tune_model.Allocation(rate=1, cores={"augment": 2.6, "batch": 0.1}, bound="cores")
    # the busiest map's cores rounded up, and one call more fetching its input
    assert levers.decide_maps([a], workload(cpus=8)).value == 4      # parse + decode 2.1 > augment 1.5: 3 + 1
    assert levers.decide_maps([a, b], workload(cpus=8)).value == 4   # augment 2.6 in the later epochs: 3 + 1
    assert levers.decide_maps([a, b], workload(cpus=2)).value == 2   # at most the CPUs
    low = tune_model.Allocation(rate=1, cores={"parse": 0.2, "decode": 0.06}, bound="cores")
    assert levers.decide_maps([low], workload(cpus=2)).value == 2    # 0.26 cores: 1 + 1
    assert levers.decide_maps([low], workload(cpus=1)).value == 1
    assert "0.26 cores, and 1 call more fetches its input; 2 CPUs" in levers.decide_maps([low], workload()).reason


def test_prefetch_holds_a_burst_of_the_maps_within_memory():
    assert levers.decide_prefetch(3, 10 ** 6, workload()).value == 4
    assert levers.decide_prefetch(1, 10 ** 6, workload()).value == 2
    # 5% of 100 MB = 5 MB holds 2 batches of 2 MB
    c = levers.decide_prefetch(6, 2 * 10 ** 6, workload(memory_bytes=10 ** 8))
    assert c.value == 2 and "holds 2" in c.reason


def _reader_bound():
    # one GZIP file: the reader 1 / (1/20000 + 1/2000) = 1818/s on its one thread; the rest 4 / 0.000751 = 5326
    m = measured(parse_batches=10 ** 4, decode_batches=10 ** 4, augment=0)
    w = workload(files=1, cpus=4, epochs=1)
    steady_chain = tune_model.uncached_chain(m, w, BATCHES)
    return m, w, tune_model.allocate(steady_chain, 4), steady_chain


def test_reshard_a_gzip_export_when_its_files_bind():
    m, w, steady, chain = _reader_bound()
    assert steady.bound == "read" and steady.rate == pytest.approx(1 / (1 / 20000 + 1 / 2000))
    # uncompressed: 20000 x 30000 / 60000 = 10000/s per core; X = 4 / (0.0001 + 0.0002 + 1e-6) = 13289;
    # the reader's cores 13289 x 0.0001 = 1.33: 2 files per worker
    c = levers.decide_reshard(m, w, steady, chain)
    assert c.value == 2 and "--workers 1 --shards-per-worker 2" in c.reason
    assert levers.decide_reshard(m, dataclasses.replace(w, workers=3), steady, chain).value == 6


def test_uncompressed_reshard_counts_the_readers_cores():
    plain = measured(inflate=0, read=2000, read_bytes=66000, parse_batches=10 ** 4, decode_batches=10 ** 4,
                     augment=0)
    w = workload(files=1, cpus=4, epochs=1)
    chain = tune_model.uncached_chain(plain, w, BATCHES)
    steady = tune_model.allocate(chain, 4)   # 1 file x 2000/s binds
    assert steady.bound == "read"
    # uncapped: 4 / (1/2000 + 2/10^4 + 10^-6) = 5706/s; the reader's cores 5706 / 2000 = 2.85: 3 files
    assert levers.decide_reshard(plain, w, steady, chain).value == 3


def test_no_reshard_when_the_reader_does_not_bind():
    c = levers.decide_reshard(measured(), workload(), tune_model.Allocation(1, {}, "cores"), [])
    assert c.value is None and "bound by cores" in c.reason


def test_service_workers_when_one_host_falls_short_of_the_step():
    m = measured(compute=10000, on_cpu=False)
    c = levers.decide_service(3000, 3000, m)
    assert c.value == 4 and "4 workers" in c.reason          # ceil(10000 / 3000)
    assert levers.decide_service(9400, 9400, m).value == 0     # 9400 >= 10000 / 1.07 = 9346
    assert levers.decide_service(9300, 9300, m).value == 2


# --- the whole decision --------------------------------------------------------------------------------------
def test_decide_predicts_the_slowest_stage_given_its_cores():
    m, w = measured(), workload(memory_bytes=200 * 10 ** 6)
    d = levers.decide(m, w)
    # first epoch: 2 / (1/20000 + 1/2000 + 1/2000 + 1/2000 + 1/2000 + 1e-6) = 970.4; later: the memory cache,
    # then augment and batch: 2 / (1/2000 + 1e-6) = 3992; the job on the same 2 cores: 2 / (2/500 + 1/2000 + 1e-6)
    assert d.first_epoch == pytest.approx(2 / (1 / 20000 + 1 / 2000 * 4 + 1e-6))
    assert d.steady == pytest.approx(2 / (1 / 2000 + 1e-6))
    assert d.end_to_end == pytest.approx(2 / (2 / 500 + 1 / 2000 + 1e-6))
    # every lever at harness train's default: parse auto (read batches, as chosen), the memory cache auto takes,
    # AUTOTUNE where the model has no term that beats it
    assert d.train_options() == {"parse": "auto", "parallel_reads": None, "map_parallelism": None, "prefetch": None,
                                 "cache": "auto"}
    # 444 < 500 / 1.07, but the job's 5,000 examples lose 1.3 s to input: less than starting a service worker
    assert d.value("reshard") is None and d.value("data_service_workers") == 0
    text = "\n".join(d.lines())
    assert "real/synthetic 0.89" in text and "Kuchnik et al., MLSys 2022" in text
    with pytest.raises(ConfigError, match="records, files and CPUs"):
        levers.decide(m, workload(files=0))
    assert math.isfinite(d.steady)


def test_decide_with_a_full_shuffle_buffer():
    m, w = measured(), workload(memory_bytes=200 * 10 ** 6, shuffle_buffer=1000)
    d = levers.decide(m, w)
    # first epoch: the fill (reader 1/20000 + 1/2000 on its 4 files' threads, parse 1/2000, decode 1/2000) alone
    # on 2 cores: 2 / (0.00155) = 1290.3 for 1000 records; then the drain (augment 1/2000, batch 1e-6 on one
    # thread): 2 / (0.000501) = 3992: 1000 / (1000/1290.3 + 1000/3992) = 974.7
    fill, drain = 2 / (1 / 20000 + 3 / 2000), 2 / (1 / 2000 + 1e-6)
    assert d.first_epoch == pytest.approx(1 / (1 / fill + 1 / drain))
    assert d.steady == pytest.approx(drain)        # cached: the drain alone
    # the fill gives the reader 1290.3 x (1/20000 + 1/2000) = 0.71 cores; the drain's augment 3992 / 2000 = 2.0
    # cores: said, the levers left at their defaults (the model has no term by which a fixed value beats them)
    reasons = {c.name: c.reason for c in d.levers}
    assert (d.value("parallel_reads"), d.value("map_parallelism")) == ("auto", "autotune")
    assert "the reader needs 0.71 cores" in reasons["parallel_reads"]
    assert "the busiest map needs 2.00 cores" in reasons["map_parallelism"]
    # the reader 1/20000 + 1/800 = 1.3 ms: the fill gives it 2 x 1.3 / (1.3 + 1) = 1.13 cores; pipelined (no
    # buffer) the whole chain gives it 2 x 1.3 / (1.3 + 1.5 + 0.001) = 0.93 cores
    assert "the reader needs 1.13 cores" in levers.decide(measured(inflate=800), w).levers[1].reason
    assert "the reader needs 0.93 cores" in levers.decide(measured(inflate=800),
                                                       dataclasses.replace(w, shuffle_buffer=0)).levers[1].reason


def test_a_probe_faster_than_memory_is_shown_and_not_chosen():
    """The 96x96 patches' parse per record was once timed at 28,937,563 examples/s per core (about 9 TB/s of
    150 KB patches): a probe that measured nothing. Its placement is not chosen on that figure."""
    m = measured(parse_records=28_937_563.0, decode_records=28_937_563.0, parse_batches=3000.0,
                 decode_batches=3000.0, decoded=150_000.0)
    assert not levers.plausible(m.parse[RECORDS]) and levers.plausible(m.parse[BATCHES]) and levers.plausible(None)
    c = levers.choose_parse(m)
    assert c.value == BATCHES and "than a core's memory moves (50 GB/s): not used" in c.reason


def test_no_service_workers_for_a_job_too_short_to_repay_starting_them():
    """A 5-second job short of its step by 70% loses ~3.5 s to input: less than starting workers costs."""
    m = measured(compute=10000, on_cpu=False)
    short = levers.decide_service(3000, 3000, m, workload(records=3000, epochs=5))   # 15,000 examples
    assert short.value == 0 and "costs 3.5 s, less than starting service workers (~30 s)" in short.reason
    long = levers.decide_service(3000, 3000, m, workload(records=300_000, epochs=5))
    assert long.value == 4


def test_a_tune_run_ends_with_the_measured_ratio_beside_the_predicted_one():
    from harness.train.measure.tune import measured_against_predicted

    record = {"by_worker": [{"predicted": {"first_epoch": 900.0, "steady": 2000.0, "end_to_end": 450.0,
                                           "compute": 500.0}}]}
    history = [{"examples_per_s": 600.0}, {"examples_per_s": 800.0}, {"examples_per_s": 820.0},
               {"examples_per_s": 780.0}]
    line = measured_against_predicted(record, history, workers=2)     # synthetic: 500 per worker x 2
    assert line == ("tune: real/synthetic measured 0.80 (later epochs' median 800 examples/s over 1,000 on "
                    "synthetic batches), predicted 0.90")
    assert measured_against_predicted({"applied": {}}, history, 1) is None      # a resumed record: no probe


def test_tune_checks_where_it_writes_before_probing(tmp_path, capsys):
    import time

    from harness import cli, exit_codes

    start = time.perf_counter()
    code = cli.main(["tune", "--data", str(tmp_path), "--write", str(tmp_path / "missing" / "tune.yaml")])
    assert code == exit_codes.PERMANENT and time.perf_counter() - start < 5
    assert f"--write {tmp_path}/missing/tune.yaml: the folder {tmp_path}/missing does not exist" in \
        capsys.readouterr().err



def test_a_lever_leaves_its_default_only_for_a_gain_beyond_the_probes_noise():
    """Large records (parse: auto -> per record) whose read batches parse 3x cheaper: the job's modelled time falls
    by more than 10%, so parse is set; a placement only 5% cheaper keeps auto, the gain said."""
    fast = measured(parse_records=500.0, decode_records=4000.0, parse_batches=3000.0, decode_batches=4000.0,
                    augment=0)
    fast = dataclasses.replace(fast, inflate=StageRate("inflate", 2000.0, 200_000.0))   # auto: per record
    w = workload(memory_bytes=10 ** 6, epochs=3)                                          # no cache: recompute
    d = levers.decide(fast, w)
    assert d.value("parse") == "batches" and "faster than with the default (auto: records)" in d.levers[0].reason
    near = dataclasses.replace(fast, parse={RECORDS: StageRate("parse", 1000.0, PATCH),
                                            BATCHES: StageRate("parse", 1060.0, PATCH)})
    d = levers.decide(near, w)
    assert d.value("parse") == "auto" and "within the probes' noise (10%)" in d.levers[0].reason
    assert [d.value(k) for k in ("parallel_reads", "map_parallelism", "prefetch")] == ["auto", "autotune", "autotune"]
