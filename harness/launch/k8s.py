"""`harness launch k8s --kind tfjob|mpijob|indexed-job ...`: Kubernetes manifests that run `harness train` unchanged.

Three kinds, one per kind of cluster (generating YAML is in scope; applying it is `kubectl apply -f`):

- `tfjob`: a Kubeflow training-operator `TFJob` (kubeflow.org/v1). N `Worker` replicas; the container must be
  named `tensorflow` with a port named `tfjob-port` (2222), from which the operator writes each pod's TF_CONFIG
  (`{"cluster": {"worker": ["<job>-worker-0.<ns>.svc:2222", ...]}, "task": {...}, "environment": "cloud"}`).
  MultiWorkerMirroredStrategy reads it; worker 0 is the chief.
- `mpijob`: a Kubeflow mpi-operator `MPIJob` (kubeflow.org/v2beta1), for `--backend horovod` (`harness train`
  without it is refused: each rank would train its own copy). A launcher pod runs `mpirun` (or `horovodrun`) over
  N worker pods of `slotsPerWorker = G` ranks each; the workers only run `sshd` as the image's non-root user (the
  operator mounts the SSH keys at `sshAuthMountPath` and writes the hostfile). The ranks start in ssh sessions
  with the environment the launcher exports (`mpirun -x`), so the user's `container.env` goes on the launcher.
- `indexed-job`: a plain `batch/v1` Job with `completionMode: Indexed` and a headless Service, for clusters
  without operators. Pod i has hostname `<job>-<i>` under the service's subdomain, and the harness builds
  TF_CONFIG itself from `JOB_COMPLETION_INDEX` and the `HARNESS_K8S_*` variables set here
  (`harness.distribute.environment.indexed_job_tf_config`).

Every training pod gets its GPUs as `nvidia.com/gpu` limits, CPU and memory requests (`--cpu`/`--memory`, else
`CPU_PER_GPU` and `MEMORY_GIB_PER_GPU` per GPU: a pod without requests is BestEffort, the first evicted), the
shared volume (a ReadWriteMany PersistentVolumeClaim for data and output, mounted at the same path everywhere: the
chief writes the backup that every worker restores; `--volume-claim-size` also writes the claim), a memory-backed
`/dev/shm` (NCCL and tf.data need more than the runtime's 64 MB), and the image's non-root user.

Faults: a failed pod restarts and resumes from the backup. TFJob's default `restartPolicy: ExitCode` restarts only
the pods whose exit code training-operator retries (`harness.exit_codes`: 138 a lost, stuck or late peer or a
preemption, 130, 137, 143) and fails the job on the others (2: bad input or configuration); the operator does not
count those restarts against `backoffLimit` (pkg/core/job.go `PastBackoffLimit` counts OnFailure and Always
replicas only). MPIJob and Indexed Job pods use `OnFailure` (mpi-operator accepts no ExitCode; an Indexed Job with
`Never` gets a `podFailurePolicy` with the same rule, `pod_failure_policy`); the job fails once its `backoffLimit`
is reached, which defaults to what `--max-restarts` faults cost (`default_backoff_limit`).

Gang scheduling (`--gang`): all pods of the job are bound to nodes at once or none is. Without it the scheduler
places pods one by one: the first ones start and wait for their peers (`HARNESS_WORKER_WAIT_S`, 900 s in these
manifests, printed in their logs) while holding their GPUs; two jobs that each got part of their pods can wait on
each other until both time out. With `--gang` the manifests carry what the operators pass to a PodGroup (Volcano's
or scheduler-plugins' coscheduling, whichever the operator was started with: training-operator
`--gang-scheduler-name`, mpi-operator `--gang-scheduling`): `runPolicy.schedulingPolicy.minAvailable` = the pods
of the job (TFJob: the workers; MPIJob: the workers and the launcher, mpi-operator's own default), `queue` and
`priorityClass` when given, and the pods' `schedulerName` when given (`--scheduler-name`, e.g. `volcano` or
`scheduler-plugins-scheduler`: it must be the gang scheduler's; where none is set the operators set it, and
mpi-operator always overwrites it). An MPIJob under `--gang` creates its launcher at startup: with
`launcherCreationPolicy: WaitForWorkersReady` the PodGroup would wait for a launcher pod the operator creates only
once the workers run (kubeflow/mpi-operator issue 608: a deadlock).

The user's own settings (node selectors, tolerations, service account, secrets, extra env...) go in an
`--overrides` YAML with three sections, merged last: `manifest` into each top-level object, `pod` into every pod
spec, `container` into every container that runs `harness` (dicts merge, lists append, other values replace;
MPIJob: `container.env` goes to the launcher, which exports it to the ranks). A credential's value (a
`container.env` name ending in `_KEY`, `_SECRET`, `_TOKEN` or `_PASSWORD`, `harness.redact`) is refused as a
literal `value`: it comes from a Secret (`valueFrom.secretKeyRef`), so that it is in neither the file nor the job's
object, which anyone who may read the job can print.

Network: each job gets a NetworkPolicy (`network_policy`; `--no-network-policy` leaves it out) that admits ingress
to the job's pods from the job's own pods only: TensorFlow's distributed server has no authorization and executes
the graphs it is sent, whoever sends them (TensorFlow SECURITY.md, "Running a TensorFlow server").
"""
from __future__ import annotations

