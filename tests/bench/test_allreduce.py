"""`harness bench allreduce`: the ring model's fit on hand-computed cases, and the command on 2 real workers
(MultiWorkerMirroredStrategy from TF_CONFIG under `harness launch local`, Horovod under horovodrun)."""
import json
import os
import pathlib
import sys

import pytest

from harness.bench.allreduce import fit_ring
import procs

BIN = pathlib.Path(sys.executable).parent
ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_fit_recovers_alpha_and_beta_of_an_exact_ring():
    # N = 4, alpha = 10 µs, beta = 1 ns/byte: t(S) = 2*3*10e-6 + 2*3/4 * S * 1e-9 = 60e-6 + 1.5e-9 S
    sizes = [1e3, 1e5, 1e6, 1e7]
    times = [60e-6 + 1.5e-9 * s for s in sizes]
    fit = fit_ring(sizes, times, workers=4)
    assert fit.alpha_s == pytest.approx(10e-6, rel=1e-9)
    assert fit.beta_s_per_byte == pytest.approx(1e-9, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(1e9, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0) and max(abs(r) for r in fit.residuals_s) < 1e-12


def test_fit_on_two_workers_and_its_residuals():
    # N = 2: t = 2 alpha + S beta. Points (0, 1), (1, 2), (2, 5) (bytes, seconds): least squares t = 2 S + 2/3,
    # residuals 1/3, -2/3, 1/3 (SS_res = 2/3); mean 8/3, SS_tot = 25/9 + 4/9 + 49/9 = 26/3; R^2 = 12/13.
    fit = fit_ring([0, 1, 2], [1, 2, 5], workers=2)
    assert fit.alpha_s == pytest.approx((2 / 3) / 2)
    assert fit.beta_s_per_byte == pytest.approx(2.0)
    assert fit.residuals_s == pytest.approx((1 / 3, -2 / 3, 1 / 3))
    assert fit.r2 == pytest.approx(12 / 13)


def test_fit_is_undefined_on_one_worker_and_refuses_one_size():
    assert fit_ring([1, 2], [1, 2], workers=1) is None
    with pytest.raises(ValueError, match="need >= 2 distinct sizes"):
        fit_ring([8, 8], [1, 2], workers=2)


def _env() -> dict:
    env = procs.outer_free()
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1",
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _check_report(report: dict, workers: int, sizes: list[int]) -> None:
    assert report["workers"] == workers
    assert [r["bytes"] for r in report["rows"]] == sizes
    for r in report["rows"]:
        assert r["seconds"] > 0 and r["busbw_bytes_per_s"] == pytest.approx(
            r["bytes"] / r["seconds"] * 2 * (workers - 1) / workers)
    fit = report["fit"]
    assert fit is not None and len(fit["residuals_s"]) == len(sizes) and fit["r2"] <= 1.0


def test_the_readme_line_on_two_workers_under_launch_local(tmp_path):
    """docs/distributed.md's `harness launch local --workers 2 -- harness bench allreduce --output OUT`, run as printed (OUT
    a folder of the test's): every default size timed on 2 workers, the fit reported, the chief alone printing."""
    import shlex

    from harness.bench.allreduce import DEFAULT_SIZES

    readme = (ROOT / "docs" / "distributed.md").read_text()
    line = next(ln.split("#")[0].strip() for ln in readme.splitlines()
                if ln.startswith("harness launch local --workers 2 -- harness bench allreduce"))
    argv = [str(tmp_path) if a == "OUT" else a for a in shlex.split(line)]
    out = procs.run([BIN / argv[0], *argv[1:]], env=_env(), timeout=600)
    assert "[worker 0] all-reduce over 2 worker(s), tf" in out and "ring fit: alpha = " in out, out[-3000:]
    assert "[worker 1] all-reduce over" not in out    # the chief prints
    _check_report(json.loads((tmp_path / "allreduce.json").read_text()), 2, list(DEFAULT_SIZES))


def test_two_ranks_under_horovodrun(tmp_path):
    """Horovod's launcher less its build check (tests/bin/horovodrun: the build is tests/distribute's)."""
    sizes = [4096, 262144, 1048576]
    out = procs.run([*procs.HOROVODRUN, "-np", "2", "--gloo", BIN / "harness", "bench", "allreduce",
                     "--backend", "horovod", "--sizes", "4K,256K,1M", "--rounds", "2", "--repeats", "1", "--output",
                     tmp_path], env=_env(), timeout=300)
    assert "all-reduce over 2 worker(s), horovod" in out, out[-3000:]
    _check_report(json.loads((tmp_path / "allreduce.json").read_text()), 2, sizes)
