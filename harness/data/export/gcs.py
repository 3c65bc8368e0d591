"""Cloud Storage credentials checked once per process, before any work touches a `gs://` path.

TensorFlow's GCS file system looks for credentials in this order (tsl/platform/cloud/google_auth_provider.cc,
TF 2.18): the token in `GOOGLE_AUTH_TOKEN_FOR_TESTING`; the file `GOOGLE_APPLICATION_CREDENTIALS` names; gcloud's
application-default file (`$CLOUDSDK_CONFIG/application_default_credentials.json`, default
`~/.config/gcloud/`); then the Compute Engine metadata server (`GCE_METADATA_HOST`, default
`metadata.google.internal`). Off Google Cloud with none of these, each process spends about 70 s on the metadata
server's retries and then fails with a traceback deep in the first read. `check_access` tries the same sources
in the same order, the metadata server with one request bounded by `HARNESS_GCS_PROBE_S` seconds (default 3), and
fails in one line naming the path, each source tried and what to set.

Then `check` asks the JSON API for each bucket named (`GET https://www.googleapis.com/storage/v1/b/BUCKET`,
TensorFlow's own endpoint, through the proxy `https_proxy` names and with the CA file `CURL_CA_BUNDLE` names, as
TensorFlow's libcurl takes them), once per bucket per process, bounded by the same `HARNESS_GCS_PROBE_S`: where
TensorFlow would retry a silent or refusing endpoint ten times with backoff (tsl/platform/cloud/retrying_utils.cc)
before a traceback, a path whose bucket cannot be reached, does not exist or refuses the credentials is one line.
With a token at hand (`GOOGLE_AUTH_TOKEN_FOR_TESTING`, or the metadata server's) the request carries it, so a
missing bucket (404) and a refused account (401, 403) are named; with a key file (whose token TensorFlow signs
itself) it goes anonymous and checks reachability only (any HTTP answer: 401 is what a private bucket gives).
"""
from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Iterable, Optional

from harness.distribute import environment
from harness.errors import HarnessError

STORAGE_API = "https://www.googleapis.com/storage/v1/b/"   # gcs_file_system.cc's kGcsUriBase + "b/"
PROBE_S = 3.0                       # seconds the metadata server gets to answer (HARNESS_GCS_PROBE_S)
METADATA_HOST = "metadata.google.internal"
_checked: dict = {}                  # one probe per process: {"source": ...} once it passed


class CredentialsError(HarnessError):
    """A `gs://` path is to be read or written and no credential source TensorFlow uses is available."""


class BucketError(HarnessError):
    """A `gs://` path's bucket did not answer within HARNESS_GCS_PROBE_S seconds, does not exist, or refuses the
    credentials found."""


def is_gcs(path) -> bool:
    """Whether `path` is a Cloud Storage URL (`gs://bucket/...`)."""
    return isinstance(path, str) and path.startswith("gs://")


def _probe_seconds(environ) -> float:
    text = environ.get(environment.GCS_PROBE, "")
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


def _bucket(path: str) -> str:
    return path[len("gs://"):].split("/", 1)[0]


def _token(source: str, environ, timeout: float) -> Optional[str]:
    """The access token the probe sends: GOOGLE_AUTH_TOKEN_FOR_TESTING's, or one from the metadata server (its
    default service account's, as TensorFlow asks for it); None for key files (TensorFlow signs its own JWT)."""
    if source == "GOOGLE_AUTH_TOKEN_FOR_TESTING":
        return environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"]
    if not source.startswith("the metadata server"):
        return None
    host = environ.get("GCE_METADATA_HOST") or METADATA_HOST
    request = urllib.request.Request(
        f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token",
        headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=timeout) as answer:
            return json.loads(answer.read()).get("access_token")
    except (urllib.error.URLError, OSError, ValueError):
        return None     # no token: the probe goes anonymous (reachability only)


def _proxies(environ) -> dict:
    """libcurl's proxy variables, as urllib takes them ({"https": URL, "no": "..."})."""
    proxies = {}
    for name in ("https", "http", "all", "no"):
        value = environ.get(f"{name}_proxy") or environ.get(f"{name.upper()}_PROXY")
        if value:
            proxies[name] = value
    if "https" not in proxies and "all" in proxies:
        proxies["https"] = proxies["all"]
    if urllib.request.proxy_bypass_environment("www.googleapis.com", proxies):
        return {}
    return {k: v for k, v in proxies.items() if k == "https"}


def probe_bucket(bucket: str, token: Optional[str], environ, timeout: float) -> Optional[str]:
    """None when the JSON API answers for `bucket` within `timeout` seconds (with `token`: 200; without: any
    answer), else what happened."""
    proxies = _proxies(environ)
    context = ssl.create_default_context(cafile=environ.get("CURL_CA_BUNDLE") or None)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies),
                                         urllib.request.HTTPSHandler(context=context))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{STORAGE_API}{urllib.parse.quote(bucket, safe='')}?fields=name",
                                     headers=headers)
    via = f" through the proxy {proxies['https']}" if proxies else ""
    try:
        with opener.open(request, timeout=timeout):
            return None
    except urllib.error.HTTPError as e:
        if token is None:
            return None   # reachable; access is checked by the first read
        if e.code == 404:
            return f"no bucket {bucket!r} (HTTP 404)"
        if e.code in (401, 403):
            return f"the credentials were refused for bucket {bucket!r} (HTTP {e.code})"
        return f"HTTP {e.code} from {STORAGE_API}{bucket}"
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if "timed out" in str(reason):
            return f"www.googleapis.com gave no answer in {timeout:g} s{via}"
        return f"www.googleapis.com could not be reached{via}: {reason}"


def check(paths: Iterable, environ=None) -> None:
    """What every command runs before any work on `gs://` paths: `check_access` (credentials), then the JSON API
    asked, once per bucket per process, for each bucket of `paths` on Cloud Storage (the credential source
    decides the token), each within HARNESS_GCS_PROBE_S seconds.

    Raises:
      CredentialsError: as `check_access`.
      BucketError: one line: the first path of the bucket, what happened (no answer in N s, refused connection,
        no such bucket, credentials refused) and the credential source used."""
    environ = os.environ if environ is None else environ
    remote = [p for p in paths if is_gcs(p)]
    if not remote:
        return
    source = check_access(remote, environ)
    seen = _checked.setdefault("buckets", set())
    timeout = _probe_seconds(environ)
    for path in remote:
        bucket = _bucket(path)
        if bucket in seen:
            continue
        why = probe_bucket(bucket, _token(source, environ, timeout), environ, timeout)
        if why is not None:
            raise BucketError(f"{path}: {why} (credentials: {source}; HARNESS_GCS_PROBE_S={timeout:g})")
        seen.add(bucket)


def reset() -> None:
    """Forget the probe's outcome (tests)."""
    _checked.clear()
