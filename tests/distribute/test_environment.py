"""harness/distribute/environment.py: TF_CONFIG, the Indexed Job's implied TF_CONFIG, launcher variables and the
workers' wait, each read from a given environment."""
import json

import pytest

from harness.distribute.environment import (indexed_job_tf_config, read_launcher, read_tf_config,
                                            read_worker_wait_s)
from harness.errors import ClusterConfigError

WORKERS = ["host-a:2222", "host-a:2223", "host-b:2222"]  # as in test_context.py


@pytest.mark.parametrize("raw, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", 'no "cluster"'),
    (json.dumps({"task": {"type": "worker", "index": 0}}), 'no "cluster"'),
    (json.dumps({"cluster": {"worker": WORKERS}}), 'no "task"'),
    (json.dumps({"cluster": {"worker": WORKERS}, "task": {"type": "chief", "index": 0}}),
     'task type "chief" is not in the cluster'),
    (json.dumps({"cluster": {"worker": WORKERS}, "task": {"type": "worker", "index": 3}}),
     'index 3 is out of range: the cluster has 3 "worker" tasks'),
    (json.dumps({"cluster": {"worker": WORKERS, "ps": ["p:1"]}, "task": {"type": "worker", "index": 0}}),
     'task type "ps"'),
    (json.dumps({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}), "2 chiefs"),
    (json.dumps({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}}), "list of"),
])
def test_bad_tf_config(raw, message):
    with pytest.raises(ClusterConfigError, match=message):
        read_tf_config({"TF_CONFIG": raw})


def test_empty_tf_config_is_unset():
    assert read_tf_config({"TF_CONFIG": " "}) is None


@pytest.mark.parametrize("env, expected", [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, ("openmpi", 3, 4, 1, 2)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"}, ("pmi", 1, 2, 1, None)),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}, ("slurm", 5, 8, 1, None)),
    ({"HOROVOD_RANK": "2", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "0"}, ("horovod", 2, 3, 0, None)),
    ({"HARNESS_RANK": "1", "HARNESS_NUM_WORKERS": "2"}, ("harness", 1, 2, None, None)),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, ("slurm", 0, 1, None, None)),
])
def test_launcher_variables(env, expected):
    found = read_launcher(env)
    assert (found.launcher, found.rank, found.size, found.local_rank, found.local_size) == expected


@pytest.mark.parametrize("env, message", [
    ({"PMI_RANK": "x", "PMI_SIZE": "2"}, "PMI_RANK='x' is not an integer"),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}, "SLURM_PROCID=4 is out of range"),
])
def test_bad_launcher_variables(env, message):
    with pytest.raises(ClusterConfigError, match=message):
        read_launcher(env)


def test_explicit_tf_config_wins_over_indexed_job():
    env = {"JOB_COMPLETION_INDEX": "1", "HARNESS_K8S_SERVICE": "s", "HARNESS_K8S_JOB": "j",
           "HARNESS_NUM_WORKERS": "2",
           "TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}'}
    assert read_tf_config(env).cluster == {"worker": ("a:1",)}
    # Without the service variable, a pod of someone else's Indexed Job is not a harness cluster.
    assert read_tf_config({"JOB_COMPLETION_INDEX": "0"}) is None


@pytest.mark.parametrize("env, match", [
    ({"HARNESS_NUM_WORKERS": "2"}, "HARNESS_K8S_JOB is not set"),
    ({"HARNESS_K8S_JOB": "j"}, "HARNESS_NUM_WORKERS is not set"),
    ({"HARNESS_K8S_JOB": "j", "HARNESS_NUM_WORKERS": "2", "JOB_COMPLETION_INDEX": "2"}, "out of range"),
    ({"HARNESS_K8S_JOB": "j", "HARNESS_NUM_WORKERS": "two"}, "not an integer"),
    ({"HARNESS_K8S_JOB": "j", "HARNESS_NUM_WORKERS": "2", "HARNESS_WORKER_ADDRESSES": "a:1"}, "must list 2"),
])
def test_indexed_job_bad_environment_is_named(env, match):
    full = {"JOB_COMPLETION_INDEX": "0", "HARNESS_K8S_SERVICE": "s", **env}
    with pytest.raises(ClusterConfigError, match=match):
        read_tf_config(full)


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_bad_wait_setting_is_a_cluster_config_error(value):
    with pytest.raises(ClusterConfigError, match="HARNESS_WORKER_WAIT_S"):
        read_worker_wait_s({"HARNESS_WORKER_WAIT_S": value})
    assert read_worker_wait_s({}) == 120


def test_indexed_job_addresses_port_and_override():
    env = {"JOB_COMPLETION_INDEX": "1", "HARNESS_K8S_SERVICE": "svc", "HARNESS_K8S_JOB": "job",
           "HARNESS_NUM_WORKERS": "2", "HARNESS_PORT": "3000"}
    config = indexed_job_tf_config(env)
    assert config.cluster == {"worker": ("job-0.svc:3000", "job-1.svc:3000")}
    assert (config.task_type, config.task_index) == ("worker", 1)
    listed = indexed_job_tf_config({**env, "HARNESS_WORKER_ADDRESSES": "10.0.0.1:5000, 10.0.0.2:5001"})
    assert listed.cluster == {"worker": ("10.0.0.1:5000", "10.0.0.2:5001")} and listed.task_index == 1
    assert indexed_job_tf_config({"JOB_COMPLETION_INDEX": "0"}) is None


def test_worker_wait_setting_is_read_in_seconds():
    assert read_worker_wait_s({"HARNESS_WORKER_WAIT_S": " 2.5 "}) == 2.5
