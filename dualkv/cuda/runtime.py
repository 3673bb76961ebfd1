"""Loading compiled kernels onto a tensor's device and launching them on that device's current PyTorch stream.

A launch on ``cuda:i`` makes device i's primary context current only for the launch (:func:`device_context`) and
restores the caller's context and PyTorch's current device afterwards, so tensors on any GPU may be used whatever
the current device is.

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


def _current_context():
    """The calling thread's current CUDA driver context (a null handle when none is current)."""
    from cuda.bindings import driver

    return _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")[0]


def _set_context(ctx) -> None:
    from cuda.bindings import driver

    _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def _core_device(index: int):
    """cuda.core's (thread-local) Device ``index``, its primary context made current (the one PyTorch uses)."""
    from cuda.core import Device

    device = Device(index)
    device.set_current()
    return device


@contextlib.contextmanager
def device_context(index: int):
    """Run the block with device ``index``'s primary context current, then give the caller back its own state.

    cuda.core's ``Device.set_current`` makes the device's primary context (shared with PyTorch) current on this
    thread, which also moves PyTorch's current device (``cudaGetDevice`` reads the current context). On exit the
    caller's driver context is restored, and PyTorch's current device with it (set again if it still differs), also
    when the block raises. Yields the cuda.core Device.
    """
    torch_device = torch.cuda.current_device()
    previous = _current_context()
    try:
        yield _core_device(index)
    finally:
        _set_context(previous)
        if torch.cuda.current_device() != torch_device:
            torch.cuda.set_device(torch_device)


def device_index(where: torch.Tensor | torch.device) -> int:
    """The CUDA device ordinal of a tensor or device (the kernels run there, whatever the current device is)."""
    device = where.device if isinstance(where, torch.Tensor) else torch.device(where)
    if device.type != "cuda":
        raise ValueError(f"the CUDA kernels need CUDA tensors; got a tensor on {device}")
    return device.index if device.index is not None else torch.cuda.current_device()


@dataclass
class LoadedKernel:
    """One specialization loaded for one device; :meth:`launch` runs it there."""

    spec: KernelSpec
    kernel: object  # cuda.core Kernel
    device: int

    def launch(self, grid: tuple[int, int, int], args: list, *, stream: torch.cuda.Stream | None = None) -> None:
        """Launch on ``stream`` (default: PyTorch's current stream of this kernel's device) inside
        :func:`device_context`, so neither the caller's current device nor its context changes."""
        from cuda.core import LaunchConfig, launch

        if grid[0] == 0 or grid[1] == 0:
            return
        stream = stream if stream is not None else torch.cuda.current_stream(self.device)
        if stream.device.index != self.device:
            raise ValueError(f"stream is on cuda:{stream.device.index} but the kernel runs on cuda:{self.device}")
        config = LaunchConfig(grid=grid, block=(self.spec.tile.threads, 1, 1), shmem_size=self.spec.smem_bytes)
        with device_context(self.device) as device:
            launch(_core_stream(device, stream), config, self.kernel, *args)
        if _debug["sync"]:
            stream.synchronize()
            torch.cuda.synchronize(self.device)


_streams: dict[tuple[int, int], object] = {}


def _core_stream(device, stream: torch.cuda.Stream):
    """cuda.core view of a PyTorch stream of ``device`` (the same CUstream; cached per device and handle)."""
    key = (int(device.device_id), stream.cuda_stream)
    core = _streams.get(key)
    if core is None:
        core = device.create_stream(stream)
        _streams[key] = core
    return core


def max_dynamic_smem(device_index: int) -> int:
    """The opt-in dynamic shared memory a block may use on ``device_index`` (bytes; 227 KB on sm_90, 163 KB on
    sm_80 / sm_87, 99 KB on sm_86 / sm_89)."""
    from cuda.bindings import driver

    attr = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    return int(_check(driver.cuDeviceGetAttribute(attr, driver.CUdevice(device_index)),
                      "cuDeviceGetAttribute(max shared memory per block)")[0])


def smem_error(spec: KernelSpec, limit: int | None, device: str) -> RuntimeError:
    """The error for a specialization whose shared memory ``device`` (a label) refused, naming the kernel, its head
    dim and both sizes (``limit`` None: unknown). Today the 99 KB GPUs (sm_86, sm_89) have no tiles for the backward
    at head dims >= 96 or the forward at >= 192."""
    allows = f"allows {limit}" if limit is not None else "refused it"
    return RuntimeError(
        f"dualkv's {spec.kernel} kernel at head dim {spec.head_dim} needs {spec.smem_bytes} bytes of shared memory per "
        f"block, but {device} {allows}: dualkv has no {spec.kernel} tile for this GPU at this head dim yet "
        "(DUALKV_BACKEND=reference runs the PyTorch reference instead)")


def get_kernel(spec: KernelSpec, device_index: int) -> LoadedKernel:
    """Compile (disk-cached), load onto ``device_index`` and configure one specialization (memoised per device); a
    specialization over the device's shared memory is refused by name (:func:`smem_error`)."""
    key = (spec, device_index)
    with _lock:
        if key in _loaded:
            return _loaded[key]
    from cuda.bindings import driver
    from cuda.core import ObjectCode

    built = compile_spec(spec)
    with device_context(device_index):
        kernel = ObjectCode.from_cubin(built.cubin).get_kernel(spec.entry)
        if spec.smem_bytes > 48 * 1024:
            try:
                _check(driver.cuKernelSetAttribute(
                    driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, spec.smem_bytes,
                    kernel.handle, driver.CUdevice(device_index)), f"cuKernelSetAttribute(smem={spec.smem_bytes})")
            except RuntimeError as err:
                try:
                    limit = max_dynamic_smem(device_index)
                except Exception:  # noqa: BLE001 - the message names what is known
                    limit = None
                if limit is None or spec.smem_bytes > limit:
                    raise smem_error(spec, limit, f"{torch.cuda.get_device_name(device_index)} "
                                                  f"(cuda:{device_index})") from err
                raise
    loaded = LoadedKernel(spec, kernel, device_index)
    with _lock:
        _loaded[key] = loaded
    return loaded


def i32(x: int) -> np.int32:
    return np.int32(x)


def i64(x: int) -> np.int64:
    return np.int64(x)


def f32(x: float) -> np.float32:
    return np.float32(x)
