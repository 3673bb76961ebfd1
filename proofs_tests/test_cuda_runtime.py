"""The kernels run on their tensors' device and leave the caller's CUDA state as it was (checked on the CPU with a
fake driver: which context is current, which stream a launch goes to, what is restored afterwards)."""

import types

import pytest
import torch

from dualkv.cuda import runtime
from dualkv.cuda.configs import fwd_spec


class FakeCuda:
    """A thread's CUDA state: the current driver context and PyTorch's current device (cudaGetDevice follows the
    current context, as the real runtime does)."""

    def __init__(self, monkeypatch, current: int = 0):
        self.ctx = f"primary{current}"
        self.launches = []
        monkeypatch.setattr(runtime, "_current_context", lambda: self.ctx)
        monkeypatch.setattr(runtime, "_set_context", self._set_context)
        monkeypatch.setattr(runtime, "_core_device", self._core_device)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: int(self.ctx[len("primary"):]))
        monkeypatch.setattr(torch.cuda, "set_device", lambda i: self._set_context(f"primary{i}"))
        monkeypatch.setattr(torch.cuda, "current_stream", self._stream)
        import cuda.core

        monkeypatch.setattr(cuda.core, "launch", self._launch)
        monkeypatch.setattr(runtime, "_streams", {})

    def _set_context(self, ctx):
        self.ctx = ctx

    def _core_device(self, index):
        self.ctx = f"primary{index}"
        return types.SimpleNamespace(device_id=index, create_stream=lambda s: ("core", index, s.cuda_stream))

    @staticmethod
    def _stream(device=None):
        index = torch.cuda.current_device() if device is None else device
        return types.SimpleNamespace(device=torch.device("cuda", index), cuda_stream=1000 + index)

    def _launch(self, stream, config, kernel, *args):
        self.launches.append({"stream": stream, "context": self.ctx})


def _kernel(device: int) -> runtime.LoadedKernel:
    return runtime.LoadedKernel(fwd_spec(64, torch.bfloat16, 1, False, "sm_80"), object(), device)


def test_launch_runs_on_the_kernels_device_and_restores_the_callers_state(monkeypatch):
    fake = FakeCuda(monkeypatch, current=0)
    _kernel(1).launch((4, 2, 1), [])
    assert fake.launches == [{"stream": ("core", 1, 1001), "context": "primary1"}]  # device 1's stream and context
    assert fake.ctx == "primary0" and torch.cuda.current_device() == 0              # the caller's state is back


def test_state_is_restored_when_the_launch_fails(monkeypatch):
    fake = FakeCuda(monkeypatch, current=1)

    def fail(*_):
        raise RuntimeError("launch failed")

    import cuda.core

    monkeypatch.setattr(cuda.core, "launch", fail)
    with pytest.raises(RuntimeError, match="launch failed"):
        _kernel(0).launch((1, 1, 1), [])
    assert fake.ctx == "primary1"


def test_a_context_the_caller_made_current_is_restored(monkeypatch):
    """Not only PyTorch's device: a caller's own (non-primary) context is current again after the launch."""
    fake = FakeCuda(monkeypatch, current=0)
    fake.ctx = "callers_ctx"
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0 if fake.ctx == "callers_ctx" else int(fake.ctx[7:]))
    _kernel(1).launch((1, 1, 1), [])
    assert fake.launches[0]["context"] == "primary1" and fake.ctx == "callers_ctx"


def test_a_stream_of_another_device_is_refused(monkeypatch):
    FakeCuda(monkeypatch)
    other = types.SimpleNamespace(device=torch.device("cuda", 0), cuda_stream=7)
    with pytest.raises(ValueError, match="stream is on cuda:0 but the kernel runs on cuda:1"):
        _kernel(1).launch((1, 1, 1), [], stream=other)


def test_core_streams_are_cached_per_device(monkeypatch):
    fake = FakeCuda(monkeypatch)
    for device in (0, 1, 0, 1):
        _kernel(device).launch((1, 1, 1), [])
    assert [entry["stream"][1] for entry in fake.launches] == [0, 1, 0, 1]
    assert sorted(runtime._streams) == [(0, 1000), (1, 1001)]


