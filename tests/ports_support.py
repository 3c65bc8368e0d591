"""The inventory's run and comparison (tests/test_ports_inventory.py, tests/cluster/test_local_isolation.py): start
a mode's commands under strace, poll their process trees' sockets until they end, and compare all that was seen with
`harness.ports.INVENTORY`."""
import dataclasses
import os
import signal
import shutil
import subprocess
import time

import pytest

from harness import ports
import ports_observer

POLL_S = 0.05         # where strace cannot trace: the poll is all there is
# Where every listen(2) is traced, the poll is needed only for what the trace cannot decode (the sockets of workers in
# a network namespace of their own, open as long as they run) and for bound UDP sockets (no row lists one, so the
# poll only ever finds one to fail on). One poll reads 4 tables of /proc/PID/net per process of the run (~6 ms each on
# 2 loaded cores, `ports_observer.observe`): at POLL_S the test process spent about a core on it beside a Horovod run.
TRACED_POLL_S = 1.0


def _can_trace() -> str:
    """"" where strace can trace a command here, else why not."""
    if not shutil.which("strace"):
        return "no strace (tools/install.sh installs it)"
    r = subprocess.run(["strace", "-f", "--seccomp-bpf", "-qq", "-o", os.devnull, "-e", "trace=listen", "true"],
                       capture_output=True, text=True, timeout=30)
    return "" if r.returncode == 0 else f"strace cannot trace here: {r.stderr.strip()[-300:]}"


NO_TRACE = _can_trace()


def _start(cmd, env, log):
    with open(log, "w") as out:
        return subprocess.Popen([str(c) for c in cmd], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _kill(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait(30)


def _tracee(p) -> int:
    """The pid of the command strace (`p`, or `enter` that ran strace in its place) runs: its child, or `p`'s own
    where it has none (yet)."""
    import psutil
    try:
        children = psutil.Process(p.pid).children()
    except psutil.NoSuchProcess:
        return p.pid
    return children[0].pid if children else p.pid


def watch(runs, tmp_path, *, timeout=240, servers=(), until=None, enter=(), on_poll=None) -> list:
    """Start `runs` (commands, each with its environment: [(cmd, env), ...]) and `servers` (likewise, started
    first and stopped by SIGTERM once the runs end), each in its own session with its output in a file under
    `tmp_path` (`{i}.log`, servers first), each under strace (`ports_observer.trace_command`) where it can trace,
    and that behind `enter` (an argv prefix: a bed host's `enter_argv()` runs them on that host); poll their process
    trees' sockets every `TRACED_POLL_S` seconds (`POLL_S` where nothing is traced), handing the sockets polled so
    far to `on_poll` after each poll, until every run has exited (or `until()` is true: the runs are then stopped
    by SIGTERM too); returns every socket seen, polled or traced (once per process, address and port). A polled
    socket is `private` when its process sits in another network namespace than the run's host (than this process
    without `enter`).

    Fails the test, with the output's tail, when a run exits non-zero or `timeout` seconds pass (all killed), and
    when the trace holds a listen call it could not decode (a socket in another network namespace) by a process
    of which no poll saw a socket in its namespace.
    """
    started, traces = [], []
    period = POLL_S if NO_TRACE else TRACED_POLL_S
    try:
        for i, (cmd, env) in enumerate([*servers, *runs]):
            traces.append(str(tmp_path / f"trace{i}" / "t") if not NO_TRACE else None)
            if traces[-1]:
                os.makedirs(os.path.dirname(traces[-1]))
            started.append(_start([*enter, *(ports_observer.trace_command(traces[-1]) if traces[-1] else []), *cmd], env,
                                  tmp_path / f"{i}.log"))
        runs_ = started[len(servers):]
        seen, deadline = {}, time.monotonic() + timeout
        while any(p.poll() is None for p in runs_) and not (until and until(seen)):
            for p in started:
                try:
                    home = os.readlink(f"/proc/{p.pid}/ns/net")   # the run's host's network (`enter`'s, else ours)
                    for s in ports_observer.observe(p.pid):
                        s = dataclasses.replace(s, private=os.readlink(f"/proc/{s.pid}/ns/net") != home)
                        seen.setdefault((s.pid, s.ip, s.port, s.udp), s)
                except Exception:   # the process ended between the poll and the read
                    pass
            if on_poll:
                on_poll(list(seen.values()))
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout} s:\n{_tails(tmp_path, len(started))}")
            time.sleep(period)
        stopped = [p for p in started if p.poll() is None]
        for p in stopped:
            os.kill(_tracee(p) if not NO_TRACE else p.pid, signal.SIGTERM)
        for p in stopped:
            p.wait(30)
        bad = [p for p in runs_ if p not in stopped and p.returncode != 0]
        assert not bad, f"exit {[p.returncode for p in bad]}:\n{_tails(tmp_path, len(started))}"
        undecoded = []
        for prefix in filter(None, traces):
            sockets, missed = ports_observer.traced(prefix)
            undecoded += missed
            for s in sockets:
                seen.setdefault((s.pid, s.ip, s.port, s.udp), s)
        private = {s.pid for s in seen.values() if s.private}
        assert all(pid in private for pid, _ in undecoded), (
            f"listen calls in another network namespace by processes never polled there: {undecoded}; "
            f"polled: {list(seen.values())}")
        return list(seen.values())
    finally:
        _kill(started)


def _tails(tmp_path, n) -> str:
    return "\n".join(f"--- {i}.log\n" + (tmp_path / f"{i}.log").read_text()[-3000:] for i in range(n))


def check(mode, sockets) -> None:
    """The run of `mode` listened as the inventory says: no unlisted socket, no row unseen."""
    if NO_TRACE and mode == ports.HOROVOD_GLOO:
        pytest.skip(f"Gloo's listeners are open for less than a poll and need a trace: {NO_TRACE}")
    unlisted, unseen = ports_observer.compare(mode, sockets)
    assert not unlisted, (f"{mode}: listeners the inventory (harness/ports.py) does not list:\n" +
                          "\n".join(f"  {s.process} pid {s.pid}: {'udp' if s.udp else 'tcp'} {s.ip}:{s.port} "
                                    f"(told {sorted(s.told)}) {s.command}" for s in unlisted))
    assert not unseen, f"{mode}: rows no socket matched (stale?): {unseen}\nseen: {sockets}"
