"""Earth Engine's side of the loopback bed (tests/gcs_bed.py): the hosts the real `earthengine` CLI (earthengine-api)
talks to for `earthengine upload image`, answered by stand-ins inside the bed's proxy. Nothing here is Earth Engine;
what is real is the client: the CLI, its credentials, googleapiclient's discovery and request building, google-auth's
token refresh, all reaching these answers over the proxy's TLS tunnels.

What the CLI asks, read from earthengine-api 1.7 (ee/cli/eecli.py, ee/cli/commands.py UploadImageCommand,
ee/__init__.py Initialize, ee/data.py, ee/_cloud_api_utils.py, ee/oauth.py, ee/deprecation.py):
  POST oauth2.googleapis.com/token        google-auth refreshes the stored refresh token (`oauth.TOKEN_URI`); the
                                          stand-in takes REFRESH_TOKEN only and gives the bed's access token.
  GET  earthengine.googleapis.com/$discovery/rest?version=v1&prettyPrint=false
                                          `build_cloud_resource`'s discovery document (googleapiclient ships no
                                          static copy of Earth Engine's); DISCOVERY is a minimal one: the two
                                          methods below, as the real document names them, and the global
                                          parameters the client passes.
  GET  earthengine.googleapis.com/v1/projects/P/algorithms    `ApiFunction.initialize`: ALGORITHMS, one.
  POST earthengine.googleapis.com/v1/projects/P/image:import  `ee.data.startIngestion`: the body is recorded, the
                                          answer is a pending Operation (the CLI does not wait without --wait).
  GET  storage.googleapis.com/earthengine-stac/catalog/catalog_deprecated.json
                                          `ee.deprecation`'s public catalogue of deprecated datasets (no token):
                                          an empty catalogue.
Every Earth Engine call needs the bed's bearer token (else 401). Each answered request is a JSON line of
`earthengine.log` in the bed's folder: method, host, path, status, and the JSON body of a POST to the API.
The project: the CLI's config file (~/.config/earthengine/credentials) holds it as `project`, as `earthengine
set_project` writes it, and the client uses it as the quota project and in the request paths.
"""
from __future__ import annotations

import json
import os
import re
import threading
import urllib.parse

HOSTS = ("earthengine.googleapis.com", "oauth2.googleapis.com")
REFRESH_TOKEN = "harness-test-refresh-token"
PROJECT = "my-project"
CATALOG = ("storage.googleapis.com", "/earthengine-stac/catalog/catalog_deprecated.json")
LOG = "earthengine.log"

_GLOBAL = {name: {"location": "query", "type": kind} for name, kind in (
    ("$.xgafv", "string"), ("access_token", "string"), ("alt", "string"), ("callback", "string"),
    ("fields", "string"), ("key", "string"), ("oauth_token", "string"), ("prettyPrint", "boolean"),
    ("quotaUser", "string"), ("uploadType", "string"), ("upload_protocol", "string"))}
_PROJECT_PARAM = {"location": "path", "required": True, "pattern": "^projects/[^/]+$", "type": "string"}
DISCOVERY = {
    "kind": "discovery#restDescription", "discoveryVersion": "v1", "id": "earthengine:v1", "name": "earthengine",
    "version": "v1", "protocol": "rest", "rootUrl": "https://earthengine.googleapis.com/", "servicePath": "",
    "baseUrl": "https://earthengine.googleapis.com/", "batchPath": "batch", "parameters": _GLOBAL,
    "schemas": {
        "ListAlgorithmsResponse": {"id": "ListAlgorithmsResponse", "type": "object",
                                   "properties": {"algorithms": {"type": "array", "items": {"type": "object"}}}},
        "ImportImageRequest": {"id": "ImportImageRequest", "type": "object",
                               "properties": {"imageManifest": {"type": "object"}, "overwrite": {"type": "boolean"},
                                              "requestId": {"type": "string"}}},
        "Operation": {"id": "Operation", "type": "object",
                      "properties": {"name": {"type": "string"}, "done": {"type": "boolean"},
                                     "metadata": {"type": "object"}}},
    },
    "resources": {"projects": {"resources": {
        "algorithms": {"methods": {"list": {
            "id": "earthengine.projects.algorithms.list", "httpMethod": "GET", "path": "v1/{+parent}/algorithms",
            "flatPath": "v1/projects/{projectsId}/algorithms", "parameterOrder": ["parent"],
            "parameters": {"parent": _PROJECT_PARAM}, "response": {"$ref": "ListAlgorithmsResponse"}}}},
        "image": {"methods": {"import": {
            "id": "earthengine.projects.image.import", "httpMethod": "POST", "path": "v1/{+project}/image:import",
            "flatPath": "v1/projects/{projectsId}/image:import", "parameterOrder": ["project"],
            "parameters": {"project": _PROJECT_PARAM}, "request": {"$ref": "ImportImageRequest"},
            "response": {"$ref": "Operation"}}}},
    }}},
}
# One algorithm (`Image.load`, as the real list gives it): the client asks again, per class it sets up, while its
# list is empty.
ALGORITHMS = {"algorithms": [{
    "name": "algorithms/Image.load", "description": "Loads an image by ID.", "returnType": "Image",
    "arguments": [{"argumentName": "id", "type": "String", "description": "The asset ID of the image."},
                  {"argumentName": "version", "type": "Long", "optional": True,
                   "description": "The version of the asset. -1 signifies the latest version."}]}]}