import copy
import dataclasses
import re
import shlex
from typing import Any, Mapping, Optional, Sequence

import yaml

from harness import exit_codes, redact
from harness.choices import K8S_KINDS, MPI_LAUNCHERS
from harness.distribute import environment
from harness.errors import ConfigError
from harness.launch import mpi

KINDS = K8S_KINDS
PORT = environment.DEFAULT_PORT
TF_CONTAINER = "tensorflow"      # the training-operator finds the TF container and its port by these names
TF_PORT_NAME = "tfjob-port"
USER, UID = "harness", 1000      # the Dockerfile's non-root user
HOME = f"/home/{USER}"
GPU_RESOURCE = "nvidia.com/gpu"
# restartPolicy values each kind accepts: the training-operator's replica specs; mpi-operator's validation
# (pkg/apis/kubeflow/validation/validation.go, validRestartPolicies: Never and OnFailure; any other value and the
# MPIJob is never started); pods of a batch/v1 Job.
RESTART_POLICIES = {"tfjob": ("ExitCode", "OnFailure", "Never", "Always"),
                    "mpijob": ("OnFailure", "Never"),
                    "indexed-job": ("OnFailure", "Never")}
# The default of each kind: the first above. TFJob: ExitCode, so a retryable code (138) restarts and 2 fails the job.
MAX_RESTARTS = 3   # faults a job survives by default (--max-restarts)
# Requests per GPU when --cpu/--memory are not given, within what common GPU nodes offer per GPU (GKE a2/a3,
# AWS p4d/p5: 12 or more vCPUs and 85 GiB or more per GPU; g4dn/g5.xlarge: 4 vCPUs, 16 GiB); pods without GPUs
# get those of one GPU. Requests only (Burstable QoS): the pod may use more when the node has it.
CPU_PER_GPU, MEMORY_GIB_PER_GPU = 3, 12
LAUNCHER_REQUESTS = {"cpu": "1", "memory": "2Gi"}   # mpirun (or horovodrun) and its ssh sessions
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
# Set in every training container; under MPI also exported by `mpirun -x` (ssh sessions start with a bare env).
BASE_ENV = {"TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1"}
# tf.distribute pods wait this long for their peers (harness.distribute.strategy.wait_for_workers): on a cluster,
# scheduling and image pulls take minutes, more than the 120 s default meant for one machine.
WAIT_ENV = {environment.WORKER_WAIT: f"{environment.K8S_WORKER_WAIT_S:g}"}
# The MPIJob launcher's own variables, exported to the ranks with the others of its container (NCCL off the
# interfaces that are not routed between pods; Horovod docs/mpi.rst).
LAUNCHER_ENV = {"NCCL_SOCKET_IFNAME": mpi.NCCL_SOCKET_IFNAME}
# Set in the image itself: PATH by the Dockerfile, LD_LIBRARY_PATH by its nvidia/cuda base image.
IMAGE_EXPORTED = ("PATH", "LD_LIBRARY_PATH")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
OVERRIDE_SECTIONS = ("manifest", "pod", "container")


