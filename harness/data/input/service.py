"""tf.data service: run the input pipeline's preprocessing on other processes or machines
(tensorflow.org/api_docs/python/tf/data/experimental/service).

  harness data-service dispatcher --port 5050 [--work-dir DIR]
  harness data-service worker --dispatcher HOST:5050 [--port 5051] [--worker-address HOST:5051]
  harness train ... --data-service grpc://HOST:5050

The training worker builds its pipeline as usual (`build_dataset`: its files, shuffle, parse, batch) and hands the
whole graph to the service (`distribute`); service workers read the files, which they must be able to open
(shared storage or gs://), and stream finished batches back. Sharding is DYNAMIC: the dispatcher hands out the
files one split at a time, so each record is processed by one service worker per pass (with OFF every service
worker would produce every record). Each training worker gets its own job (`job_name` per input pipeline and run
attempt), so workers never take each other's batches, nor a run an earlier run's.
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Optional

log = logging.getLogger(__name__)

PROTOCOL = "grpc"


def address(target: str) -> str:
    """`grpc://host:port` for `host:port` or `grpc://host:port`."""
    return target if "://" in target else f"{PROTOCOL}://{target}"


def job_name(run_id: str, training: bool, input_pipeline_id: int) -> str:
    """`harness-<run id>-train-p0`: one job per input pipeline of one run attempt. A job name is shared by every
    consumer that gives it: a constant name made a resumed run, or a second run on the same dispatcher, join the
    earlier job and skip or split its data (tensorflow/tensorflow#63079)."""
    return f"harness-{run_id}-{'train' if training else 'eval'}-p{input_pipeline_id}"


def distribute(ds, service: str, *, job_name: str):
    """`ds` produced by the tf.data service at `service` (DYNAMIC sharding), prefetched on the consumer."""
    import tensorflow as tf

    from harness.errors import ConfigError

    if not service:
        raise ConfigError("--data-service needs the dispatcher address, e.g. grpc://localhost:5050")
    out = ds.apply(tf.data.experimental.service.distribute(
        processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC, service=address(service),
        job_name=job_name))
    return out.prefetch(tf.data.AUTOTUNE)


def start_dispatcher(port: int = 0, *, work_dir: Optional[str] = None):
    """A started `DispatchServer` on `port` (0: any free port; its `target` says which)."""
    import tensorflow as tf

    config = tf.data.experimental.service.DispatcherConfig(port=port, protocol=PROTOCOL, work_dir=work_dir,
                                                           fault_tolerant_mode=bool(work_dir))
    return tf.data.experimental.service.DispatchServer(config, start=True)


def start_worker(dispatcher: str, port: int = 0, *, worker_address: Optional[str] = None):
    """A started `WorkerServer` registered with `dispatcher` (`host:port`, with or without `grpc://`)."""
    import tensorflow as tf

    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=dispatcher.split("://", 1)[-1], port=port, protocol=PROTOCOL,
        worker_address=worker_address)
    return tf.data.experimental.service.WorkerServer(config, start=True)


def open_port_note(role: str, address: str) -> str:
    """The line a `harness data-service` server says once at its start: its port is open on every interface.

    `address`: the server's `host:port` or `grpc://host:port`. TensorFlow's tf.data service servers bind every
    interface (tensorflow/core/data/service/server_lib.cc: `"0.0.0.0:" + port`) and offer no bind address; they
    run the dataset graphs they are sent, like TensorFlow's server (SECURITY.md, "Running a TensorFlow server")."""
    port = address.rsplit(":", 1)[-1]
    return (f"harness data-service {role}: TCP port {port} listens on every interface (the tf.data service has no "
            "bind address) and runs the dataset graphs it is sent: open it only to the job's hosts (a firewall)")


def serve_until_signal(what: str) -> None:
    """Block until SIGINT or SIGTERM; the servers end with the process."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"{what} (Ctrl-C or SIGTERM to stop)", flush=True)
    while not stop.wait(0.5):  # a timed wait: Python runs signal handlers between waits
        pass
