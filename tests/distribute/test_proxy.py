"""The workers' gRPC kept off an HTTP proxy (tensorflow#24887): the peers of TF_CONFIG added to the no-proxy
variables before TensorFlow's gRPC starts, in one line; in-process."""
import json

import pytest

from harness.distribute import environment, proxy, strategy

CONFIG = environment.read_tf_config({"TF_CONFIG": json.dumps({
    "cluster": {"chief": ["trainer-0.trainers:2222"], "worker": ["10.0.0.2:2222", "[fd00::3]:2222", "10.0.0.2:2223"]},
    "task": {"type": "worker", "index": 0}})})
SECRET = "http://user:hx-proxy-password@proxy.corp:3128"


def test_the_peers_are_added_to_what_grpc_reads_and_the_line_says_so():
    env = {"https_proxy": SECRET, "no_proxy": "localhost,.corp"}
    line = proxy.keep_peers_off_proxy(CONFIG, env)
    assert line == ("harness: https_proxy is set and no_proxy did not cover the peers: added "
                    "trainer-0.trainers, 10.0.0.2, fd00::3 to no_proxy, NO_PROXY for this process, so TensorFlow's "
                    "gRPC between the workers does not go through the proxy")
    assert env["no_proxy"] == "localhost,.corp,trainer-0.trainers,10.0.0.2,fd00::3"
    assert env["NO_PROXY"] == "trainer-0.trainers,10.0.0.2,fd00::3" and SECRET not in line
    assert proxy.keep_peers_off_proxy(CONFIG, env) is None            # covered now: nothing said again
    # gRPC reads no_grpc_proxy before no_proxy: a peer in no_proxy only is still proxied
    env = {"http_proxy": SECRET, "no_grpc_proxy": "", "no_proxy": ".trainers,10.0.0.2,fd00::3"}
    assert "http_proxy is set and no_grpc_proxy did not cover" in proxy.keep_peers_off_proxy(CONFIG, env)
    assert env["no_grpc_proxy"] == "trainer-0.trainers,10.0.0.2,fd00::3" and env["no_proxy"] == ".trainers,10.0.0.2,fd00::3"
    # covered already (a domain, `*`), or no proxy gRPC reads (upper case, all_proxy): untouched
    for env in ({"https_proxy": SECRET, "no_proxy": "*"}, {"HTTPS_PROXY": SECRET, "all_proxy": SECRET},
                {"https_proxy": SECRET, "no_proxy": "trainers, 10.0.0.2 ,fd00::3"}):
        before = dict(env)
        assert proxy.keep_peers_off_proxy(CONFIG, env) is None and env == before


class _Waited(Exception):
    pass


def test_the_strategy_sets_it_before_its_first_connection(monkeypatch, capsys):
    """`_multi_worker` as a worker runs it: the variables are set and the line printed before the peer wait (the
    wait stands in here: it raises, so no strategy is built)."""
    for name in ("grpc_proxy", "http_proxy", "no_grpc_proxy", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("https_proxy", SECRET)
    seen = {}

    def wait(config, timeout_s):
        import os
        seen["no_proxy"] = os.environ.get("no_proxy")
        raise _Waited

    monkeypatch.setattr(strategy, "_runtime_started", lambda: False)
    monkeypatch.setattr(strategy, "wait_for_workers", wait)
    with pytest.raises(_Waited):
        strategy._multi_worker(CONFIG, 0, None, 1.0)
    assert seen["no_proxy"] == "trainer-0.trainers,10.0.0.2,fd00::3"
    assert capsys.readouterr().err.splitlines() == [
        "harness: https_proxy is set and no_proxy did not cover the peers: added trainer-0.trainers, 10.0.0.2, "
        "fd00::3 to no_proxy, NO_PROXY for this process, so TensorFlow's gRPC between the workers does not go "
        "through the proxy"]