@dataclasses.dataclass(frozen=True)
class K8sOptions:
    """What `harness launch k8s` generates. Field names match its flags.

    Attributes:
      kind: one of `KINDS`.
      command: what each worker runs (`tfjob`, `indexed-job`) or each MPI rank runs (`mpijob`).
      workers: training pods.
      image: container image (see the Dockerfile).
      gpus_per_worker: GPUs per pod (`nvidia.com/gpu` limit); for `mpijob` also the MPI slots (ranks) per pod.
      name: job name (a DNS label: it prefixes pod and host names).
      namespace: metadata.namespace, or None for kubectl's current one.
      port: the workers' gRPC port (tfjob, indexed-job).
      volume_claim: PersistentVolumeClaim mounted at `mount_path` in every pod; None for no shared volume.
      volume_claim_size: when given (e.g. "500Gi"), also write the claim (ReadWriteMany, `storage_class`).
      cpu, memory: requests and limits per training pod, e.g. "8" and "32Gi"; None for a request of
        `CPU_PER_GPU` CPUs and `MEMORY_GIB_PER_GPU` GiB per GPU (no limit).
      restart_policy: per pod (indexed-job) or per replica type (operators); see `RESTART_POLICIES`; None for the
        kind's default (its first: TFJob ExitCode, the others OnFailure).
      max_restarts: faults (a pod or rank failing) the job survives, each followed by a restart of the pods and
        a resume from the backup; sizes the default `backoff_limit`.
      backoff_limit: the job's `backoffLimit`; None for `default_backoff_limit`.
      mpi_launcher: `mpirun` or `horovodrun` (mpijob).
      overrides: the user's own settings, see the module doc.
      gang: gang scheduling (see the module doc): tfjob and mpijob only.
      queue, priority_class: `runPolicy.schedulingPolicy.queue` / `.priorityClass` (Volcano's queue and the
        PodGroup's priority class); with `gang` only.
      scheduler_name: the pods' `schedulerName` (e.g. `volcano`, `scheduler-plugins-scheduler`); None to leave it
        to the operator (under `gang`) or the cluster's default scheduler.
      network_policy: also write the job's NetworkPolicy (`network_policy`); False (`--no-network-policy`) where
        the cluster enforces none or the user applies their own.
    """

    kind: str
    command: tuple[str, ...]
    workers: int
    image: str
    gpus_per_worker: int = 0
    name: str = "harness-train"
    namespace: Optional[str] = None
    port: int = PORT
    volume_claim: Optional[str] = "harness-shared"
    mount_path: str = "/mnt/harness"
    volume_claim_size: Optional[str] = None
    storage_class: Optional[str] = None
    cpu: Optional[str] = None
    memory: Optional[str] = None
    restart_policy: Optional[str] = None
    max_restarts: int = MAX_RESTARTS
    backoff_limit: Optional[int] = None
    mpi_launcher: str = "mpirun"
    overrides: Optional[Mapping[str, Any]] = None
    gang: bool = False
    queue: Optional[str] = None
    priority_class: Optional[str] = None
    scheduler_name: Optional[str] = None
    network_policy: bool = True

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"--kind {self.kind!r}: one of {', '.join(KINDS)}")
        if not self.command:
            raise ConfigError("no command to run in the pods (put it after --, e.g. -- harness train ...)")
        if self.workers < 1 or self.gpus_per_worker < 0:
            raise ConfigError(f"--workers must be >= 1 and --gpus-per-worker >= 0, got {self.workers} and "
                              f"{self.gpus_per_worker}")
        # Pod hostnames are `<name>-<index>` (Indexed Job) or `<name>-worker-<index>` (operators): DNS labels.
        longest = f"{self.name}-launcher" if self.kind == "mpijob" else f"{self.name}-worker-{self.workers - 1}"
        if not _DNS_LABEL.match(self.name) or len(longest) > 63:
            raise ConfigError(f"--name {self.name!r} must be a DNS label (lower-case letters, digits, '-', starting "
                              f"with a letter) short enough that {longest!r} has at most 63 characters")
        if self.restart_policy is None:
            object.__setattr__(self, "restart_policy", RESTART_POLICIES[self.kind][0])
        if self.gang and self.kind not in ("tfjob", "mpijob"):
            raise ConfigError(f"--gang needs an operator that makes the PodGroup: --kind tfjob or mpijob, not "
                              f"{self.kind} (a plain Job's pods are scheduled one by one; see the README)")
        if (self.queue or self.priority_class) and not self.gang:
            raise ConfigError("--queue and --priority-class are the PodGroup's: they need --gang")
        if self.scheduler_name is not None and not _DNS_LABEL.match(self.scheduler_name):
            raise ConfigError(f"--scheduler-name {self.scheduler_name!r} is not a scheduler's name (a DNS label)")
        if self.restart_policy not in RESTART_POLICIES[self.kind]:
            raise ConfigError(f"--restart-policy {self.restart_policy!r} is not valid for {self.kind}: one of "
                              f"{', '.join(RESTART_POLICIES[self.kind])}")
        if self.mpi_launcher not in MPI_LAUNCHERS:
            raise ConfigError(f"--mpi-launcher {self.mpi_launcher!r}: one of {', '.join(MPI_LAUNCHERS)}")
        unknown = set(self.overrides or {}) - set(OVERRIDE_SECTIONS)
        if unknown:
            raise ConfigError(f"overrides: unknown sections {sorted(unknown)}; expected {list(OVERRIDE_SECTIONS)}")
        if self.max_restarts < 0 or (self.backoff_limit is not None and self.backoff_limit < 0):
            raise ConfigError(f"--max-restarts and --backoff-limit must be >= 0, got {self.max_restarts} and "
                              f"{self.backoff_limit}")
        for flag, value in (("--cpu", self.cpu), ("--memory", self.memory),
                            ("--volume-claim-size", self.volume_claim_size)):
            if value is not None and not _QUANTITY.match(value):
                raise ConfigError(f"{flag} {value!r} is not a Kubernetes quantity (e.g. 8, 500m, 32Gi)")
        if self.volume_claim_size and not self.volume_claim:
            raise ConfigError("--volume-claim-size needs a --volume-claim to name the claim")
        if self.kind == "mpijob":
            mpi.require_horovod_backend(self.command)
            _user_env_names(self)   # the launcher exports each by name: it must have one
        check_env_values((self.overrides or {}).get("container") or {})


