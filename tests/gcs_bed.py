"""A Cloud Storage bucket on loopback for tests and benchmarks: TensorFlow's own `gs://` file system talks to it.

TensorFlow 2.18's built-in GCS file system (tsl/platform/cloud/gcs_file_system.cc) has its endpoints compiled in
(`https://www.googleapis.com/storage/v1/`, `.../upload/storage/v1/`, and `https://storage.googleapis.com/BUCKET/
OBJECT` for reads) and no variable to change them. What it does read: libcurl's proxy variables (`https_proxy`,
`http_proxy`, `no_proxy`), `CURL_CA_BUNDLE` (the CA file its curl trusts, curl_http_request.cc) and
`GCE_METADATA_HOST` (where it asks for an access token when no key file is set, google_auth_provider.cc). So the
bed, one child process started by `GcsBed`, serves on 127.0.0.1 only, each on a port the kernel picks:
  proxy     an HTTP proxy that accepts `CONNECT storage.googleapis.com:443` and `CONNECT www.googleapis.com:443`
            (and Earth Engine's two, below) and nothing else (any other host, port or plain-HTTP request gets 403
            and is recorded in `refused.log`): nothing is ever forwarded off this host. A tunnel it accepts it
            answers itself: TLS with a certificate for those names, signed by a CA the bed made (`ca.pem`,
            `CURL_CA_BUNDLE`), then each request, with the bearer token checked, is passed on to
  emulator  gcp-storage-emulator (PyPI; the JSON API, media downloads at /BUCKET/OBJECT, resumable uploads,
            rewrite), in memory, one bucket. Its resumable-upload `Location` answers name `http://HOST/...`; the
            proxy turns them into `https://` so the upload goes back through the tunnel.
  metadata  a Compute Engine metadata server stand-in (`Metadata-Flavor: Google`, a fixed access token), which
            both `harness.data.export.gcs.check_access` and TensorFlow's token fetch accept.
  earthengine  the proxy also accepts `earthengine.googleapis.com:443` and `oauth2.googleapis.com:443`, whose
            tunnels (and one public object of storage.googleapis.com) get stand-ins of the few Earth Engine API
            and OAuth calls that `earthengine upload image` makes (tests/earthengine_bed.py), so the real Earth
            Engine CLI uploads from this bucket.
`GcsBed.env()` gives a process the variables that point it there. Every request the proxy served is a line of
`requests.log` (method, host, path, status), so a test can see which ones TensorFlow made.

  python tests/gcs_bed.py WORKDIR BUCKET     (what GcsBed starts; it writes WORKDIR/bed.json when serving)
"""
from __future__ import annotations

import datetime
import http.client
import http.server
import json
import os
import signal
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse

import earthengine_bed

HOSTS = ("storage.googleapis.com", "www.googleapis.com")   # TensorFlow's endpoints (gcs_file_system.cc)
TUNNELS = HOSTS + earthengine_bed.HOSTS                    # the hosts the proxy answers for
TOKEN = "harness-test-token"
START_S = 60.0            # the child's start (imports, key generation) on a loaded 2-core machine


