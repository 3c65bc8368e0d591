"""Cloud Storage credentials checked once per process, before any work touches a `gs://` path.

TensorFlow's GCS file system looks for credentials in this order (tsl/platform/cloud/google_auth_provider.cc,
TF 2.18): the token in `GOOGLE_AUTH_TOKEN_FOR_TESTING`; the file `GOOGLE_APPLICATION_CREDENTIALS` names; gcloud's
application-default file (`$CLOUDSDK_CONFIG/application_default_credentials.json`, default
`~/.config/gcloud/`); then the Compute Engine metadata server (`GCE_METADATA_HOST`, default
`metadata.google.internal`). Off Google Cloud with none of these, each process spends about 70 s on the metadata
server's retries and then fails with a traceback deep in the first read. `check_access` tries the same sources
in the same order, the metadata server with one request bounded by `HARNESS_GCS_PROBE_S` seconds (default 3), and
fails in one line naming the path, each source tried and what to set.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Iterable, Optional

from harness.errors import HarnessError

PROBE_S = 3.0                       # seconds the metadata server gets to answer (HARNESS_GCS_PROBE_S)
METADATA_HOST = "metadata.google.internal"
_checked: dict = {}                  # one probe per process: {"source": ...} once it passed


class CredentialsError(HarnessError):
    """A `gs://` path is to be read or written and no credential source TensorFlow uses is available."""


def is_gcs(path) -> bool:
    """Whether `path` is a Cloud Storage URL (`gs://bucket/...`)."""
    return isinstance(path, str) and path.startswith("gs://")


def _probe_seconds(environ) -> float:
    text = environ.get("HARNESS_GCS_PROBE_S", "")
    try:
        return float(text) if text else PROBE_S
    except ValueError:
        raise CredentialsError(f"HARNESS_GCS_PROBE_S must be a number of seconds, got {text!r}") from None


def _adc_file(environ) -> str:
    config = environ.get("CLOUDSDK_CONFIG") or os.path.join(os.path.expanduser("~"), ".config", "gcloud")
    return os.path.join(config, "application_default_credentials.json")


def _key_file(path: str) -> Optional[str]:
    """None when `path` is a readable JSON credential file, else why not."""
    try:
        with open(path) as f:
            kind = json.load(f).get("type")
    except FileNotFoundError:
        return "no such file"
    except (OSError, ValueError, AttributeError) as e:
        return f"not a JSON credential file ({e.__class__.__name__})"
    return None if kind else "no \"type\" in it: not a credential file"


def _metadata(host: str, timeout: float) -> Optional[str]:
    """None when a metadata server answers at `host` within `timeout` seconds, else what happened."""
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/", headers={"Metadata-Flavor": "Google"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # the metadata server is never proxied
    try:
        with opener.open(request, timeout=timeout) as answer:
            if answer.headers.get("Metadata-Flavor") == "Google":
                return None
            return "an answer without the header Metadata-Flavor: Google (not a metadata server)"
    except urllib.error.HTTPError as e:
        return None if e.headers.get("Metadata-Flavor") == "Google" else f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if "timed out" in str(reason):
            return f"no answer in {timeout:g} s (not on Google Cloud?)"
        return str(reason)


def find_credentials(environ=None) -> tuple[Optional[str], list[str]]:
    """(the source TensorFlow will use, or None; what each source tried gave), in TensorFlow's order."""
    environ = os.environ if environ is None else environ
    tried = []
    if environ.get("GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        return "GOOGLE_AUTH_TOKEN_FOR_TESTING", tried
    key = environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if key:
        why = _key_file(key)
        if why is None:
            return f"GOOGLE_APPLICATION_CREDENTIALS={key}", tried
        # TensorFlow stops at a named file it cannot use, as does this check.
        tried.append(f"GOOGLE_APPLICATION_CREDENTIALS={key} ({why})")
        return None, tried
    tried.append("GOOGLE_APPLICATION_CREDENTIALS (unset)")
    adc = _adc_file(environ)
    why = _key_file(adc)
    if why is None:
        return f"gcloud's application-default file {adc}", tried
    tried.append(f"gcloud's application-default file {adc} ({why})")
    host = environ.get("GCE_METADATA_HOST") or METADATA_HOST
    why = _metadata(host, _probe_seconds(environ))
    if why is None:
        return f"the metadata server {host}", tried
    tried.append(f"the metadata server {host} ({why})")
    return None, tried


def check_access(paths: Iterable, environ=None) -> Optional[str]:
    """Check, once per process, that a credential source exists when any of `paths` is on Cloud Storage.

    Returns the source found (None when no path is on `gs://`); later calls return it again without probing.
    Raises:
      CredentialsError: no source (one line: the first gs:// path, each source tried and its outcome, and what
        to set), within HARNESS_GCS_PROBE_S seconds plus two file reads."""
    remote = [p for p in paths if is_gcs(p)]
    if not remote:
        return None
    if "source" in _checked:
        return _checked["source"]
    source, tried = find_credentials(environ)
    if source is None:
        raise CredentialsError(
            f"{remote[0]}: no Google Cloud credentials: tried {'; '.join(tried)}. Set GOOGLE_APPLICATION_CREDENTIALS "
            "to a service-account key file, or run `gcloud auth application-default login`, or run on Google "
            "Cloud with a service account")
    _checked["source"] = source
    return source


def reset() -> None:
    """Forget the probe's outcome (tests)."""
    _checked.clear()