def default_backoff_limit(o: K8sOptions) -> int:
    """The `backoffLimit` that lets a job survive `o.max_restarts` faults, from what one fault costs.

    - TFJob: the training-operator sums the container restarts of all its Running pods and fails the job when the
      sum reaches the limit (pkg/core/job.go, `PastBackoffLimit`: `result >= BackoffLimit`). When one worker
      crashes, its peers fail their next collective and restart too: a fault costs up to `workers` restarts.
    - Indexed Job: the same rule for OnFailure pods (Kubernetes pkg/controller/job, `pastBackoffLimitOnFailure`);
      for Never, each failed pod counts once and the job fails past the limit (`failed > backoffLimit`).
    - MPIJob: the limit goes to the launcher's batch/v1 Job (mpi-operator pkg/controller/mpi_job_controller.go,
      `newLauncherJob`); the workers restart without limit. A fault fails mpirun once, and the restarted
      launcher can fail again on each worker pod whose sshd is not back yet: up to `workers` restarts again.
    Hence `workers x max_restarts`, plus one because reaching the limit already fails the job.
    """
    return o.workers * o.max_restarts + 1


def _backoff_limit(o: K8sOptions) -> int:
    return default_backoff_limit(o) if o.backoff_limit is None else o.backoff_limit


def _user_env_names(o: K8sOptions) -> list[str]:
    """Names of the `container.env` entries of `o.overrides` (each a mapping with a `name`).

    Raises:
      ConfigError: an entry without a name, or (mpijob) `container.envFrom`, whose names mpirun cannot export.
    """
    container = (o.overrides or {}).get("container") or {}
    if o.kind == "mpijob" and "envFrom" in container:
        raise ConfigError("overrides: container.envFrom does not reach the ranks of an MPIJob (mpirun exports "
                          "variables by name); list each variable under container.env")
    names = []
    for entry in container.get("env") or []:
        if not isinstance(entry, Mapping) or not entry.get("name"):
            raise ConfigError(f"overrides: container.env entry {entry!r} has no name")
        names.append(entry["name"])
    return names