# --- the child: CA, emulator, proxy, metadata server ---------------------------------------------------------------
def _certificates(workdir: str) -> tuple[str, str, str]:
    """A CA and a server certificate for TUNNELS signed by it (P-256, valid one day either side of now); returns the
    paths of ca.pem, server.pem and server.key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)

    def cert(subject, key, issuer, issuer_key, extensions):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - day).not_valid_after(now + day))
        for ext, critical in extensions:
            b = b.add_extension(ext, critical=critical)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "harness test CA")])
    ca = cert(ca_name, ca_key, ca_name, ca_key, [(x509.BasicConstraints(ca=True, path_length=0), True),
                                                 (x509.KeyUsage(False, False, False, False, False, True, True, False,
                                                                False), True)])
    server = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[0])]), key, ca_name, ca_key,
                  [(x509.SubjectAlternativeName([x509.DNSName(h) for h in TUNNELS]), False),
                   (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
                   (x509.BasicConstraints(ca=False, path_length=None), True)])
    paths = [os.path.join(workdir, n) for n in ("ca.pem", "server.pem", "server.key")]
    pem = serialization.Encoding.PEM
    for path, data in zip(paths, (ca.public_bytes(pem), server.public_bytes(pem),
                                  key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))):
        with open(path, "wb") as f:
            f.write(data)
    return paths[0], paths[1], paths[2]


def _patch_emulator() -> None:
    """gcp-storage-emulator reads an empty request body as None, and its media upload then fails on `len(None)`:
    TensorFlow's CreateDir (`tf.io.gfile.makedirs`) uploads an empty `DIR/` marker that way. Empty bodies of
    uploads read as b""."""
    from gcp_storage_emulator import server

    read = server._read_data

    def read_data(handler, query):
        data = read(handler, query)
        return b"" if data is None and ("uploadType" in query or "upload_id" in query) else data
    server._read_data = read_data


class _Log:
    def __init__(self, path):
        self.path, self.lock = path, threading.Lock()

    def write(self, line: str) -> None:
        with self.lock, open(self.path, "a") as f:
            f.write(line + "\n")


class _Front(http.server.BaseHTTPRequestHandler):
    """The Google side of an accepted tunnel: checks the token, passes the request to the emulator, sends back its
    answer (resumable-upload Locations turned to https); Earth Engine's requests go to its stand-ins."""
    protocol_version = "HTTP/1.1"
    host = ""             # the tunnel's host, set per tunnel

    def log_message(self, *args):
        pass

    def _forward(self):
        bed = self.server.bed
        body = self._body()
        status, headers, data = 401, [("Content-Type", "application/json")], b'{"error": {"code": 401}}'
        if earthengine_bed.serves(self.host, self.path):
            status, headers, data = bed.earthengine.answer(self.command, self.host, self.path, self.headers, body)
        elif self.headers.get("Authorization") == f"Bearer {TOKEN}":
            failing = bed.failing(self.command, self.host, self.path)
            if failing:
                status, data = failing, json.dumps({"error": {"code": failing, "message": "rate limit (bed)"}}).encode()
            elif self.host == "www.googleapis.com" and not self.path.startswith(("/storage/v1/", "/upload/storage/v1/")):
                status, data = 404, b'{"error": {"code": 404}}'
            else:
                status, headers, data = bed.emulate(self.command, self.path, self.headers, body, self.host)
        bed.requests.write(f"{self.command} {self.host} {self.path} {status}")
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        """The request's body. TensorFlow's uploads come chunked, with a Content-Length beside it that HTTP/1.1
        says to ignore then (RFC 9112, section 6.3); the emulator is given the whole body with its length."""
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""
        parts = []
        while True:
            size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):    # trailers
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline(8)                                           # the chunk's CRLF

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward


class _Connect(socketserver.StreamRequestHandler):
    """One client connection to the proxy: a CONNECT to TUNNELS:443 becomes a TLS tunnel served by `_Front`; anything
    else is answered 403 and recorded."""

    def handle(self):
        line = self.rfile.readline(8192).decode("latin-1").strip()
        while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
            pass
        method, target = (line.split(" ") + ["", ""])[:2]
        host, _, port = target.rpartition(":")
        bed = self.server.bed
        if method != "CONNECT" or host not in TUNNELS or port != "443":
            bed.refused.write(line)
            self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            tls = bed.tls.wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            type("Front", (_Front,), {"host": host})(tls, self.client_address, self.server)
        except (ssl.SSLError, OSError):
            pass
        finally:
            tls.close()


