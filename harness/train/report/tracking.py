"""The run sent to an MLflow tracking server, where one is named (`harness train --mlflow URI`, else the
`MLFLOW_TRACKING_URI` environment variable MLflow itself reads): by the chief only, one MLflow run per `harness
train` run in the experiment `--mlflow-experiment` (default "harness"), holding

- parameters: the options not at their defaults, the plan (workers, replicas, global and per-replica batch, steps
  per epoch), the data and model file, the precision, and the harness, TensorFlow and Keras versions;
- metrics: every number of each epoch's logs (loss, val_*, examples/s, input stall, ...) at step = the epoch
  (1-based), each class's validation scores as `val_iou/<class>` ...;
- its end: FINISHED, or FAILED where training raised (KILLED on SIGTERM or Ctrl-C);
- a run resumed from its backup continues the same MLflow run (`output/mlflow_run.json`): one history per run.

With the MLflow client (`mlflow-skinny`, the `mlflow` extra) and the server's own REST API; every request bounded
(MLFLOW_HTTP_REQUEST_TIMEOUT and MAX_RETRIES, set here unless the user set them: MLflow's defaults retry for minutes).
A server that cannot be reached at the start stops the run before training, named; one that fails later costs a
warning line and the metrics after it (counted at the end), never the training. No credential is written: the URI
is shown without its user and password, which MLflow's client is given through its own environment variables
(MLFLOW_TRACKING_USERNAME and _PASSWORD; a token: MLFLOW_TRACKING_TOKEN, as MLflow reads it).
"""
from __future__ import annotations

import contextlib
import math
import os
import time
import urllib.parse
from typing import Callable, Optional

from harness.errors import ConfigError

ENV = "MLFLOW_TRACKING_URI"
DEFAULT_EXPERIMENT = "harness"
# MLflow's client retries a failed request 7 times with backoff (minutes) by default: bounded here
REQUEST_TIMEOUT_S, REQUEST_RETRIES = 20, 2
MAX_PARAM_CHARS = 6000   # MLflow's limit on a parameter's value (mlflow.utils.validation)
RUN_RECORD = "mlflow_run.json"   # in the run's output: the MLflow run a resumed run continues


def tracking_uri(option: Optional[str]) -> Optional[str]:
    """The tracking server's URI: `--mlflow`, else MLFLOW_TRACKING_URI, else None (no tracking)."""
    return option or os.environ.get(ENV) or None


def shown(uri: str) -> str:
    """The URI without a user or password (`https://user:secret@host/` -> `https://host/`): what is printed."""
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


def _credentials_to_environment(uri: str) -> str:
    """The URI without its user and password, which go to MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD
    (this process's environment, where MLflow's client reads HTTP basic auth from): MLflow prints and raises with
    the URI it was given, so it is never given them."""
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    os.environ["MLFLOW_TRACKING_USERNAME"] = urllib.parse.unquote(parts.username or "")
    os.environ["MLFLOW_TRACKING_PASSWORD"] = urllib.parse.unquote(parts.password or "")
    return shown(uri)


def params_of(summary_run: dict, plan: dict, policy: Optional[str]) -> dict:
    """The MLflow parameters of a run: its options not at their defaults (`provenance.non_default`), the plan's
    batch and worker figures, the model file, precision and versions; values as text, at most MAX_PARAM_CHARS."""
    versions = summary_run.get("versions") or {}
    out = {f"option.{k}": v for k, v in (summary_run.get("options") or {}).items()}
    out.update({f"plan.{k}": plan[k] for k in ("workers", "replicas_in_sync", "global_batch_size",
                                               "per_replica_batch_size", "steps_per_epoch") if k in plan})
    out.update({"model_file": summary_run.get("model_file"), "precision": policy or "float32",
                **{f"version.{k}": versions[k] for k in ("harness", "tensorflow_runtime", "keras", "tf-keras")
                   if k in versions}})
    return {k: str(v)[:MAX_PARAM_CHARS] for k, v in out.items() if v is not None}


def metrics_of(logs: dict, class_names=()) -> dict:
    """The finite numbers of an epoch's logs (lists such as the confusion matrix left out) and each class's
    validation scores (`harness.train.model.metrics.per_class_scalars`), as MLflow metric names allow them."""
    from harness.train.model.metrics import per_class_scalars

    out = {k: float(v) for k, v in logs.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and k != "epoch"}
    out.update({k: float(v) for k, v in per_class_scalars(logs, tuple(class_names)).items() if math.isfinite(v)})
    return {k.replace(" ", "_"): v for k, v in out.items()}


