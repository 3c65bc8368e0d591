"""harness/profile/session.py: a ProfileSession around a tiny Trainer run, without a trace or sampling, writes
report.json on the one (chief) worker; the default trace window. Injected delays: test_injected_delay.py."""
import json

import pytest
import tensorflow as tf
import tf_keras as keras

from harness.distribute.context import WorkerContext
from harness.profile.sampler import NO_GPU
from harness.profile.session import ProfileSession, default_window
from loop_support import build

BATCH, STEPS, WARMUP = 8, 6, 2


def test_session_without_trace_writes_the_report(tmp_path, capsys):
    strategy, context = tf.distribute.OneDeviceStrategy("/cpu:0"), WorkerContext.single()
    with strategy.scope():
        model = keras.Sequential([keras.Input([4]), keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(0.01)
    session = ProfileSession(context=context, strategy=strategy, output=str(tmp_path / "out"), warmup_steps=WARMUP,
                             interval_s=None)
    assert session.hooks == [] and session.sampler is None
    trainer = build(strategy, model, optimizer, global_batch_size=BATCH, steps_per_epoch=STEPS,
                    warmup_steps=WARMUP, context=context, **session.controller_kwargs())
    batches = tf.data.Dataset.from_tensors((tf.zeros([BATCH, 4]), tf.zeros([BATCH], tf.int32))).repeat()
    with session:
        trainer.fit(iter(strategy.experimental_distribute_dataset(batches)))
    report = session.finish(kind="unit", config={"lr": 0.01}, plot=False)

    assert report["files"] == {"report": str(tmp_path / "out" / "report.json")}
    assert not (tmp_path / "out" / "timeline.png").exists() and "traces" not in report
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (saved["kind"], saved["config"]) == ("unit", {"lr": 0.01})
    (part,) = saved["parts"]
    assert [s["step"] for s in part["steps"]] == list(range(1, STEPS + 1))
    assert [s["warmup"] for s in part["steps"]] == [True] * WARMUP + [False] * (STEPS - WARMUP)
    assert part["samples"] == [] and part["gpu"] == NO_GPU and part["trace"] is None
    timed_s = sum(s["step_s"] for s in part["steps"][WARMUP:])
    summary = saved["summary"]
    assert (summary["steps"], summary["warmup_steps"]) == (STEPS - WARMUP, WARMUP)
    assert summary["examples_per_s"] == pytest.approx(BATCH * (STEPS - WARMUP) / timed_s)
    assert summary["cpu_percent"] is None  # no sampling: no utilization, not a made-up 0
    assert "verdict:" in capsys.readouterr().out


def test_default_window_follows_warmup():
    assert default_window(100, 2) == (5, 14)  # 3 steps after warm-up, 10 steps long
    assert default_window(9, 4) == (7, 9)     # cut at the run's end
    assert default_window(4, 3) == (4, 4)     # fewer than 3 steps after warm-up: the first one after it
    assert default_window(3, 3) is None
