"""`harness train --mlflow URI` against a real MLflow tracking server the test starts on loopback (`mlflow server`,
a SQLite store in a temporary folder, one worker): the run's parameters and per-epoch metrics reach it, its end is
recorded, a run trained on from its backup continues the same MLflow run, and no credential of the URI is written
or printed; a server that cannot be reached stops the run
before training, named. `harness train` runs in this process (`harness.cli.main`): the server is the process of
its own here."""
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from harness import cli
from harness.data.export import synth
from harness.launch.local import free_ports
from harness.train.report import tracking

# the server's venv (tools/install.sh: the full `mlflow` package kept out of the harness's venv)
MLFLOW = pathlib.Path(sys.prefix) / "services" / "bin" / "mlflow"
START_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`http://127.0.0.1:PORT` of an MLflow tracking server (its SQLite store and artifacts in a temporary
    folder), ended (its process group) after the module."""
    folder = tmp_path_factory.mktemp("mlflow")
    port, = free_ports(1)
    log = open(folder / "server.log", "w")
    proc = subprocess.Popen([MLFLOW, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
                             "--default-artifact-root", str(folder / "artifacts")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            assert proc.poll() is None and time.monotonic() < deadline, (folder / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        log.close()


def _main(capsys, *args):
    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_the_run_reaches_the_tracking_server_with_its_parameters_and_epochs(server, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    synth.write_table_export(str(tmp_path / "points"), prefix="points", shards=2, records=256, seed=7)
    with_user = server.replace("http://", "http://alice:s3cr3t-pass@")   # a URI that carries a password
    args = ["train", "--data", tmp_path / "points" / "points-00000.tfrecord.gz", "--validation-data",
            tmp_path / "points" / "points-00001.tfrecord.gz", "--label", "class", "--epochs", 2,
            "--global-batch-size", 32, "--mlflow", with_user, "--mlflow-experiment", "points-test",
            "--output", tmp_path / "run"]
    code, out = _main(capsys, *args)
    assert code == 0, out[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    written = (tmp_path / "run" / "summary.json").read_text()
    assert "s3cr3t-pass" not in written and "s3cr3t-pass" not in out and "alice" not in out
    assert summary["run"]["options"]["mlflow"] == server
    assert f"in experiment 'points-test' at {server}" in out

    client = MlflowClient(tracking_uri=server)
    experiment = client.get_experiment_by_name("points-test")
    run, = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == str(tmp_path / "run")
    params = run.data.params
    assert params["option.epochs"] == "2" and params["option.mlflow_experiment"] == "points-test"
    assert params["plan.global_batch_size"] == "32" and params["plan.workers"] == "1"
    assert params["model_file"] == "built-in pixel classifier" and params["precision"] == "float32"
    assert params["version.tensorflow_runtime"] == summary["run"]["versions"]["tensorflow_runtime"]
    assert "s3cr3t-pass" not in json.dumps(params)
    for key in ("loss", "val_loss", "val_accuracy", "examples_per_s", "input_stall_share"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == [1, 2], key
        assert [m.value for m in history] == pytest.approx([h[key] for h in summary["history"]], rel=1e-6), key
    per_class = client.get_metric_history(run.info.run_id, "val_iou/0")   # each class's scores, by its name
    assert [m.step for m in per_class] == [1, 2]
    assert per_class[-1].value == pytest.approx(summary["per_class"]["0"]["iou"], rel=1e-6)
    assert run.data.tags["harness.initial_step"] == "0"
    assert json.loads((tmp_path / "run" / "mlflow_run.json").read_text()) == {
        "run_id": run.info.run_id, "experiment_id": experiment.experiment_id, "uri": server}

    # Trained on from its backup (one more epoch): the same MLflow run goes on, one history for the run
    code, out = _main(capsys, *args[:args.index("--epochs") + 1], 3, *args[args.index("--epochs") + 2:])
    assert code == 0, out[-3000:]
    assert f"MLflow: run {run.info.run_id} continued" in out and "s3cr3t-pass" not in out
    again, = client.search_runs([experiment.experiment_id])
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")] == [1, 2, 3]


def test_a_server_that_cannot_be_reached_stops_the_run_before_training(tmp_path, capsys):
    synth.write_table_export(str(tmp_path / "points"), prefix="points", shards=1, records=64, seed=7)
    closed, = free_ports(1)   # nothing listens there
    start = time.monotonic()
    code, out = _main(capsys, "train", "--data", tmp_path / "points", "--label", "class", "--epochs", 1,
                      "--mlflow", f"http://bob:hunter2@127.0.0.1:{closed}", "--output", tmp_path / "run")
    assert code == 2, out[-3000:]
    assert f"MLflow tracking server http://127.0.0.1:{closed} (MLFLOW_TRACKING_URI or --mlflow)" in out, out[-2000:]
    assert "hunter2" not in out and not (tmp_path / "run" / "summary.json").exists()
    assert "epoch 1/1" not in out and time.monotonic() - start < 90


def test_the_uri_comes_from_the_flag_then_the_environment_and_is_shown_without_credentials(monkeypatch):
    monkeypatch.delenv(tracking.ENV, raising=False)
    assert tracking.tracking_uri(None) is None
    monkeypatch.setenv(tracking.ENV, "http://env:5000")
    assert tracking.tracking_uri(None) == "http://env:5000" and tracking.tracking_uri("http://flag") == "http://flag"
    assert tracking.shown("https://u:p@mlflow.example.com:8443/x") == "https://mlflow.example.com:8443/x"
    assert tracking.shown("databricks") == "databricks"
    assert tracking.metrics_of({"epoch": 3, "loss": 0.5, "val_confusion_matrix": [[1]], "nan": float("nan"),
                                "ok": True}) == {"loss": 0.5}