def check_env_values(container: Mapping) -> None:
    """Refuse a credential's value written into the manifest: a `container.env` entry whose name
    `harness.redact.is_secret_name` (ends in `_KEY`, `_SECRET`, `_TOKEN`, `_PASSWORD`) with a literal `value`.
    Such a value would sit in the generated file and in the job's object, which `kubectl get -o yaml` prints to
    anyone who may read jobs; a Secret keeps it out of both (kubernetes.io/docs/concepts/configuration/secret,
    "Using Secrets as environment variables"). The error names the variable, never its value.

    Raises:
      ConfigError: naming the first such entry and the `valueFrom.secretKeyRef` that replaces it.
    """
    for entry in container.get("env") or []:
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if name and redact.is_secret_name(name) and entry.get("value"):
            raise ConfigError(
                f"overrides: container.env {name} has a literal value, which would be written into the manifest; "
                f"put it in a Secret (kubectl create secret generic NAME --from-literal=KEY=...) and give "
                f"{{name: {name}, valueFrom: {{secretKeyRef: {{name: NAME, key: KEY}}}}}}")


class _NoAliasDumper(yaml.SafeDumper):
    """Writes shared objects out in full: no `&id001` anchors in manifests people read and edit."""

    def ignore_aliases(self, data):
        return True


def manifests(options: K8sOptions) -> list[dict]:
    """The objects to apply, in order: the claim, the NetworkPolicy (before any pod exists, so none is ever open),
    the Service before the Job that needs its DNS names, the job."""
    build = {"tfjob": tfjob, "mpijob": mpijob, "indexed-job": indexed_job}[options.kind]
    claim = [volume_claim(options)] if options.volume_claim_size else []
    policy = [network_policy(options)] if options.network_policy else []
    return claim + policy + build(options)


def network_policy(o: K8sOptions) -> dict:
    """The job's NetworkPolicy (networking.k8s.io/v1): ingress to the job's pods only from the job's own pods.

    Why: TensorFlow's distributed server "does not include any authorization protocol and sends messages
    unencrypted. It accepts connections from anywhere, and executes the graphs it is sent without performing any
    checks", so anybody who reaches it runs arbitrary code as the worker, and "you must isolate the network in
    which the cluster lives" (github.com/tensorflow/tensorflow/blob/master/SECURITY.md, "Running a TensorFlow
    server"). A pod selected by no policy
    admits every pod of the cluster; once a policy with `policyTypes: [Ingress]` selects it, it admits only what
    some policy allows (kubernetes.io/docs/concepts/services-networking/network-policies, "The two sorts of pod
    isolation").

    What: `podSelector` = the labels every pod template of the job carries (`_labels`: `app.kubernetes.io/name:
    harness`, `harness/job: <name>`), so it selects the workers and, for an MPIJob, the launcher; one ingress rule
    `from` a `podSelector` with the same labels (pods of the policy's own namespace, as the job's are). Every port,
    from those pods only, not a port list: the ports the job's processes use are not all fixed. The TF gRPC port
    (`o.port`, 2222, `tfjob-port` of a TFJob, `grpc` of an Indexed Job) is, but NCCL's sockets between pods, a
    tf.data service's servers where used and, in an MPIJob, Open MPI's daemons and TCP transport, Gloo and
    Horovod's services listen on ephemeral ports (only sshd has a fixed one, the image's 2222); a port list would
    stop those collectives, and opening them to the job's pods closes them to everyone else. Egress is not
    restricted (the pods read data, images and credentials from outside).

    Limits: only a network plugin that implements NetworkPolicy enforces it (Calico, Cilium, GKE Dataplane V2, ...):
    on others it has no effect (same page, "Prerequisites"); policies add up, so another one that admits more to
    these pods widens it.
    """
    return _override(o, {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _metadata(o),
        "spec": {"podSelector": {"matchLabels": _labels(o)}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": _labels(o)}}]}]},
    }, pods=False)


def volume_claim(o: K8sOptions) -> dict:
    """The ReadWriteMany PersistentVolumeClaim of `--volume-claim-size` (data, output and the backup that every
    restarted pod resumes from; it needs a storage class that offers ReadWriteMany: NFS, Filestore, EFS...)."""
    spec = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": o.volume_claim_size}}}
    if o.storage_class:
        spec["storageClassName"] = o.storage_class
    meta = dict(_metadata(o), name=o.volume_claim)
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


# --- the three kinds -------------------------------------------------------------------------------------------
def tfjob(o: K8sOptions) -> list[dict]:
    container = _container(o, TF_CONTAINER, list(o.command), gpus=o.gpus_per_worker, env=WAIT_ENV,
                           ports=[{"name": TF_PORT_NAME, "containerPort": o.port, "protocol": "TCP"}])
    manifest = {
        "apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": _metadata(o),
        "spec": {
            "runPolicy": _run_policy(o, pods=o.workers),
            "tfReplicaSpecs": {"Worker": {"replicas": o.workers, "restartPolicy": o.restart_policy,
                                          "template": _template(o, [container])}},
        },
    }
    return [_override(o, manifest)]


def mpijob(o: K8sOptions) -> list[dict]:
    slots = max(o.gpus_per_worker, 1)
    launcher = _container(o, "launcher", launcher_command(o), gpus=0, env=LAUNCHER_ENV, training=False)
    worker = _container(o, "worker", ["/usr/sbin/sshd", "-De", "-f", f"{HOME}/.sshd_config"],
                        gpus=o.gpus_per_worker)
    manifest = {
        "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": _metadata(o),
        "spec": {
            "slotsPerWorker": slots,
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": f"{HOME}/.ssh",
            # No ssh to workers whose sshd is not up yet; under --gang at startup (see the module doc: issue 608).
            "launcherCreationPolicy": "AtStartup" if o.gang else "WaitForWorkersReady",
            "runPolicy": _run_policy(o, pods=o.workers + 1),   # the launcher is a pod of the gang
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": o.restart_policy,
                             "template": _template(o, [launcher])},
                # Without a restartPolicy a worker is Never restarted: one failed pod fails the job.
                "Worker": {"replicas": o.workers, "restartPolicy": o.restart_policy,
                           "template": _template(o, [worker])},
            },
        },
    }
    return [_override(o, manifest)]


