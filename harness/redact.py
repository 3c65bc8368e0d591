"""Credential values stay out of what the harness writes and prints; names may appear, values may not.

The harness hands environment variables on by name (`mpirun -x NAME`, the manifests' `env` entries, which the
user's `--overrides` fill), and writes no environment into logs, `summary.json`, backups or TensorBoard files.
Where a line it prints holds a value (`NAME=VALUE`, e.g. in `--mpirun-args "-x HF_TOKEN=..."`), the value of a
credential's name is replaced by `MARKER`. A name is a credential's when it ends in one of `SECRET_SUFFIXES`
(AWS_SECRET_ACCESS_KEY, WANDB_API_KEY, HF_TOKEN, DB_PASSWORD). The
contents of the file `GOOGLE_APPLICATION_CREDENTIALS` names (a service account's private key) are never read by
the harness: TensorFlow's GCS file system reads them itself.
"""
from __future__ import annotations

import re
from typing import Sequence

SECRET_SUFFIXES = ("_KEY", "_SECRET", "_TOKEN", "_PASSWORD")
MARKER = "<redacted>"
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)


def is_secret_name(name: str) -> bool:
    """Whether `name` (an environment variable's) holds a credential: it ends in `SECRET_SUFFIXES`, any case."""
    return name.upper().endswith(SECRET_SUFFIXES)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """`argv` for printing: each word `NAME=VALUE` whose NAME `is_secret_name` becomes `NAME=<redacted>` (e.g.
    the `HF_TOKEN=hf_...` of `mpirun -x HF_TOKEN=hf_...`); the other words unchanged."""
    out = []
    for word in argv:
        m = _ASSIGNMENT.match(word)
        out.append(f"{m.group(1)}={MARKER}" if m and is_secret_name(m.group(1)) else word)
    return out


def redacted_names(argv: Sequence[str]) -> list[str]:
    """The credential names whose values `redact_argv` hides in `argv`, in order."""
    return [m.group(1) for m in map(_ASSIGNMENT.match, argv) if m and is_secret_name(m.group(1))]
