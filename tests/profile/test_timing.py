"""harness/profile/timing.py: the step timer's marks, and its summary with warm-up steps left out."""
import pytest

from harness.profile import timing
from harness.profile.timing import StepTime, StepTimer


@pytest.fixture
def clock(monkeypatch):
    """perf_counter that returns the times put in `clock` (a list), in order."""
    times = []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: times.pop(0))
    return times


def _step(timer, clock, step, begin, got, end, examples=8):
    clock.extend([begin, got, end])
    mark = timer.begin()
    timer.got_input(mark)
    return timer.end(mark, step, examples)


def test_marks_give_wait_compute_and_warmup(clock):
    clock.append(100.0)  # the timer's origin
    timer = StepTimer(warmup_steps=1)
    first = _step(timer, clock, 1, 100.0, 100.5, 101.0)
    second = _step(timer, clock, 2, 101.0, 101.1, 101.5)
    assert first == StepTime(1, 0.0, 0.5, 0.5, 8, warmup=True)
    assert (second.start_s, second.warmup, second.examples) == (1.0, False, 8)
    assert second.input_wait_s == pytest.approx(0.1) and second.compute_s == pytest.approx(0.4)
    assert second.step_s == pytest.approx(0.5)


def test_summary_leaves_warmup_out(clock):
    clock.append(100.0)
    timer = StepTimer(warmup_steps=1)
    _step(timer, clock, 1, 100.0, 102.0, 103.0)  # warm-up: 2 s waiting, which must not count
    _step(timer, clock, 2, 103.0, 103.1, 103.5)  # 0.1 s wait of 0.5 s
    _step(timer, clock, 3, 103.5, 103.8, 104.5)  # 0.3 s wait of 1.0 s
    s = timer.summary()
    assert (s["steps"], s["warmup_steps"]) == (2, 1)
    assert s["input_stall_share"] == pytest.approx(0.4 / 1.5)
    assert s["examples_per_s"] == pytest.approx(16 / 1.5)
    assert s["mean_step_s"] == pytest.approx(0.75)
    assert (s["input_wait_s"], s["compute_s"]) == (pytest.approx(0.4), pytest.approx(1.1))


def test_summary_of_warmup_steps_only_uses_them():
    steps = [StepTime(1, 0.0, 1.0, 3.0, 4, warmup=True), StepTime(2, 4.0, 0.0, 4.0, 4, warmup=True)]
    s = StepTimer().summary(steps)
    assert (s["steps"], s["warmup_steps"]) == (2, 0)
    assert s["input_stall_share"] == pytest.approx(1 / 8) and s["examples_per_s"] == pytest.approx(1.0)
    assert StepTimer().summary([])["examples_per_s"] == 0.0


def test_calls_of_k_steps_and_their_median_rate():
    def st(step, k, seconds, warmup=False):
        return StepTime(step, 0.0, 0.0, seconds, 10, warmup, k)
    steps = [st(1, 1, 0.5, True), st(2, 1, 0.4), st(3, 1, 0.4),             # auto's one-step calls
             *[st(4 + i, 2, 0.1) for i in range(2)], *[st(6 + i, 2, 0.2) for i in range(2)],
             *[st(8 + i, 2, 1.0) for i in range(2)], st(10, 1, 0.3)]         # a burst of load; an epoch's last
    calls = timing.calls_of(steps, 2)
    assert [[s.step for s in c] for c in calls] == [[4, 5], [6, 7], [8, 9]]
    assert timing.median_call_rate(calls) == pytest.approx(20 / 0.4)        # the burst is not the median
    assert timing.median_call_rate([]) == 0.0