class MLflowRun:
    """A `Controller` action (`on_epoch_end`) that sends each epoch's metrics to the run it opened (chief only;
    elsewhere every method does nothing).

    Raises (from `start`):
      ConfigError: the MLflow client is not installed, or the server refused or could not be reached (its URI
        without credentials and the error), before any training step.
    """

    def __init__(self, uri: str, context, say: Callable[[str], None], *, experiment: str = DEFAULT_EXPERIMENT,
                 class_names=()):
        self.uri, self.say, self.experiment = uri, say, experiment
        self.chief, self.class_names = context.is_chief, tuple(class_names)
        self.client, self.run_id, self.failed, self.unsent = None, None, None, 0

    def start(self, run_name: str, params: dict, tags: dict, *, output: Optional[str] = None,
              resuming: bool = False) -> None:
        """Open the MLflow run (the experiment created where missing) and send `params`; its id is kept in
        `output/mlflow_run.json`. `resuming` (the run restored a backup): the MLflow run of that record is continued
        (RUNNING again, its metrics at the next epochs, its parameters as first sent) where it is on the same
        server and experiment and still there; else a new one is opened."""
        if not self.chief:
            return
        for name, value in (("MLFLOW_HTTP_REQUEST_TIMEOUT", REQUEST_TIMEOUT_S),
                            ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", REQUEST_RETRIES)):
            os.environ.setdefault(name, str(value))
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise ConfigError(f"--mlflow {shown(self.uri)}: the MLflow client is not installed ({e}): pip install "
                              "'harness[mlflow]' (mlflow-skinny)") from None
        uri = _credentials_to_environment(self.uri)
        try:
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(self.experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
            self.run_id = self._continued(output, experiment_id) if resuming and output else None
            if self.run_id is not None:
                self.client.update_run(self.run_id, status="RUNNING")
                self.say(f"MLflow: run {self.run_id} continued (the backup's) in experiment {self.experiment!r} at "
                         f"{shown(self.uri)}")
                return
            run = self.client.create_run(experiment_id, run_name=run_name, tags=tags)
            self.run_id = run.info.run_id
            items = [Param(k, v) for k, v in params.items()]
            for i in range(0, len(items), 100):   # MLflow takes at most 100 parameters a request
                self.client.log_batch(self.run_id, params=items[i:i + 100])
        except Exception as e:   # the server's error, or the connection's: named, before training
            raise ConfigError(f"MLflow tracking server {shown(self.uri)} ({ENV} or --mlflow): "
                              f"{type(e).__name__}: {str(e)[:300]}") from None
        if output:
            self._record(output, experiment_id)
        self.say(f"MLflow: run {self.run_id} in experiment {self.experiment!r} at {shown(self.uri)}")

    def _record(self, output: str, experiment_id: str) -> None:
        """`output/mlflow_run.json`: the run's id, experiment and server (without credentials): what a resumed run
        continues."""
        import json

        import tensorflow as tf

        tf.io.gfile.makedirs(output)
        with tf.io.gfile.GFile(os.path.join(output, RUN_RECORD), "w") as f:
            json.dump({"run_id": self.run_id, "experiment_id": experiment_id, "uri": shown(self.uri)}, f)

    def _continued(self, output: str, experiment_id: str) -> Optional[str]:
        """The recorded run's id where it belongs to this server and experiment and the server still has it."""
        import json

        import tensorflow as tf

        path = os.path.join(output, RUN_RECORD)
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path) as f:
            record = json.load(f)
        if record.get("uri") != shown(self.uri) or record.get("experiment_id") != experiment_id:
            return None
        try:
            return self.client.get_run(record["run_id"]).info.run_id
        except Exception:   # deleted on the server since: a new run
            return None

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        if self.run_id is None:
            return
        if self.failed is not None:
            self.unsent += 1
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, epoch) for k, v in metrics_of(logs, self.class_names).items()]
        try:
            for i in range(0, len(metrics), 1000):   # MLflow takes at most 1000 metrics a request
                self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])
        except Exception as e:   # training goes on; the tracking stops, said once
            self.failed, self.unsent = f"{type(e).__name__}: {str(e)[:200]}", 1
            self.say(f"warning: MLflow tracking server {shown(self.uri)} failed at epoch {epoch} ({self.failed}); "
                     "training goes on, its metrics are no longer sent")

    def end(self, status: str = "FINISHED") -> None:
        """Mark the run FINISHED, FAILED or KILLED; say how many epochs were not sent."""
        if self.run_id is None:
            return
        if self.unsent:
            self.say(f"MLflow: {self.unsent} epoch(s) not sent to {shown(self.uri)} ({self.failed})")
        try:
            self.client.set_terminated(self.run_id, status)
        except Exception as e:
            self.say(f"warning: MLflow tracking server {shown(self.uri)}: the run's end not recorded "
                     f"({type(e).__name__}: {str(e)[:200]})")
        self.run_id = None


@contextlib.contextmanager
def ended(tracker: Optional[MLflowRun]):
    """Around the run's training and summary: the MLflow run marked FINISHED when the block ends, FAILED where it
    raised (KILLED for Ctrl-C and SIGTERM's stop); nothing without a tracker."""
    try:
        yield
    except BaseException as e:
        if tracker is not None:
            tracker.end("KILLED" if isinstance(e, (KeyboardInterrupt, SystemExit)) else "FAILED")
        raise
    if tracker is not None:
        tracker.end("FINISHED")
