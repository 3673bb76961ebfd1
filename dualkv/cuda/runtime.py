"""Loading compiled kernels onto the current device and launching them on PyTorch's current stream.

Every driver call is checked. In debug mode (:func:`debug`, or ``DUALKV_DEBUG=1``) outputs are poisoned with NaN
before each launch and the stream is synchronised after it, so unwritten outputs and asynchronous faults surface
at the launch that caused them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

import numpy as np
import torch

from .build import compile_spec
from .configs import KernelSpec

_lock = threading.Lock()
_loaded: dict[tuple[KernelSpec, int], "LoadedKernel"] = {}
_debug = {"poison": os.environ.get("DUALKV_DEBUG") == "1", "sync": os.environ.get("DUALKV_DEBUG") == "1"}


@contextlib.contextmanager
def debug(poison: bool = True, sync: bool = True):
    """Poison outputs with NaN before launches and synchronise after them, inside the block."""
    old = dict(_debug)
    _debug.update(poison=poison, sync=sync)
    try:
        yield
    finally:
        _debug.update(old)


def poison_enabled() -> bool:
    return _debug["poison"]


def arch_of(device_index: int) -> str:
    major, minor = torch.cuda.get_device_capability(device_index)
    if major < 8:
        raise RuntimeError(f"the dualkv CUDA kernels need compute capability >= 8.0 (mma.sync bf16); device "
                           f"{device_index} is sm_{major}{minor}")
    return f"sm_{major}{minor}"


def _check(result, what: str):
    """cuda.bindings calls return (err, *values); raise on any error."""
    from cuda.bindings import driver

    err = result[0] if isinstance(result, tuple) else result
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return result[1:] if isinstance(result, tuple) and len(result) > 1 else None


@dataclass
class LoadedKernel:
    spec: KernelSpec
    kernel: object  # cuda.core Kernel

    def launch(self, grid: tuple[int, int, int], args: list, *, stream: torch.cuda.Stream | None = None) -> None:
        from cuda.core import LaunchConfig, launch

        if grid[0] == 0 or grid[1] == 0:
            return
        stream = stream or torch.cuda.current_stream()
        config = LaunchConfig(grid=grid, block=(self.spec.tile.threads, 1, 1), shmem_size=self.spec.smem_bytes)
        launch(_core_stream(stream), config, self.kernel, *args)
        if _debug["sync"]:
            stream.synchronize()
            torch.cuda.synchronize()


_streams: dict[int, object] = {}


def _core_stream(stream: torch.cuda.Stream):
    """cuda.core view of a PyTorch stream (wraps the same CUstream; cached per stream handle)."""
    from cuda.core import Device

    handle = stream.cuda_stream
    core = _streams.get(handle)
    if core is None:
        core = Device(stream.device.index or 0).create_stream(stream)
        _streams[handle] = core
    return core


def get_kernel(spec: KernelSpec, device_index: int) -> LoadedKernel:
    """Compile (disk-cached), load onto ``device_index`` and configure one specialization (memoised)."""
    key = (spec, device_index)
    with _lock:
        if key in _loaded:
            return _loaded[key]
    from cuda.bindings import driver
    from cuda.core import Device, ObjectCode

    Device(device_index).set_current()  # shares PyTorch's primary context
    built = compile_spec(spec)
    kernel = ObjectCode.from_cubin(built.cubin).get_kernel(spec.entry)
    if spec.smem_bytes > 48 * 1024:
        _check(driver.cuKernelSetAttribute(
            driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, spec.smem_bytes,
            kernel.handle, driver.CUdevice(device_index)), f"cuKernelSetAttribute(smem={spec.smem_bytes})")
    loaded = LoadedKernel(spec, kernel)
    with _lock:
        _loaded[key] = loaded
    return loaded


def i32(x: int) -> np.int32:
    return np.int32(x)


def i64(x: int) -> np.int64:
    return np.int64(x)


def f32(x: float) -> np.float32:
    return np.float32(x)
