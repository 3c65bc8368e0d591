"""harness/profile/sampler.py: no GPU is said, never 0; CUDA_VISIBLE_DEVICES maps NVML indices."""
import pytest

from harness.profile.sampler import UtilizationSampler, _visible_indices


def test_no_gpu_is_said_not_zero(monkeypatch):
    sampler = UtilizationSampler(interval_s=0.01)
    if sampler.gpu.available:
        pytest.skip("a GPU is visible here")
    assert "no GPU" in sampler.gpu.describe()
    with sampler:
        import time
        time.sleep(0.1)
    assert sampler.samples and all(s.gpu_util is None for s in sampler.samples)
    assert all(0.0 <= s.cpu_percent <= 100.0 for s in sampler.samples)


def test_cuda_visible_devices_maps_nvml_indices():
    assert _visible_indices(4, {}) == [0, 1, 2, 3]
    assert _visible_indices(4, {"CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
    assert _visible_indices(4, {"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == [1]
    assert _visible_indices(4, {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert _visible_indices(2, {"CUDA_VISIBLE_DEVICES": "GPU-abc"}) == [0, 1]