_ALGORITHMS = re.compile(r"^/v1/(projects/[^/]+)/algorithms$")
_IMPORT = re.compile(r"^/v1/(projects/[^/]+)/image:import$")


def serves(host: str, path: str) -> bool:
    """Whether a request of the tunnel to `host` is answered here rather than by the Cloud Storage emulator."""
    return host in HOSTS or (host, urllib.parse.urlsplit(path).path) == CATALOG


class EarthEngine:
    """The stand-ins, in the bed's child process; `answer` is called per request with the bed's access token."""

    def __init__(self, workdir: str, token: str):
        self.log, self.token, self.lock, self.imports = os.path.join(workdir, LOG), token, threading.Lock(), 0

    def answer(self, method: str, host: str, target: str, headers, body: bytes) -> tuple[int, list, bytes]:
        path, query = urllib.parse.urlsplit(target)[2:4]
        status, out, posted = self._route(method, host, path, urllib.parse.parse_qs(query), headers, body)
        record = {"method": method, "host": host, "path": target, "status": status}
        if posted is not None:
            record["body"] = posted
        with self.lock, open(self.log, "a") as f:
            f.write(json.dumps(record) + "\n")
        return status, [("Content-Type", "application/json")], json.dumps(out).encode()

    def _route(self, method, host, path, query, headers, body):
        if (host, path) == CATALOG:
            return (200, {"links": []}, None) if method == "GET" else (405, _error(405), None)
        if host == "oauth2.googleapis.com":
            form = urllib.parse.parse_qs(body.decode())
            if (method, path) != ("POST", "/token") or form.get("grant_type") != ["refresh_token"]:
                return 404, _error(404), None
            if form.get("refresh_token") != [REFRESH_TOKEN]:
                return 400, {"error": "invalid_grant", "error_description": "Bad Request"}, None
            return 200, {"access_token": self.token, "expires_in": 3600, "token_type": "Bearer",
                         "scope": " ".join(form.get("scope", []))}, None
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, _error(401), None
        if method == "GET" and path == "/$discovery/rest" and query.get("version") == ["v1"]:
            return 200, DISCOVERY, None
        if method == "GET" and _ALGORITHMS.match(path):
            return 200, ALGORITHMS, None
        found = _IMPORT.match(path)
        if method == "POST" and found:
            posted = json.loads(body or b"{}")
            with self.lock:
                self.imports += 1
                n = self.imports
            name = f"{found.group(1)}/operations/IMPORT{n:04d}"
            return 200, {"name": name, "done": False, "metadata": {
                "@type": "type.googleapis.com/google.earthengine.v1.OperationMetadata", "state": "PENDING",
                "type": "INGEST_IMAGE",
                "description": f"Asset ingestion: {posted.get('imageManifest', {}).get('name')}"}}, posted
        return 404, _error(404), None


def _error(code: int) -> dict:
    return {"error": {"code": code, "message": "not served by the harness test bed", "status": str(code)}}


# --- the parent's side -------------------------------------------------------------------------------------------
def write_credentials(home: str, project: str = PROJECT) -> str:
    """HOME/.config/earthengine/credentials as `earthengine authenticate` and `earthengine set_project` leave it
    (a refresh token for the stand-in, the client project); returns its path."""
    path = os.path.join(home, ".config", "earthengine", "credentials")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"refresh_token": REFRESH_TOKEN, "project": project}, f)
    return path


def calls(workdir: str) -> list[dict]:
    """The requests the stand-ins answered so far (the JSON lines of `earthengine.log`), in order."""
    try:
        with open(os.path.join(workdir, LOG)) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
