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

Discovery lists a folder or prefix through the same JSON API (`list_objects`, `stat_object`): one request per 1000
objects, carrying each object's size, `updated` time and generation, so no object is stat'ed one by one (issue 62).
Where no token is at hand (a key file or gcloud's file: TensorFlow signs or refreshes those itself) or the API does
not answer, `ListingUnavailable` sends the caller back to TensorFlow's own listing and stats, counted
(`counts()["fallbacks"]`) and logged once per process.
"""
from __future__ import annotations

import calendar
import dataclasses
import json
import logging
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from fractions import Fraction
from typing import Iterable, Optional

from harness.distribute import environment
from harness.errors import HarnessError

STORAGE_API = "https://www.googleapis.com/storage/v1/b/"   # gcs_file_system.cc's kGcsUriBase + "b/"
PROBE_S = 3.0                       # seconds the metadata server gets to answer (HARNESS_GCS_PROBE_S)
METADATA_HOST = "metadata.google.internal"
_checked: dict = {}                  # one probe per process: {"source": ...} once it passed
LIST_PAGE = 1000                    # objects per listing page: the JSON API's most (objects.list maxResults)
LIST_S = 30.0                       # seconds one listing page (or object lookup) may take before TensorFlow's way
_LIST_FIELDS = "items(name,size,updated,generation),prefixes,nextPageToken"
_OBJECT_FIELDS = "name,size,updated,generation"
log = logging.getLogger(__name__)


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


_TF_FILE_TYPES = ("service_account", "authorized_user")


def _key_file(path: str) -> Optional[str]:
    """None when `path` is a readable JSON credential file, else why not."""
    try:
        with open(path) as f:
            found = json.load(f)
        kind = found.get("type")
    except FileNotFoundError:
        return "no such file"
    except (OSError, ValueError, AttributeError) as e:
        return f"not a JSON credential file ({e.__class__.__name__})"
    if not kind:
        return "no \"type\" in it: not a credential file"
    # TensorFlow signs a service-account key ("private_key") or refreshes a user's token ("refresh_token"), nothing
    # else ("Unexpected content of the JSON credentials file", tsl/platform/cloud/google_auth_provider.cc): a
    # Workload Identity Federation file would leave every read anonymous.
    if kind in _TF_FILE_TYPES or "private_key" in found or "refresh_token" in found:
        return None
    what = " (Workload Identity Federation)" if kind.startswith("external_account") else ""
    return (f"type {kind!r}{what}, which TensorFlow's Cloud Storage file system cannot use: it takes a "
            "service-account key file or gcloud's user login only; use one of those, run on Google Cloud with a "
            "service account (GKE Workload Identity), or put an access token in GOOGLE_AUTH_TOKEN_FOR_TESTING "
            "(google-github-actions/auth with token_format: access_token; it lasts an hour)")


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
    return _token_expiring(source, environ, timeout)[0]


def _token_expiring(source: str, environ, timeout: float) -> tuple[Optional[str], float]:
    """(`_token`'s token, its lifetime in seconds as the metadata server states it: `expires_in`; inf for
    GOOGLE_AUTH_TOKEN_FOR_TESTING's)."""
    if source == "GOOGLE_AUTH_TOKEN_FOR_TESTING":
        return environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"], float("inf")
    if not source.startswith("the metadata server"):
        return None, 0.0
    host = environ.get("GCE_METADATA_HOST") or METADATA_HOST
    request = urllib.request.Request(
        f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token",
        headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=timeout) as answer:
            got = json.loads(answer.read())
            return got.get("access_token"), float(got.get("expires_in") or 0)
    except (urllib.error.URLError, OSError, ValueError, TypeError, AttributeError):
        return None, 0.0     # no token: the probe goes anonymous (reachability only)


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


def _opener(environ) -> urllib.request.OpenerDirector:
    """urllib's way to www.googleapis.com as TensorFlow's libcurl goes: through `_proxies`, trusting the CA file
    `CURL_CA_BUNDLE` names (else the system's)."""
    context = ssl.create_default_context(cafile=environ.get("CURL_CA_BUNDLE") or None)
    return urllib.request.build_opener(urllib.request.ProxyHandler(_proxies(environ)),
                                       urllib.request.HTTPSHandler(context=context))


def probe_bucket(bucket: str, token: Optional[str], environ, timeout: float) -> Optional[str]:
    """None when the JSON API answers for `bucket` within `timeout` seconds (with `token`: 200; without: any
    answer), else what happened."""
    proxies = _proxies(environ)
    opener = _opener(environ)
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


# --- listings: a page per 1000 objects instead of a stat per object (issue 62) -----------------------------------
_counts: dict = {}                  # "pages", "lookups", "fallbacks": requests made and refusals, this process
_warned: dict = {}                  # the fallback logged once per process


class ListingUnavailable(Exception):
    """The JSON API cannot list here (no token at hand, an HTTP error, no answer within LIST_S seconds, an answer
    not understood): the caller goes TensorFlow's way (`tf.io.gfile`). Counted in `counts()` and logged (a
    warning the first time in a process) before it is raised."""


@dataclasses.dataclass(frozen=True)
class Listed:
    """One object as the JSON API lists it (objects resource: https://cloud.google.com/storage/docs/json_api/v1/
    objects#resource).

    Attributes:
      path: `gs://BUCKET/NAME`.
      size: its length in bytes (`size`).
      mtime_ns: its `updated` time in nanoseconds since the epoch, converted as TensorFlow's stat converts it
        (`rfc3339_ns`): equal to `tf.io.gfile.stat(path).mtime_nsec`.
      generation: its `generation` (a new one each time the object is written).
    """

    path: str
    size: int
    mtime_ns: int
    generation: int


@dataclasses.dataclass
class Listings:
    """What the listings of one discovery found: `objects` ({gs:// URL: Listed}) and the prefixes they covered, so
    that an object's absence from `objects` is known without asking (`covers`)."""

    objects: dict = dataclasses.field(default_factory=dict)
    covered: list = dataclasses.field(default_factory=list)   # (gs:// prefix, recursive)

    def add(self, url_prefix: str, recursive: bool, objects: Iterable["Listed"]) -> None:
        self.covered.append((url_prefix, recursive))
        self.objects.update((o.path, o) for o in objects)

    def covers(self, path: str) -> bool:
        """Whether a listing here would have named an object at `path` (its prefix listed, and, for a listing of one
        folder level, no `/` after it): then `path` not in `objects` means no such object."""
        return any(path.startswith(p) and (whole or "/" not in path[len(p):]) for p, whole in self.covered)


def _f32(x: Fraction) -> Fraction:
    """`x` (>= 0) rounded to the nearest IEEE 754 single, ties to even, as a C `float` holds it."""
    if x == 0:
        return x
    e = x.numerator.bit_length() - x.denominator.bit_length()     # 2**e <= x < 2**(e+1), after the adjustments
    if Fraction(2) ** e > x:
        e -= 1
    elif Fraction(2) ** (e + 1) <= x:
        e += 1
    ulp = Fraction(2) ** (e - 23)
    return round(x / ulp) * ulp


_RFC3339 = re.compile(r"^\s*(\d{1,4})-(\d{1,2})-(\d{1,2})T(\d{1,2}):(\d{1,2}):(\d+(?:\.\d*)?)")


def rfc3339_ns(text: str) -> int:
    """An object's `updated` time (`2016-04-29T23:15:24.896Z`) in nanoseconds since the epoch, exactly as
    TensorFlow's GCS stat converts it (`ParseRfc3339Time`, tsl/platform/cloud/time_util.cc, TF 2.18): the seconds
    are read by sscanf's `%f` into a C `float` (so 24.896 is 24.8959999084...), the whole seconds taken with
    `floor`, and the fraction `floor((seconds - whole) * 1e9)` computed in single precision; then
    `timegm(...) * 1e9 + fraction`. Each single-precision step is rounded here as IEEE does (`_f32`).

    Raises:
      ValueError: `text` is not of that form (TensorFlow's stat fails on it too).
    """
    m = _RFC3339.match(text)
    if not m:
        raise ValueError(f"not an RFC 3339 time as Cloud Storage writes it: {text!r}")
    year, month, day, hour, minute = (int(v) for v in m.groups()[:5])
    seconds = _f32(Fraction(m.group(6)))
    whole = int(seconds)                                              # floor: seconds >= 0
    fraction = int(_f32(_f32(seconds - whole) * 1_000_000_000))      # float * int64 -> float; floor
    return calendar.timegm((year, month, day, hour, minute, whole)) * 1_000_000_000 + fraction


def _split(url: str) -> tuple[str, str]:
    bucket, _, name = url[len("gs://"):].partition("/")
    return bucket, name


def _unavailable(why: str) -> ListingUnavailable:
    _counts["fallbacks"] = _counts.get("fallbacks", 0) + 1
    if not _warned:
        _warned["why"] = why
        log.warning("gs:// discovery through TensorFlow's listing and a stat per object (a request each): the JSON "
                    "API's listing is unavailable: %s", why)
    else:
        log.debug("gs:// listing unavailable: %s", why)
    return ListingUnavailable(why)


def _api_token(url: str, environ) -> str:
    """The bearer token for the JSON API: GOOGLE_AUTH_TOKEN_FOR_TESTING's, or the metadata server's, reused until
    60 s before it expires (TensorFlow's own margin, kExpirationTimeMarginSec, google_auth_provider.cc).

    Raises:
      ListingUnavailable: the credentials are a key file or gcloud's file (TensorFlow signs or refreshes those
        itself), or the metadata server gave no token."""
    source = check_access([url], environ)
    held = _checked.get("token")
    if held and held[0] == source and time.monotonic() < held[2]:
        return held[1]
    token, lifetime = _token_expiring(source, environ, _probe_seconds(environ))
    if not token:
        raise _unavailable(f"no access token at hand (credentials: {source}; TensorFlow makes its own)")
    _checked["token"] = (source, token, time.monotonic() + lifetime - 60.0)
    return token


def _get_json(url: str, api_url: str, environ) -> Optional[dict]:
    """The JSON answer of GET `api_url`, None for HTTP 404.

    Raises:
      ListingUnavailable: any other HTTP error (401 forgets the held token), no answer within LIST_S seconds,
        not JSON."""
    request = urllib.request.Request(api_url, headers={"Authorization": f"Bearer {_api_token(url, environ)}"})
    try:
        with _opener(environ).open(request, timeout=LIST_S) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        if e.code == 401:
            _checked.pop("token", None)
        raise _unavailable(f"HTTP {e.code} from {api_url.split('?')[0]}") from None
    except (urllib.error.URLError, OSError) as e:
        raise _unavailable(f"{api_url.split('?')[0]}: {getattr(e, 'reason', e)}") from None
    except ValueError as e:
        raise _unavailable(f"{api_url.split('?')[0]}: not JSON ({e})") from None


def _listed(bucket: str, item: dict) -> Listed:
    return Listed(f"gs://{bucket}/{item['name']}", int(item["size"]), rfc3339_ns(item["updated"]),
                  int(item.get("generation") or 0))


def list_objects(url: str, *, recursive: bool = False, environ=None) -> tuple[list[Listed], list[str]]:
    """The objects whose names start with `url`'s name (`gs://BUCKET/PREFIX`; a folder is `gs://BUCKET/DIR/`), with
    their sizes and times, in name order, and the folders below it (`gs://BUCKET/DIR/SUB/`; none when
    `recursive`: then every object under the prefix is listed, at any depth).

    One request per LIST_PAGE (1000) objects: `GET https://www.googleapis.com/storage/v1/b/BUCKET/o?prefix=PREFIX
    &delimiter=/&maxResults=1000&fields=items(name,size,updated,generation),prefixes,nextPageToken`, then again
    with `pageToken` while the answer has a `nextPageToken` (https://cloud.google.com/storage/docs/json_api/v1/
    objects/list), through the proxy and CA file TensorFlow's libcurl uses (`_opener`), each within LIST_S seconds.

    Raises:
      ListingUnavailable: no token at hand, an HTTP error (a missing bucket included), no answer, or an answer not
        understood (`_get_json`, `rfc3339_ns`).
    """
    environ = os.environ if environ is None else environ
    bucket, prefix = _split(url)
    query = {"prefix": prefix, "fields": _LIST_FIELDS, "maxResults": str(LIST_PAGE)}
    if not recursive:
        query["delimiter"] = "/"
    objects, folders, token = [], [], None
    while True:
        page_query = dict(query, pageToken=token) if token else query
        api_url = f"{STORAGE_API}{urllib.parse.quote(bucket, safe='')}/o?{urllib.parse.urlencode(page_query)}"
        _counts["pages"] = _counts.get("pages", 0) + 1
        page = _get_json(url, api_url, environ)
        if page is None:
            raise _unavailable(f"HTTP 404 listing gs://{bucket}/ (no such bucket?)")
        try:
            objects += [_listed(bucket, item) for item in page.get("items", ())]
        except (KeyError, TypeError, ValueError) as e:
            raise _unavailable(f"a listing of {url} not understood ({e!r})") from None
        folders += [f"gs://{bucket}/{p}" for p in page.get("prefixes", ())]
        token = page.get("nextPageToken")
        if not token:
            return objects, folders


def stat_object(url: str, environ=None) -> Optional[Listed]:
    """The object `url` (`gs://BUCKET/NAME`) as `list_objects` gives it, or None when there is none: one request,
    `GET https://www.googleapis.com/storage/v1/b/BUCKET/o/NAME?fields=name,size,updated,generation`
    (https://cloud.google.com/storage/docs/json_api/v1/objects/get).

    Raises:
      ListingUnavailable: as `list_objects`.
    """
    environ = os.environ if environ is None else environ
    bucket, name = _split(url)
    api_url = (f"{STORAGE_API}{urllib.parse.quote(bucket, safe='')}/o/{urllib.parse.quote(name, safe='')}?"
               f"{urllib.parse.urlencode({'fields': _OBJECT_FIELDS})}")
    _counts["lookups"] = _counts.get("lookups", 0) + 1
    item = _get_json(url, api_url, environ)
    if item is None:
        return None
    try:
        return _listed(bucket, item)
    except (KeyError, TypeError, ValueError) as e:
        raise _unavailable(f"{url}: an object resource not understood ({e!r})") from None


def counts() -> dict:
    """What the listings cost in this process: {"pages": listing requests, "lookups": object requests,
    "fallbacks": times TensorFlow's way was taken instead (`ListingUnavailable`)}."""
    return {k: _counts.get(k, 0) for k in ("pages", "lookups", "fallbacks")}


def reset() -> None:
    """Forget the probe's outcome, the held token and the listings' counts (tests)."""
    _checked.clear()
    _counts.clear()
    _warned.clear()
