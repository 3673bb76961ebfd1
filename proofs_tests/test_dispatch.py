"""Backend choice: never silent. A CUDA call that lands on the slow reference warns once with the reason; a
``DUALKV_BACKEND`` value that is not a backend, or ``cuda`` for tensors the kernels cannot take, is refused by
name; options that have no effect say so; ``kernel_family`` works as a plain call and as a context manager."""

import sys
import types
import warnings

import pytest
import torch

import dualkv
from dualkv import GroupLayout, _warnings, dispatch
from dualkv import cuda as cuda_backend
from dualkv.cuda import configs


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    _warnings.reset()
    cuda_backend.unavailable_reason.cache_clear()
    monkeypatch.delenv("DUALKV_BACKEND", raising=False)
    yield
    _warnings.reset()
    cuda_backend.unavailable_reason.cache_clear()


def _cpu_call(**kwargs):
    layout = GroupLayout.single(3, [2, 1])
    x = torch.randn(layout.total_tokens, 2, 8, dtype=torch.float64)
    return dualkv.shared_prefix_attention(x, x, x, layout, **kwargs)


def _fake_gpu(monkeypatch, capability=(9, 0), core=True):
    """A machine where PyTorch sees one GPU of ``capability``, with or without cuda.core importable."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    if not core:
        monkeypatch.setitem(sys.modules, "cuda.core", None)  # import cuda.core -> ImportError


def _cuda_tensor(dtype):
    """Stands in for a CUDA tensor of ``dtype`` (dispatch reads only is_cuda, dtype and device)."""
    return types.SimpleNamespace(is_cuda=True, dtype=dtype, device=torch.device("cuda", 0))


@pytest.mark.parametrize("value", ["refrence", "cpu", "kernels"])
def test_an_unknown_backend_is_refused_with_the_valid_values(monkeypatch, value):
    monkeypatch.setenv("DUALKV_BACKEND", value)
    with pytest.raises(ValueError, match=f"DUALKV_BACKEND='{value}' is not a dualkv backend; use one of auto, "
                                         "reference, cuda"):
        _cpu_call()


@pytest.mark.parametrize("value", ["", "auto", "reference", " Reference "])
def test_valid_backend_values_run_on_the_cpu(monkeypatch, value):
    monkeypatch.setenv("DUALKV_BACKEND", value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _cpu_call().shape == (6, 2, 8)


def test_cuda_backend_for_cpu_tensors_is_refused(monkeypatch):
    monkeypatch.setenv("DUALKV_BACKEND", "cuda")
    with pytest.raises(ValueError, match="DUALKV_BACKEND=cuda, but the CUDA kernels cannot serve this call: the "
                                         "tensors are on cpu"):
        _cpu_call()


def test_cuda_backend_for_float32_is_refused(monkeypatch):
    _fake_gpu(monkeypatch)
    monkeypatch.setenv("DUALKV_BACKEND", "cuda")
    with pytest.raises(ValueError, match="float16/bfloat16 tensors, these are torch.float32"):
        dispatch.backend_for(_cuda_tensor(torch.float32))


def test_float32_cuda_tensors_warn_once_with_the_reason(monkeypatch):
    _fake_gpu(monkeypatch)
    with pytest.warns(_warnings.FallbackWarning, match="pure-PyTorch reference.*these are torch.float32"):
        assert dispatch.backend_for(_cuda_tensor(torch.float32)) is dualkv.reference
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # the same reason again: no second warning
        assert dispatch.backend_for(_cuda_tensor(torch.float32)) is dualkv.reference
        assert dispatch.backend_for(_cuda_tensor(torch.float64)) is dualkv.reference  # the oracle: no warning
        monkeypatch.setenv("DUALKV_BACKEND", "reference")                             # chosen: no warning
        _warnings.reset()
        assert dispatch.backend_for(_cuda_tensor(torch.float32)) is dualkv.reference


def test_bf16_with_kernels_available_goes_to_cuda(monkeypatch):
    _fake_gpu(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch.backend_for(_cuda_tensor(torch.bfloat16)) is cuda_backend


def test_missing_cuda_core_warns_with_the_reason(monkeypatch):
    _fake_gpu(monkeypatch, core=False)
    with pytest.warns(_warnings.FallbackWarning, match="cuda.core is not importable"):
        assert dispatch.backend_for(_cuda_tensor(torch.bfloat16)) is dualkv.reference


def test_an_old_gpu_warns_with_the_reason(monkeypatch):
    _fake_gpu(monkeypatch, capability=(7, 5))
    with pytest.warns(_warnings.FallbackWarning, match="sm_75; the kernels need compute capability >= 8.0"):
        assert dispatch.backend_for(_cuda_tensor(torch.float16)) is dualkv.reference


def test_deterministic_false_on_the_reference_warns_that_it_has_no_effect():
    with pytest.warns(_warnings.DualKVWarning, match="deterministic=False has no effect on dualkv's reference"):
        _cpu_call(deterministic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _cpu_call(deterministic=False)           # once
        _cpu_call(deterministic=True)
        _cpu_call(deterministic=None)
    with pytest.raises(TypeError, match="deterministic must be True, False or None"):
        _cpu_call(deterministic="no")


def test_deterministic_false_without_an_atomic_mode_warns():
    from dualkv.cuda.api import resolve_deterministic

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # the warp-specialised backward serves the call (Hopper, 192 / 256): as fast as cuDNN's, nothing to say
        assert resolve_deterministic(False, 256, ws_backward=True) is False
    with pytest.warns(_warnings.DualKVWarning, match="no effect at head dim 256"):
        assert resolve_deterministic(False, 256) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_deterministic(False, 128) is False
        assert resolve_deterministic(True, 256) is True


def test_dualkv_deterministic_sets_the_default_mode(monkeypatch):
    """$DUALKV_DETERMINISTIC: unset, empty or 1 -> deterministic; 0 -> not; anything else refused by name; an explicit
    argument and torch's deterministic-algorithms switch win over it."""
    from dualkv.cuda.api import resolve_deterministic

    for text, want in ((None, True), ("", True), ("1", True), ("0", False)):
        if text is None:
            monkeypatch.delenv("DUALKV_DETERMINISTIC", raising=False)
        else:
            monkeypatch.setenv("DUALKV_DETERMINISTIC", text)
        assert resolve_deterministic(None) is want
    assert resolve_deterministic(True) is True       # the argument wins (DUALKV_DETERMINISTIC=0 still set)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert resolve_deterministic(None) is True
    finally:
        torch.use_deterministic_algorithms(before)
    for bad in ("yes", "false", "2"):
        monkeypatch.setenv("DUALKV_DETERMINISTIC", bad)
        for arg in (None, True, False):   # checked whatever decides the mode
            with pytest.raises(ValueError, match=f"DUALKV_DETERMINISTIC must be 1 .* or 0; got '{bad}'"):
                resolve_deterministic(arg)


def test_kernel_family_as_a_plain_call_and_as_a_context_manager():
    assert configs.current_kernel_family() == "auto"
    try:
        configs.kernel_family("mma")                       # a plain call sets it
        assert configs.current_kernel_family() == "mma"
        assert configs.fwd_spec(128, torch.bfloat16, 4, False, "sm_90").kernel == "fwd"
        with configs.kernel_family("auto"):                # a block sets it and restores the previous one
            assert configs.fwd_spec(128, torch.bfloat16, 4, False, "sm_90").kernel == "fwd_sm90_ws"
        assert configs.current_kernel_family() == "mma"
    finally:
        configs.kernel_family("auto")
    with pytest.raises(ValueError, match="kernel family must be one of"):
        configs.kernel_family("wgmma")
    assert configs.current_kernel_family() == "auto"
