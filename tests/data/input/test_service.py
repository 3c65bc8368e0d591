"""--data-service on CPU: a local dispatcher and two workers started with `harness data-service`, then training."""
import os
import subprocess
import sys

import pytest

import procs
from procs import wait_for_line

from harness.data.input import pipeline, stages, service
from harness.data.export.shards import discover_shards
from harness.data.spec.infer import infer_spec
from harness.launch.local import free_ports
from harness.train import job


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """`harness data-service dispatcher` and two `harness data-service worker` processes; yields the address, the
    dispatcher's process and its log.

    Their output goes to files: a pipe nobody reads fills up and blocks the server."""
    logs = tmp_path_factory.mktemp("data_service")
    port = free_ports(1)[0]
    harness = [sys.executable, "-m", "harness.cli", "data-service"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    roles = [["dispatcher", "--port", str(port)]] + [["worker", "--dispatcher", f"localhost:{port}"]] * 2
    procs = []
    try:
        for i, role in enumerate(roles):
            log = logs / f"{i}-{role[0]}.log"
            with open(log, "w") as out:
                procs.append(subprocess.Popen(harness + role, env=env, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True))
            wait_for_line(log, "tf.data service", procs[-1])
        yield f"grpc://localhost:{port}", procs[0], logs / "0-dispatcher.log"
    finally:
        for p in reversed(procs):  # workers first, then the dispatcher
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def data_service(servers):
    """The address of the module's tf.data service (`servers`)."""
    return servers[0]


def test_pipeline_through_the_service_yields_every_record_once(data_service, image_export):
    shards = discover_shards(str(image_export))
    spec = infer_spec(shards)
    options = stages.PipelineOptions(per_replica_batch_size=1, training=False, cache="none")
    ds = pipeline.build_dataset(shards, spec, options)
    local = sorted(float(x.numpy().sum()) for x, _ in ds)
    remote = service.distribute(ds, data_service, job_name="test-eval")
    served = sorted(float(x.numpy().sum()) for x, _ in remote)
    assert served == pytest.approx(local)                        # 10 records, each once, over two workers


def test_train_with_data_service(data_service, table_export, tmp_path):
    options = job.TrainOptions(data=(str(table_export),), epochs=2, per_replica_batch_size=8, strategy="single",
                               output=str(tmp_path / "run"), data_service=data_service)
    summary = job.run(options)
    assert summary["final_step"] == 2 * summary["plan"]["steps_per_epoch"]
    assert all(h["loss"] == h["loss"] for h in summary["history"])


def test_address_forms():
    assert service.address("host:5050") == "grpc://host:5050"
    assert service.address("grpc://host:5050") == "grpc://host:5050"


def test_a_server_names_its_port_open_on_every_interface(servers):
    """A dispatcher says once, at its start, which port it opened to every host: the one it listens on (the
    module's dispatcher, serving two workers, not one started for this test alone)."""
    address, proc, log = servers
    assert proc.poll() is None, log.read_text()
    listening = procs.listening(proc.pid)
    notes = [ln for ln in log.read_text().splitlines() if ln.startswith("harness data-service dispatcher: TCP port")]
    assert len(notes) == 1, log.read_text()
    port = int(notes[0].split()[5])
    assert port == int(address.rsplit(":", 1)[1])                # the port it was given (--port)
    assert {p for _, p in listening} == {port}, (listening, notes)
    assert {a for a, _ in listening} <= {"0.0.0.0", "::"}       # every interface, as the line says


def test_a_second_run_on_the_same_dispatcher_gets_jobs_of_its_own(data_service, table_export, tmp_path,
                                                                 monkeypatch):
    """A tf.data service job is shared by every consumer that names it: with one constant name per input pipeline
    a resumed run, or another run on the same dispatcher, joined the earlier job (tensorflow/tensorflow#63079).
    Each run attempt names its own jobs; both runs train every step of their epochs."""
    names = []
    distribute = service.distribute

    def recorded(ds, address, *, job_name):
        names.append(job_name)
        return distribute(ds, address, job_name=job_name)
    monkeypatch.setattr(service, "distribute", recorded)
    for run in ("a", "b"):
        options = job.TrainOptions(data=(str(table_export),), epochs=1, per_replica_batch_size=8, strategy="single",
                                   output=str(tmp_path / run), data_service=data_service)
        summary = job.run(options)
        assert summary["final_step"] == summary["plan"]["steps_per_epoch"], run
    assert len(names) == 2 and len(set(names)) == 2 and all(n.endswith("-train-p0") for n in names), names

