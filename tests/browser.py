"""A page opened as a person opens it: Debian's Chromium, headless, driven over the DevTools protocol, with the
network blocked (offline emulation, a proxy that does not exist, every host name unresolvable).

`open_offline(path)` loads a local file and returns what a test checks: every request that left for the network
(none may), every failed load, console message and uncaught exception, the tables' cells (`data-value` where a cell
has one, else its text), each figure's rendered size and whether it holds any non-white pixel, and a PNG
screenshot of the whole page. The DevTools port listens on 127.0.0.1 only and the browser is killed after the
page, also on failure.
"""
from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
UNAVAILABLE = None if CHROMIUM else ("no chromium on PATH: `make install` installs Debian's package with the test "
                                     "extra (tools/install.sh)")

_TABLES = """JSON.stringify([...document.querySelectorAll('table')].map(t => ({id: t.id,
  rows: [...t.rows].map(r => [...r.cells].map(c => c.dataset.value !== undefined ? c.dataset.value
                                                                                 : c.textContent))})))"""
_FIGURES = """JSON.stringify([...document.querySelectorAll('figure > svg, figure > img')].map(e => {
  const r = e.getBoundingClientRect();
  return {tag: e.tagName, x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height,
          complete: e.tagName !== 'IMG' || (e.complete && e.naturalWidth > 0)};
}))"""


class _Session:
    def __init__(self, ws_url: str):
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=30, http_no_proxy=["127.0.0.1"])
        self.next_id, self.events = 0, []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout_s} s")
            self.events.append(json.loads(self.ws.recv()))


def _inked(png: bytes) -> bool:
    """Whether a PNG holds any pixel that is not white (a drawn plot)."""
    import matplotlib.image

    pixels = matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3]
    return bool((pixels < 0.95).any())


def open_offline(path: str, *, width: int = 1200, height: int = 900) -> dict:
    """Load the local file `path` in headless Chromium with the network blocked.

    Returns:
      {"requests": URLs requested other than file: and data:, "failed": [(url, errorText)], "console": [(level,
       text)] (console calls and log entries), "exceptions": [text], "tables": {id: rows of cells}, "figures":
       [{"tag", "width", "height", "complete", "inked"}], "screenshot": PNG bytes of the whole page}.
    """
    profile = tempfile.mkdtemp(prefix="harness-chromium-")
    proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-extensions", "--disable-background-networking", "--disable-sync",
                             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                             f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9",
                             "--host-resolver-rules=MAP * ~NOTFOUND", f"--window-size={width},{height}",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file) and open(port_file).read().count("\n") >= 1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start: {proc.stderr.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.05)
        port = int(open(port_file).read().split()[0])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        targets = json.loads(opener.open(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(t for t in targets if t["type"] == "page")
        s = _Session(page["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            s.call(f"{domain}.enable")
        s.call("Network.emulateNetworkConditions", offline=True, latency=0, downloadThroughput=-1,
               uploadThroughput=-1)
        s.call("Page.navigate", url="file://" + os.path.abspath(path))
        s.wait_for("Page.loadEventFired")
        tables = {t["id"]: t["rows"] for t in json.loads(s.call("Runtime.evaluate", expression=_TABLES)["result"]["value"])}
        figures = json.loads(s.call("Runtime.evaluate", expression=_FIGURES)["result"]["value"])
        for f in figures:
            clip = {"x": f["x"], "y": f["y"], "width": max(f["width"], 1), "height": max(f["height"], 1), "scale": 1}
            shot = s.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)
            f["inked"] = f["width"] > 0 and f["height"] > 0 and _inked(base64.b64decode(shot["data"]))
        screenshot = base64.b64decode(s.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
        events = s.events
        s.ws.close()
    finally:
        proc.kill()
        proc.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)
    params = [(e["method"], e.get("params", {})) for e in events if "method" in e]
    return {
        "requests": [p["request"]["url"] for m, p in params if m == "Network.requestWillBeSent"
                     and not p["request"]["url"].startswith(("file:", "data:"))],
        "failed": [(p.get("requestId"), p.get("errorText")) for m, p in params if m == "Network.loadingFailed"],
        "console": [(p.get("type"), " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
                    for m, p in params if m == "Runtime.consoleAPICalled"] +
                   [(p["entry"]["level"], p["entry"]["text"]) for m, p in params if m == "Log.entryAdded"],
        "exceptions": [p["exceptionDetails"].get("text", "") for m, p in params if m == "Runtime.exceptionThrown"],
        "tables": tables, "figures": figures, "screenshot": screenshot,
    }