def _run_policy(o: K8sOptions, *, pods: int) -> dict:
    """The operators' `runPolicy`: backoffLimit, cleanPodPolicy and, under `--gang`, the `schedulingPolicy` whose
    `minAvailable` (`pods`, every pod of the job) becomes the PodGroup's minMember."""
    policy = {"backoffLimit": _backoff_limit(o), "cleanPodPolicy": "Running"}
    if o.gang:
        scheduling = {"minAvailable": pods}
        if o.queue:
            scheduling["queue"] = o.queue
        if o.priority_class:
            scheduling["priorityClass"] = o.priority_class
        policy["schedulingPolicy"] = scheduling
    return policy


def launcher_command(o: K8sOptions) -> list[str]:
    """The MPIJob launcher's command: every rank of every worker pod runs `o.command`.

    The operator points Open MPI at its hostfile (`OMPI_MCA_orte_default_hostfile`); horovodrun is given the same
    file, whose lines (`host slots=N`) it reads as they are, and exports the launcher's environment itself.
    mpirun gets `harness launch mpi`'s flags and exports by name each variable of the launcher container
    (`launcher_env_names`): only variables that are set, so mpirun has none to warn about.
    """
    ranks = str(o.workers * max(o.gpus_per_worker, 1))
    if o.mpi_launcher == "horovodrun":
        return ["horovodrun", "-np", ranks, "--hostfile", "/etc/mpi/hostfile", *o.command]
    exported = [a for name in launcher_env_names(o) for a in ("-x", name)]
    return ["mpirun", "-np", ranks, *mpi.NO_BINDING, *mpi.OPEN_MPI, *mpi.TCP_INTERFACES, mpi.TAG_OUTPUT, *exported,
            *o.command]


def launcher_env_names(o: K8sOptions) -> list[str]:
    """The variables the MPIJob launcher exports to the ranks: its container's env (ours, then the user's
    `container.env`) and `IMAGE_EXPORTED`."""
    names = [*BASE_ENV, *LAUNCHER_ENV, *_user_env_names(o), *IMAGE_EXPORTED]
    return list(dict.fromkeys(names))


