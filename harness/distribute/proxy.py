"""The workers' gRPC kept off an HTTP proxy (tensorflow#24887).

gRPC's C core, which TensorFlow's collectives and coordination service use, sends every channel through the proxy
that `grpc_proxy`, else `https_proxy`, else `http_proxy` names (lower case only), unless the target host is in
`no_grpc_proxy`, else `no_proxy` (src/core/handshaker/http_connect/http_proxy_mapper.cc). A pod or host with a
proxy for the internet and no `no_proxy` for the cluster sent the workers' gRPC to the proxy, and the job hung at
the start (or failed after the worker wait). The harness knows the peers (`TF_CONFIG`, or the Indexed Job's):
before TensorFlow's gRPC starts it adds every peer host that the list gRPC reads does not cover to `no_proxy`,
`NO_PROXY` (what curl and Python read) and `no_grpc_proxy` where that is set, for this process and what it
starts, and says so in one line (the proxy's value, which may hold a password, is not printed).
"""
from __future__ import annotations

import os
from typing import MutableMapping, Optional

PROXY_NAMES = ("grpc_proxy", "https_proxy", "http_proxy")   # gRPC's order
NO_PROXY_NAMES = ("no_grpc_proxy", "no_proxy")              # gRPC reads the first one set


def peer_hosts(config) -> list[str]:
    """The hosts of every task of `config` (`environment.TFConfig`), in rank order, each once."""
    hosts = []
    for task_type, index in config.tasks():
        address = config.cluster[task_type][index]
        host = address[1:].split("]", 1)[0] if address.startswith("[") else address.rsplit(":", 1)[0]
        if host not in hosts:
            hosts.append(host)
    return hosts


def covers(entries: str, host: str) -> bool:
    """Whether the no-proxy list `entries` covers `host`: `*`, the host itself, or a domain it ends in (as gRPC,
    curl and Python match them; a CIDR range is not read, so such a host is added by name)."""
    host = host.lower()
    for entry in (e.strip().lower() for e in entries.split(",")):
        if entry == "*" or entry == host or (entry and host.endswith("." + entry.lstrip("."))):
            return True
    return False


def keep_peers_off_proxy(config, environ: Optional[MutableMapping[str, str]] = None) -> Optional[str]:
    """Add the peers' hosts of `config` that gRPC would send through a proxy to the no-proxy variables of
    `environ` (default `os.environ`). Returns the line that says so, None when no proxy is set or every peer is
    already off it."""
    environ = os.environ if environ is None else environ
    proxy = next((n for n in PROXY_NAMES if environ.get(n, "").strip()), None)
    if proxy is None or config is None:
        return None
    read = next((n for n in NO_PROXY_NAMES if n in environ), "no_proxy")
    missing = [h for h in peer_hosts(config) if not covers(environ.get(read, ""), h)]
    if not missing:
        return None
    names = [n for n in ("no_grpc_proxy", "no_proxy", "NO_PROXY") if n != "no_grpc_proxy" or n in environ]
    for name in names:
        have = environ.get(name, "").strip().strip(",")
        environ[name] = ",".join(filter(None, [have, *(h for h in missing if not covers(have, h))]))
    return (f"harness: {proxy} is set and {read} did not cover the peers: added {', '.join(missing)} to "
            f"{', '.join(names)} for this process, so TensorFlow's gRPC between the workers does not go through the "
            "proxy")
