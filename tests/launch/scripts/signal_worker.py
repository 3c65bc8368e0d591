"""Test worker for the launchers' stop and exit-code tests: `signal_worker.py DIR ACTION0 ACTION1 ...`.

The process finds its index (TF_CONFIG's task index, HOROVOD_RANK or OMPI_COMM_WORLD_RANK), writes its pid to
DIR/pid-INDEX, then does ACTION[INDEX]:
  sleep           sleep 120 s (a worker the launcher must stop);
  ignore-term     ignore SIGTERM, then sleep 120 s (the launcher must SIGKILL it after its grace);
  exit:N          exit with code N once every worker has written its pid;
  after:J:ACTION  wait until worker J has written DIR/exiting-J, then ACTION (ordered exits, no timing guess);
  segv            die of SIGSEGV once every worker has written its pid.
An `exit` or `segv` writes DIR/exiting-INDEX first.
"""
import json
import os
import pathlib
import signal
import sys
import time

folder, actions = pathlib.Path(sys.argv[1]), sys.argv[2:]
if "TF_CONFIG" in os.environ:
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
else:
    index = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
(folder / f"pid-{index}").write_text(str(os.getpid()))


def wait_for(path: pathlib.Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"worker {index}: {path} never appeared")
        time.sleep(0.01)


def act(action: str) -> None:
    if action == "sleep":
        time.sleep(120)
    elif action == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(120)
    elif action.startswith("after:"):
        _, other, rest = action.split(":", 2)
        wait_for(folder / f"exiting-{other}")
        time.sleep(0.2)
        act(rest)
    else:
        for i in range(len(actions)):
            wait_for(folder / f"pid-{i}")
        (folder / f"exiting-{index}").write_text("")
        if action == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        sys.exit(int(action.split(":")[1]))


act(actions[index])
