"""Route each public attention call to the best backend for its tensors.

CUDA fp16/bf16 tensors go to :mod:`dualkv.cuda` once its kernels are available on the device; everything else
(CPU tensors, float32/float64, machines without the CUDA toolchain) goes to :mod:`dualkv.reference`.
``DUALKV_BACKEND=reference`` forces the reference everywhere. Prefix trees (:class:`dualkv.PrefixTreeLayout`) have no
kernels yet: they run :mod:`dualkv.reference.tree` on every device (with a warning on CUDA fp16/bf16).
"""

from __future__ import annotations

import os
import warnings
from types import ModuleType

import torch

from . import reference
from .reference import tree as reference_tree
from .tree import PrefixTreeLayout

_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


def cuda_backend_available() -> bool:
    """True when the CUDA kernels can run here (a CUDA device and cuda.core importable)."""
    if not torch.cuda.is_available():
        return False
    try:
        from . import cuda as cuda_backend
    except ImportError:
        return False
    return cuda_backend.available()


def backend_for(tensor: torch.Tensor, layout: object = None) -> ModuleType:
    """The module whose functions should serve a call whose query tensor is ``tensor`` (and packed ``layout``)."""
    if isinstance(layout, PrefixTreeLayout):
        return _tree_backend(tensor)
    if os.environ.get("DUALKV_BACKEND", "").lower() == "reference":
        return reference
    if tensor.is_cuda and tensor.dtype in _KERNEL_DTYPES and cuda_backend_available():
        from . import cuda as cuda_backend

        return cuda_backend
    return reference


def backend_name(tensor: torch.Tensor) -> str:
    return "cuda" if backend_for(tensor) is not reference else "reference"


def _tree_backend(tensor: torch.Tensor) -> ModuleType:
    forced = os.environ.get("DUALKV_BACKEND", "").lower() == "reference"
    if tensor.is_cuda and tensor.dtype in _KERNEL_DTYPES and not forced:
        warnings.warn("dualkv has no CUDA kernel for PrefixTreeLayout yet: tree attention runs the pure-PyTorch "
                      "reference (dualkv.reference.tree), which is slow and memory-hungry on long sequences. "
                      "A GroupLayout runs the CUDA kernels.", RuntimeWarning, stacklevel=3)
    return reference_tree