def test_device_index_comes_from_the_tensor():
    assert runtime.device_index(torch.device("cuda", 1)) == 1
    assert runtime.device_index(torch.device("cuda:3")) == 3
    with pytest.raises(ValueError, match="need CUDA tensors"):
        runtime.device_index(torch.empty(1))


def test_tma_launches_run_on_the_kernels_device_too(monkeypatch):
    """The warp-specialised kernels launch through cuLaunchKernel (dualkv/cuda/tma.py): same device, stream and
    context discipline as every other launch (a launch on the caller's stream of another device failed on 2 GPUs)."""
    from cuda.bindings import driver

    from dualkv.cuda import tma

    fake = FakeCuda(monkeypatch, current=0)
    calls = []
    monkeypatch.setattr(tma, "_FUNCTIONS", {})
    monkeypatch.setattr(driver, "cuKernelGetFunction", lambda handle: (driver.CUresult.CUDA_SUCCESS,
                                                                       f"function@{fake.ctx}"))
    monkeypatch.setattr(driver, "cuLaunchKernel", lambda f, *a: calls.append((f, int(a[-3]), fake.ctx))
                        or (driver.CUresult.CUDA_SUCCESS,))
    kernel = runtime.LoadedKernel(fwd_spec(128, torch.bfloat16, 4, False, "sm_90"), types.SimpleNamespace(handle=7), 1)
    tma.launch_raw(kernel, (3, 2, 1), [runtime.i32(1)])
    tma.launch_raw(kernel, (3, 2, 1), [runtime.i32(1)])
    assert calls == [("function@primary1", 1001, "primary1")] * 2    # device 1's function, stream and context
    assert fake.ctx == "primary0" and torch.cuda.current_device() == 0
    with pytest.raises(ValueError, match="stream is on cuda:0"):
        tma.launch_raw(kernel, (3, 2, 1), [], stream=FakeCuda._stream(0))


@pytest.mark.parametrize("limit", [101376, None, 232448])
def test_a_kernel_over_the_gpus_shared_memory_is_refused_by_name(monkeypatch, limit):
    """When the driver refuses a kernel's shared-memory size, get_kernel names the kernel, its head dim and both sizes
    (sm_86 / sm_89 allow 99 KB, the d=128 dK/dV kernel needs 137 KB); a refusal of a size within the limit (or an
    unknown limit: named as refused) is not misreported as a shared-memory shortfall."""
    import cuda.bindings.driver as driver
    import cuda.core

    from dualkv.cuda.configs import dkdv_spec

    FakeCuda(monkeypatch, current=0)
    spec = dkdv_spec(128, torch.bfloat16, False, "sm_86", kernel="bwd_dkdv")
    assert spec.smem_bytes > 101376
    monkeypatch.setattr(runtime, "_loaded", {})
    monkeypatch.setattr(runtime, "compile_spec", lambda s: types.SimpleNamespace(cubin=b""))
    kernel = types.SimpleNamespace(handle=1)
    monkeypatch.setattr(cuda.core, "ObjectCode", types.SimpleNamespace(
        from_cubin=lambda cubin: types.SimpleNamespace(get_kernel=lambda name: kernel)))
    monkeypatch.setattr(driver, "cuKernelSetAttribute", lambda *a: ("refused",))

    def check(result, what):
        if result == ("refused",):
            raise RuntimeError(f"{what} failed: CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(runtime, "_check", check)

    def no_limit(index):
        raise RuntimeError("no driver")

    monkeypatch.setattr(runtime, "max_dynamic_smem", (lambda index: limit) if limit is not None else no_limit)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA L40S")
    if limit is not None and limit >= spec.smem_bytes:
        with pytest.raises(RuntimeError, match="cuKernelSetAttribute.*INVALID_VALUE"):
            runtime.get_kernel(spec, 0)
        return
    allows = f"allows {limit}" if limit is not None else "refused it"
    with pytest.raises(RuntimeError, match=f"bwd_dkdv kernel at head dim 128 needs {spec.smem_bytes} bytes of shared "
                                           f"memory per block, but NVIDIA L40S \\(cuda:0\\) {allows}"):
        runtime.get_kernel(spec, 0)