class _Metadata(http.server.BaseHTTPRequestHandler):
    """The metadata server stand-in: the flavour header always, the token at the service account's token path."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        ok = self.headers.get("Metadata-Flavor") == "Google"
        token = self.path.startswith("/computeMetadata/v1/instance/service-accounts/default/token")
        data = json.dumps({"access_token": TOKEN, "expires_in": 3600, "token_type": "Bearer"}).encode() \
            if ok and token else b""
        self.send_response(403 if not ok else 200 if token or self.path == "/computeMetadata/v1/" else 404)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Child:
    def __init__(self, workdir: str, bucket: str):
        import logging

        from gcp_storage_emulator.server import create_server

        logging.getLogger().setLevel(logging.CRITICAL)   # the emulator logs a warning per answer
        _patch_emulator()
        ca, cert, key = _certificates(workdir)
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(cert, key)
        self.workdir, self.bucket = workdir, bucket
        self.requests, self.refused = _Log(os.path.join(workdir, "requests.log")), _Log(
            os.path.join(workdir, "refused.log"))
        self.earthengine = earthengine_bed.EarthEngine(workdir, TOKEN)
        self.emulator = create_server("127.0.0.1", 0, in_memory=True, default_bucket=bucket)
        self.emulator.start()
        self.emulator_port = self.emulator._api._httpd.server_address[1]
        self.lock = threading.Lock()      # the emulator serves one request at a time (http.server.HTTPServer)
        socketserver.ThreadingTCPServer.daemon_threads = True
        self.proxy = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Connect)
        self.metadata = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
        self.proxy.bed = self
        for s in (self.proxy, self.metadata):
            threading.Thread(target=s.serve_forever, daemon=True).start()
        info = {"proxy": self.proxy.server_address[1], "metadata": self.metadata.server_address[1],
                "emulator": self.emulator_port, "ca": ca, "bucket": bucket, "pid": os.getpid()}
        with open(os.path.join(workdir, "bed.json.tmp"), "w") as f:
            json.dump(info, f)
        os.replace(os.path.join(workdir, "bed.json.tmp"), os.path.join(workdir, "bed.json"))

    def failing(self, method, host, path) -> int:
        """The error status to answer a media read with, per `faults.json` (`GcsBed.fail`), else 0: a GET of
        storage.googleapis.com whose path holds the rule's object name, once the rule's trigger object exists."""
        try:
            with open(os.path.join(self.workdir, "faults.json")) as f:
                rules = json.load(f)
        except FileNotFoundError:
            return 0
        for rule in rules:
            if method == "GET" and host == "storage.googleapis.com" and rule["object"] in path:
                trigger = rule.get("when")
                if trigger is None or self._exists(trigger):
                    return int(rule["status"])
        return 0

    def _exists(self, name: str) -> bool:
        status, _, _ = self.emulate("GET", f"/storage/v1/b/{self.bucket}/o/" + urllib.parse.quote(name, safe=""),
                                    {}, b"", "www.googleapis.com")
        return status == 200

    def emulate(self, method, path, headers, body, host):
        """(status, headers, body) of the emulator's answer to one request of the tunnel to `host`."""
        keep = {k: v for k, v in headers.items()
                if k.lower() not in ("host", "expect", "connection", "proxy-connection", "content-length",
                                     "transfer-encoding", "authorization")}
        with self.lock:
            conn = http.client.HTTPConnection("127.0.0.1", self.emulator_port, timeout=120)
            try:
                conn.request(method, path, body=body, headers={**keep, "Host": host})
                answer = conn.getresponse()
                data, status = answer.read(), answer.status
                out = [(k, v.replace(f"http://{host}/", f"https://{host}/") if k.lower() == "location" else v)
                       for k, v in answer.getheaders()
                       if k.lower() not in ("content-length", "connection", "transfer-encoding", "server", "date")]
            finally:
                conn.close()
        return status, out, data

    def stop(self):
        for s in (self.proxy, self.metadata):
            s.shutdown()
            s.server_close()
        self.emulator.stop()


def _serve(workdir: str, bucket: str) -> None:
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    child = _Child(workdir, bucket)
    try:
        done.wait()
    finally:
        child.stop()


# --- the parent's handle ---------------------------------------------------------------------------------------------
class GcsBedError(RuntimeError):
    """The bed did not start (the message has the child's output), or the emulator refused a setup request."""