def indexed_job(o: K8sOptions) -> list[dict]:
    env = {**WAIT_ENV, environment.K8S_JOB: o.name, environment.K8S_SERVICE: o.name,
           environment.NUM_WORKERS: str(o.workers), environment.PORT: str(o.port)}
    container = _container(o, "harness", list(o.command), gpus=o.gpus_per_worker, env=env,
                           ports=[{"name": "grpc", "containerPort": o.port, "protocol": "TCP"}])
    template = _template(o, [container])
    template["spec"].update(subdomain=o.name, restartPolicy=o.restart_policy)
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": _metadata(o),
        "spec": {"clusterIP": "None", "selector": _labels(o),
                 # DNS names exist before the pods are Ready: workers look each other up while starting.
                 "publishNotReadyAddresses": True,
                 "ports": [{"name": "grpc", "port": o.port, "targetPort": o.port, "protocol": "TCP"}]},
    }
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(o),
        "spec": {"completionMode": "Indexed", "completions": o.workers, "parallelism": o.workers,
                 "backoffLimit": _backoff_limit(o), "template": template},
    }
    if o.restart_policy == "Never":   # Kubernetes allows a podFailurePolicy only with Never
        job["spec"]["podFailurePolicy"] = pod_failure_policy("harness")
    return [_override(o, service, pods=False), _override(o, job)]


def pod_failure_policy(container: str) -> dict:
    """A batch/v1 Job's `podFailurePolicy` with training-operator's rule (`harness.exit_codes.is_retryable`): a pod
    whose `container` exits with a permanent code (2: bad input or configuration) fails the job at once; one that
    exits retryable (130, 137, 138, 143) is replaced and counts against `backoffLimit`; a pod disrupted by
    preemption or eviction (condition `DisruptionTarget`) is replaced without counting (kubernetes.io/docs/tasks/
    job/pod-failure-policy)."""
    retryable = [code for code in range(1, 256) if exit_codes.is_retryable(code)]
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "NotIn", "values": retryable}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]}


# --- shared pieces ---------------------------------------------------------------------------------------------
def _labels(o: K8sOptions) -> dict:
    return {"app.kubernetes.io/name": "harness", "harness/job": o.name}


def _metadata(o: K8sOptions) -> dict:
    meta = {"name": o.name, "labels": _labels(o)}
    if o.namespace:
        meta["namespace"] = o.namespace
    return meta


def _container(o: K8sOptions, name: str, command: list[str], *, gpus: int, env: Optional[dict] = None,
               ports: Optional[list] = None, training: bool = True) -> dict:
    container = {"name": name, "image": o.image, "imagePullPolicy": "IfNotPresent", "command": command,
                 "env": [{"name": k, "value": v} for k, v in {**BASE_ENV, **(env or {})}.items()],
                 "workingDir": HOME}
    if ports:
        container["ports"] = ports
    if not training:
        container["resources"] = {"requests": dict(LAUNCHER_REQUESTS)}
    else:
        container["resources"] = _resources(o, gpus)
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
        if o.volume_claim:
            container["volumeMounts"].append({"name": "shared", "mountPath": o.mount_path})
    return container


def _resources(o: K8sOptions, gpus: int) -> dict:
    """Requests and limits of a training container: `--cpu`/`--memory` as both (the default only as requests,
    see `CPU_PER_GPU`), the GPUs as limits (Kubernetes sets an extended resource's request equal to its limit)."""
    given = {k: v for k, v in (("cpu", o.cpu), ("memory", o.memory)) if v}
    per = max(gpus, 1)
    requests = {"cpu": str(CPU_PER_GPU * per), "memory": f"{MEMORY_GIB_PER_GPU * per}Gi", **given}
    limits = dict(given, **({GPU_RESOURCE: str(gpus)} if gpus else {}))
    return {"requests": requests, **({"limits": limits} if limits else {})}


