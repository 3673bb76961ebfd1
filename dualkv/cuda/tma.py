"""Tensor maps (TMA descriptors) for the warp-specialised Hopper kernels, and their launch.

A (tokens, heads, head_dim) tensor is described to the TMA unit as a 3-D tensor {head_dim, heads, tokens} (strides
from the tensor: views need no copy) read in boxes of {64 columns, 1 head, ``box_rows`` tokens} with the 128-byte
swizzle — exactly the K-major layout the kernels' wgmma descriptors expect, one 64-column atom per box. Maps are
built on the host with ``cuTensorMapEncodeTiled`` and passed by value as ``__grid_constant__`` kernel parameters,
which cuda.core's launcher cannot pack, so these kernels launch through ``cuLaunchKernel`` with an explicit
parameter array.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict

import numpy as np
import torch

from .runtime import LoadedKernel, _check, _debug, device_context

_DTYPES = {torch.bfloat16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", torch.float16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16"}
_MAPS: "OrderedDict[tuple, object]" = OrderedDict()
_FUNCTIONS: dict[int, object] = {}  # id(LoadedKernel) -> CUfunction (loaded kernels live for the process)
_MAX_MAPS = 256


def tensor_map_3d(t: torch.Tensor, box_rows: int):
    """``CUtensorMap`` of a (tokens, heads, d) fp16/bf16 tensor with unit last stride and 16-byte aligned rows,
    boxes of {64, 1, box_rows}, 128-byte swizzle, zero fill past the last token (and past the last column: head dim
    96's second box). Cached by (address, shape, strides, box): a map holds nothing else."""
    from cuda.bindings import driver

    if t.dim() != 3 or t.stride(-1) != 1 or t.dtype not in _DTYPES:
        raise ValueError(f"tensor maps take (tokens, heads, d) fp16/bf16 tensors with unit last stride; got "
                         f"{tuple(t.shape)} {t.dtype} strides {t.stride()}")
    if t.shape[-1] % 32 or not 0 < box_rows <= 256:  # head dim 96: the last box's columns 96.. are zero-filled
        raise ValueError(f"head dim {t.shape[-1]} must be a multiple of 32 and box_rows {box_rows} in 1..256")
    elem = t.element_size()
    strides = (t.stride(1) * elem, t.stride(0) * elem)
    if t.data_ptr() % 16 or any(s % 16 for s in strides):
        raise ValueError(f"TMA needs a 16-byte aligned base and row strides; got address {t.data_ptr():#x}, byte "
                         f"strides {strides}")
    key = (t.data_ptr(), tuple(t.shape), strides, t.dtype, box_rows, t.device.index)
    cached = _MAPS.get(key)
    if cached is not None:
        _MAPS.move_to_end(key)
        return cached
    dims = [t.shape[2], max(t.shape[1], 1), max(t.shape[0], 1)]
    err, tmap = driver.cuTensorMapEncodeTiled(
        getattr(driver.CUtensorMapDataType, _DTYPES[t.dtype]), 3, t.data_ptr(),
        [driver.cuuint64_t(x) for x in dims], [driver.cuuint64_t(x) for x in strides],
        [driver.cuuint32_t(x) for x in (64, 1, box_rows)], [driver.cuuint32_t(1)] * 3,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    _check((err,), f"cuTensorMapEncodeTiled(dims={dims}, strides={strides}, box=(64, 1, {box_rows}))")
    _MAPS[key] = tmap
    if len(_MAPS) > _MAX_MAPS:
        _MAPS.popitem(last=False)
    return tmap


def _param(value) -> tuple[object, int]:
    """(keep-alive object, address of the parameter's bytes) for one kernel argument."""
    if isinstance(value, np.int32):
        c = ctypes.c_int32(int(value))
    elif isinstance(value, np.int64):
        c = ctypes.c_int64(int(value))
    elif isinstance(value, np.float32):
        c = ctypes.c_float(float(value))
    elif isinstance(value, int):  # a device pointer
        c = ctypes.c_uint64(value)
    else:  # a CUtensorMap: its 128 bytes
        return value, int(value.getPtr())
    return c, ctypes.addressof(c)


def launch_raw(kernel: LoadedKernel, grid: tuple[int, int, int], args: list,
               stream: torch.cuda.Stream | None = None) -> None:
    """Launch ``kernel`` with ``args`` (np.int32 / np.int64 / np.float32 scalars, int device pointers, tensor maps)
    on ``stream`` (default: PyTorch's current stream of the kernel's device), inside the runtime's
    ``device_context`` like every other launch: the caller's device and driver context are left as they were."""
    from cuda.bindings import driver

    if grid[0] == 0 or grid[1] == 0:
        return
    stream = stream if stream is not None else torch.cuda.current_stream(kernel.device)
    if stream.device.index != kernel.device:
        raise ValueError(f"stream is on cuda:{stream.device.index} but the kernel runs on cuda:{kernel.device}")
    held = [_param(a) for a in args]
    pointers = (ctypes.c_void_p * len(held))(*[addr for _, addr in held])
    with device_context(kernel.device):
        function = _FUNCTIONS.get(id(kernel))
        if function is None:  # the kernel's function in this device's context (a CUkernel is context-independent)
            function = _check(driver.cuKernelGetFunction(kernel.kernel.handle), "cuKernelGetFunction")[0]
            _FUNCTIONS[id(kernel)] = function
        _check(driver.cuLaunchKernel(function, *grid, kernel.spec.threads, 1, 1, kernel.spec.smem_bytes,
                                     driver.CUstream(stream.cuda_stream), ctypes.addressof(pointers), 0),
               f"cuLaunchKernel({kernel.spec.entry})")
    if _debug["sync"]:
        stream.synchronize()
        torch.cuda.synchronize(kernel.device)
