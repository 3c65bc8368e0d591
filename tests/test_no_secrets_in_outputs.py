"""No credential value in what the harness writes or prints (issue 24, item 5).

Credentials are planted in the environment as a user's shell holds them (`*_KEY`, `*_SECRET`, `*_TOKEN`,
`*_PASSWORD` variables, and the service-account JSON that `GOOGLE_APPLICATION_CREDENTIALS` names, with a
`private_key`), and one more is typed where a printed line shows it (`--mpirun-args=-x HF_TOKEN=...`) or written
as a literal in the `--overrides` of `launch k8s`. Then a real `harness train` (one epoch of a small synthetic
table export: log lines, summary.json, the backup and its fingerprint, TensorBoard event files, the model),
`harness launch k8s` of each kind, and the printed `launch mpi` / `launch horovod --dry-run` lines run with that
environment; every file under the output folder and every captured stdout and stderr is searched, as bytes, for
the random tag that every planted value carries. Names may appear (mpirun exports by name), values may not.
"""
import json
import os
import pathlib
import secrets
import subprocess
import sys

import pytest
import yaml

from harness.data.export import synth

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "harness.cli"]
TRAIN = ("harness", "train", "--backend", "horovod", "--data", "/mnt/harness/data", "--output", "/mnt/harness/o")


@pytest.fixture
def planted(tmp_path):
    """(environment with the planted credentials, the tag each value holds, the values by name)."""
    tag = secrets.token_hex(8)
    values = {"MY_API_KEY": f"hx-secret-api-{tag}", "AWS_SECRET_ACCESS_KEY": f"hx-secret-aws-{tag}",
              "HF_TOKEN": f"hx-secret-hf-{tag}", "WANDB_SECRET": f"hx-secret-wandb-{tag}",
              "HARNESS_DB_PASSWORD": f"hx-secret-db-{tag}"}   # HARNESS_* is exported by name under mpirun
    key = f"-----BEGIN PRIVATE KEY-----\nhx-secret-pk-{tag}\n-----END PRIVATE KEY-----\n"
    account = tmp_path / "service-account.json"
    account.write_text(json.dumps({"type": "service_account", "project_id": "hx-project",
                                   "private_key_id": f"hx-secret-kid-{tag}", "private_key": key,
                                   "client_email": "trainer@hx-project.iam.gserviceaccount.com"}))
    env = dict(os.environ, **values, GOOGLE_APPLICATION_CREDENTIALS=str(account),
               HARNESS_CACHE_DIR=str(tmp_path / "out" / "cache"))
    return env, tag, values


def _run(args, env, timeout=300):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


def _leaks(tag: str, out: pathlib.Path, runs: dict) -> list[str]:
    """Where `tag` occurs: files under `out` (bytes, binary ones too) and the runs' stdout / stderr."""
    found = [str(p.relative_to(out)) for p in sorted(out.rglob("*")) if p.is_file() and tag.encode() in p.read_bytes()]
    for name, r in runs.items():
        found += [f"{name} {stream}" for stream in ("stdout", "stderr") if tag in getattr(r, stream)]
    return found


def test_planted_credentials_appear_in_no_output(planted, tmp_path):
    env, tag, values = planted
    out = tmp_path / "out"
    data = tmp_path / "points"
    synth.write_table_export(str(data), prefix="points", shards=2, records=256, seed=5)
    runs = {}

    runs["train"] = _run(["train", "--data", data, "--label", "class", "--epochs", "1", "--global-batch-size", "32",
                          "--output", out / "run"], env)
    assert runs["train"].returncode == 0, runs["train"].stderr[-3000:]
    assert (out / "run" / "summary.json").is_file() and (out / "run" / "backup" / "checkpoint").is_file()
    assert list((out / "run").rglob("events.out.tfevents.*")), sorted(p.name for p in (out / "run").rglob("*"))

    # The user's settings name the credentials; their values come from Secrets (a literal one is refused below).
    overrides = tmp_path / "mine.yaml"
    overrides.write_text(yaml.safe_dump({"container": {"env": [
        {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/var/secrets/key.json"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]}}))
    for kind in ("tfjob", "mpijob", "indexed-job"):
        runs[kind] = _run(["launch", "k8s", "--kind", kind, "--workers", "2", "--image", "h:1", "--overrides",
                           overrides, "-o", out / f"{kind}.yaml", "--", *TRAIN], env, timeout=60)
        assert runs[kind].returncode == 0, runs[kind].stderr
        text = (out / f"{kind}.yaml").read_text()
        assert "secretKeyRef" in text and "HF_TOKEN" in text
    literal = tmp_path / "literal.yaml"
    literal.write_text(yaml.safe_dump({"container": {"env": [{"name": "HF_TOKEN", "value": values["HF_TOKEN"]}]}}))
    runs["literal"] = _run(["launch", "k8s", "--kind", "tfjob", "--workers", "2", "--image", "h:1", "--overrides",
                            literal, "-o", out / "literal.yaml", "--", *TRAIN], env, timeout=60)
    assert runs["literal"].returncode == 2 and "container.env HF_TOKEN has a literal value" in runs["literal"].stderr
    assert not (out / "literal.yaml").exists()

    runs["mpi"] = _run(["launch", "mpi", "--np", "2", "--dry-run", "--export", "MY_API_KEY",
                        f"--mpirun-args=-x HF_TOKEN={values['HF_TOKEN']}", "--", *TRAIN], env, timeout=60)
    assert runs["mpi"].returncode == 0, runs["mpi"].stderr
    line = runs["mpi"].stdout
    for name in ("MY_API_KEY", "HARNESS_DB_PASSWORD", "GOOGLE_APPLICATION_CREDENTIALS"):
        assert f" -x {name} " in line   # by name: each rank reads the value from its own environment
    assert " -x 'HF_TOKEN=<redacted>' " in line, line
    assert "the values of HF_TOKEN are <redacted>" in runs["mpi"].stderr
    runs["horovod"] = _run(["launch", "horovod", "--np", "2", "--dry-run", "--", *TRAIN], env, timeout=60)
    assert runs["horovod"].returncode == 0, runs["horovod"].stderr

    assert _leaks(tag, out, runs) == []