def _template(o: K8sOptions, containers: list[dict]) -> dict:
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if o.volume_claim:
        volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": o.volume_claim}})
    spec = {"containers": containers, "volumes": volumes,
            # OnRootMismatch: the volume is re-owned only when its root is not ours already, not file by file
            # (the whole dataset) at every pod start and restart.
            "securityContext": {"runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                                "fsGroupChangePolicy": "OnRootMismatch", "runAsNonRoot": True}}
    if o.scheduler_name:
        spec["schedulerName"] = o.scheduler_name
    return {"metadata": {"labels": _labels(o)}, "spec": spec}


def _override(o: K8sOptions, manifest: dict, *, pods: bool = True) -> dict:
    """Merge the user's `manifest`, `pod` and `container` sections into `manifest` (see the module doc)."""
    over = o.overrides or {}
    container = dict(over.get("container") or {})
    # MPIJob: the ranks see the launcher's environment (mpirun -x), not the worker container's, which runs sshd;
    # everything else (mounts, resources...) is for the worker pods, where the ranks run.
    env = {"env": container.pop("env")} if o.kind == "mpijob" and "env" in container else {}
    if pods:
        for template in _pod_templates(manifest):
            merge(template["spec"], over.get("pod") or {})
            for c in template["spec"]["containers"]:
                merge(c, copy.deepcopy(env if c["name"] == "launcher" else container))
    return merge(manifest, over.get("manifest") or {})


def _pod_templates(manifest: dict) -> list[dict]:
    spec = manifest["spec"]
    if "template" in spec:
        return [spec["template"]]
    replicas = spec.get("tfReplicaSpecs") or spec.get("mpiReplicaSpecs") or {}
    return [r["template"] for r in replicas.values()]


def merge(base: dict, extra: Mapping) -> dict:
    """Merge `extra` into `base` in place: dicts recursively, lists appended, anything else replaced."""
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge(base[key], value)
        elif isinstance(value, list) and isinstance(base.get(key), list):
            base[key].extend(value)
        else:
            base[key] = value
    return base


def to_yaml(objects: Sequence[dict], options: K8sOptions) -> str:
    """A YAML stream of `objects`, with a header saying how it was made and where the user's settings go."""

    argv = shlex.join(["harness", "launch", "k8s", "--kind", options.kind, "--workers", str(options.workers),
                       "--gpus-per-worker", str(options.gpus_per_worker), "--image", options.image, "--",
                       *options.command])
    header = (f"# Generated by: {argv}\n"
              "# Your own settings (nodeSelector, tolerations, serviceAccountName, imagePullSecrets, env, ...):\n"
              "# put them in an overrides file (sections manifest / pod / container) and pass --overrides FILE,\n"
              "# so that regenerating keeps them. Apply with: kubectl apply -f THIS_FILE\n")
    if options.restart_policy == "ExitCode":
        header += ("# restartPolicy ExitCode: a pod that exits 138 (a lost, stuck or late peer, a preemption), 130, "
                   "137 or 143 is\n# restarted and resumes from the backup on the volume; any other code (2: bad "
                   "input or configuration)\n# fails the job. These restarts are not counted against backoffLimit.\n")
    elif options.backoff_limit is None:
        header += (f"# Survives {options.max_restarts} faults (--max-restarts): each restarts the pods, which "
                   "resume from the backup on the volume.\n")
    if options.gang:
        pods = options.workers + (options.kind == "mpijob")
        header += (f"# Gang-scheduled: all {pods} pods are bound at once or none (minAvailable {pods}); needs Volcano "
                   "or scheduler-plugins\n# and the operator started with its gang-scheduling flag.\n")
    else:
        header += (f"# Not gang-scheduled (--gang): pods start one by one and wait up to "
                   f"{WAIT_ENV[environment.WORKER_WAIT]} s for their peers\n# ({environment.WORKER_WAIT}, printed in "
                   "their logs), holding their GPUs.\n")
    if options.network_policy:
        header += ("# NetworkPolicy: the job's pods admit connections from the job's own pods only (TensorFlow's "
                   "server runs\n# what it is sent, from anyone); enforced only where the network plugin "
                   "implements NetworkPolicy.\n")
    else:
        header += ("# No NetworkPolicy (--no-network-policy): any pod of the cluster can reach the workers' ports, "
                   "and TensorFlow's\n# server runs what it is sent; isolate them with your own policy.\n")
    if options.volume_claim_size:
        header += (f"# Holds the claim {options.volume_claim}: `kubectl delete -f THIS_FILE` deletes it with "
                   "your data and backups; delete the job by name.\n")
    return header + yaml.dump_all(objects, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False)


def load_overrides(path: Optional[str]) -> Optional[dict]:
    """Read the `--overrides` YAML (None when no path)."""
    if not path:
        return None

    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with sections {list(OVERRIDE_SECTIONS)}")
    return data