class GcsBed:
    """The bed's child process and what tests need of it: the environment that routes TensorFlow's `gs://` to it,
    and uploads, listings and reads straight through the emulator's JSON API (setup and checks that do not go
    through the code under test).

    Args:
      workdir: an empty folder for the CA, the logs and the child's output.
      bucket: the one bucket the emulator holds (empty at the start).
    Use as a context manager; `stop()` ends the child (SIGTERM, then SIGKILL after 10 s) and is safe to repeat.
    Raises:
      GcsBedError: from `start()`, when the child exits or is not serving within START_S seconds.
    """

    def __init__(self, workdir: str, bucket: str = "bucket"):
        self.workdir, self.bucket = str(workdir), bucket
        self.proc, self.info = None, None

    def start(self) -> "GcsBed":
        os.makedirs(self.workdir, exist_ok=True)
        self._out = open(os.path.join(self.workdir, "bed.out"), "w")
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.workdir, self.bucket],
                                     stdout=self._out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + START_S
        ready = os.path.join(self.workdir, "bed.json")
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(os.path.join(self.workdir, "bed.out")) as f:
                    raise GcsBedError(f"the GCS bed did not start (exit {self.proc.returncode}):\n{f.read()[-3000:]}")
            time.sleep(0.05)
        with open(ready) as f:
            self.info = json.load(f)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "_out", None):
            self._out.close()
            self._out = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def url(self, *parts: str) -> str:
        """`gs://BUCKET/part/part...`."""
        return "/".join([f"gs://{self.bucket}", *parts])

    def env(self, base=None) -> dict:
        """`base` (default os.environ) with TensorFlow's GCS file system routed to the bed: the proxy for https
        and http (loopback excepted, so the metadata server is reached directly), the bed's CA (for curl, and for
        Python's requests, httplib2 and ssl: the Earth Engine CLI), the metadata server as the token source; no
        key file, an empty gcloud config folder (so no user's credentials are used), and TensorFlow's GCS retries
        cut to 2 after 0.1 s (a failing test fails in seconds, not minutes; read when TensorFlow loads)."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_AUTH_TOKEN_FOR_TESTING")
               and "proxy" not in k.lower()}
        proxy = f"http://127.0.0.1:{self.info['proxy']}"
        gcloud = os.path.join(self.workdir, "gcloud")
        os.makedirs(gcloud, exist_ok=True)
        env.update(https_proxy=proxy, HTTPS_PROXY=proxy, http_proxy=proxy, HTTP_PROXY=proxy,
                   no_proxy="127.0.0.1,localhost", NO_PROXY="127.0.0.1,localhost", CURL_CA_BUNDLE=self.info["ca"],
                   REQUESTS_CA_BUNDLE=self.info["ca"], HTTPLIB2_CA_CERTS=self.info["ca"], SSL_CERT_FILE=self.info["ca"],
                   GCE_METADATA_HOST=f"127.0.0.1:{self.info['metadata']}", CLOUDSDK_CONFIG=gcloud,
                   GCS_RETRY_CONFIG_MAX_RETRIES="2", GCS_RETRY_CONFIG_INIT_DELAY_TIME_US="100000")
        return env

    # straight to the emulator (loopback HTTP, not through TensorFlow)
    def _call(self, method: str, path: str, body: bytes = b"", headers=None) -> bytes:
        conn = http.client.HTTPConnection("127.0.0.1", self.info["emulator"], timeout=120)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            answer = conn.getresponse()
            data = answer.read()
        finally:
            conn.close()
        if answer.status >= 300:
            raise GcsBedError(f"emulator: {method} {path}: HTTP {answer.status} {data[:200]!r}")
        return data

    def _name(self, url: str) -> str:
        prefix = f"gs://{self.bucket}/"
        if not url.startswith(prefix):
            raise GcsBedError(f"{url}: not in gs://{self.bucket}/")
        return url[len(prefix):]

    def put(self, url: str, data: bytes) -> dict:
        """Upload `data` as the object `url` (replacing one of that name); returns its object resource."""
        name = urllib.parse.quote(self._name(url), safe="")
        return json.loads(self._call("POST", f"/upload/storage/v1/b/{self.bucket}/o?uploadType=media&name={name}",
                                     data, {"Content-Type": "application/octet-stream"}))

    def upload_tree(self, folder: str, url: str) -> list[str]:
        """Upload every file under the local `folder` to `url/<relative path>`; returns the object URLs, sorted."""
        urls = []
        for root, _, files in os.walk(folder):
            for name in files:
                path = os.path.join(root, name)
                target = "/".join([url.rstrip("/"), os.path.relpath(path, folder).replace(os.sep, "/")])
                with open(path, "rb") as f:
                    self.put(target, f.read())
                urls.append(target)
        return sorted(urls)

    def objects(self, url: str = "") -> dict:
        """{gs:// URL: object resource} of every object whose name starts with `url`'s name."""
        prefix = self._name(url) if url else ""
        listing = json.loads(self._call("GET", f"/storage/v1/b/{self.bucket}/o?prefix="
                                        + urllib.parse.quote(prefix, safe="")))
        return {f"gs://{self.bucket}/{o['name']}": o for o in listing.get("items", [])}

    def get(self, url: str) -> bytes:
        """The bytes of the object `url`."""
        return self._call("GET", f"/download/storage/v1/b/{self.bucket}/o/"
                          + urllib.parse.quote(self._name(url), safe="") + "?alt=media")

    def fail(self, url: str, *, status: int = 429, when: str = "") -> None:
        """From now on (and, with `when`, once that object exists), answer every media read of the objects whose
        names hold `url`'s name with HTTP `status` (Cloud Storage's 429: rate and egress limits). `clear_faults`
        ends it."""
        rule = {"object": urllib.parse.quote(self._name(url), safe=""), "status": status,
                "when": self._name(when) if when else None}
        path = os.path.join(self.workdir, "faults.json")
        with open(path + ".tmp", "w") as f:
            json.dump([rule], f)
        os.replace(path + ".tmp", path)

    def clear_faults(self) -> None:
        try:
            os.remove(os.path.join(self.workdir, "faults.json"))
        except FileNotFoundError:
            pass

    def requests(self) -> list[str]:
        """The requests the proxy served so far, `METHOD HOST PATH STATUS` each."""
        return _lines(os.path.join(self.workdir, "requests.log"))

    def refused(self) -> list[str]:
        """The proxy requests it refused so far (their request lines): any host but TUNNELS, any plain HTTP."""
        return _lines(os.path.join(self.workdir, "refused.log"))

    def earthengine(self) -> list[dict]:
        """The requests Earth Engine's stand-ins answered so far (tests/earthengine_bed.py `calls`)."""
        return earthengine_bed.calls(self.workdir)


def _lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
