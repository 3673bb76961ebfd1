"""Route each public attention call to a backend for its tensors.

``DUALKV_BACKEND`` (read at every call):

* ``auto`` (default, also when unset or empty): CUDA float16/bfloat16 tensors go to :mod:`dualkv.cuda` where its
  kernels can run; everything else to :mod:`dualkv.reference`. A CUDA call that lands on the reference for a
  reason the caller may not expect — float32 tensors, ``cuda.core`` missing, a GPU older than sm_80 — issues a
  :class:`~dualkv._warnings.FallbackWarning` naming the reason, once per reason. float64 is the exact oracle by
  choice and runs on the reference without a warning; so do CPU tensors.
* ``reference``: the reference everywhere.
* ``cuda``: the kernels, or an error saying why they cannot serve the call.

Any other value is refused with the list of valid ones.

Prefix trees (:class:`dualkv.PrefixTreeLayout`) follow the same rules: the CUDA tree kernels
(:func:`dualkv.cuda.api.tree_attention`) where they can run, else :mod:`dualkv.reference.tree`.
"""

from __future__ import annotations

import os
from types import ModuleType

import torch

from . import reference
from ._warnings import FallbackWarning, warn_once
from .reference import tree as reference_tree
from .tree import PrefixTreeLayout

BACKENDS = ("auto", "reference", "cuda")
_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


def requested_backend() -> str:
    """The validated ``DUALKV_BACKEND`` value (``"auto"`` when unset or empty)."""
    raw = os.environ.get("DUALKV_BACKEND", "")
    value = raw.strip().lower() or "auto"
    if value not in BACKENDS:
        raise ValueError(f"DUALKV_BACKEND={raw!r} is not a dualkv backend; use one of {', '.join(BACKENDS)} "
                         "(or leave it unset for auto)")
    return value


def kernels_unavailable_reason(device: torch.device | None = None) -> str | None:
    """Why the CUDA kernels cannot run on ``device`` (default: the current CUDA device); None when they can."""
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device"
    try:
        from . import cuda as cuda_backend
    except ImportError as err:  # pragma: no cover - dualkv.cuda imports nothing optional at module level
        return f"dualkv.cuda cannot be imported ({err})"
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    return cuda_backend.unavailable_reason(index)


def cuda_backend_available(device: torch.device | None = None) -> bool:
    """True when the CUDA kernels can run on ``device`` (default: the current CUDA device)."""
    return kernels_unavailable_reason(device) is None


def _kernel_refusal(tensor: torch.Tensor) -> str | None:
    """Why the kernels cannot serve a call whose query is ``tensor``; None when they can."""
    if not tensor.is_cuda:
        return f"the tensors are on {tensor.device}, not on a CUDA device"
    if tensor.dtype not in _KERNEL_DTYPES:
        return f"the CUDA kernels take float16/bfloat16 tensors, these are {tensor.dtype}"
    return kernels_unavailable_reason(tensor.device)


def backend_for(tensor: torch.Tensor, layout: object = None) -> ModuleType:
    """The module whose functions serve a call whose query tensor is ``tensor`` and packed ``layout`` (see the module
    doc)."""
    tree = isinstance(layout, PrefixTreeLayout)
    fallback = reference_tree if tree else reference
    if not hasattr(tensor, "is_cuda"):  # not a tensor: the reference's checks name the argument
        return fallback
    choice = requested_backend()
    if choice == "reference":
        return fallback
    reason = _kernel_refusal(tensor)
    if reason is None:
        from . import cuda as cuda_backend

        return cuda_backend
    if choice == "cuda":
        raise ValueError(f"DUALKV_BACKEND=cuda, but the CUDA kernels cannot serve this call: {reason}")
    if tensor.is_cuda and tensor.dtype != torch.float64:
        warn_once(f"dualkv runs this CUDA call on the pure-PyTorch reference (much slower than the kernels): "
                  f"{reason}. Use float16/bfloat16 CUDA tensors where the kernels can run, or set "
                  "DUALKV_BACKEND=reference to choose the reference explicitly.", FallbackWarning, stacklevel=4)
    return fallback


def backend_name(tensor: torch.Tensor) -> str:
    """``"cuda"`` or ``"reference"``: the backend :func:`backend_for` picks for ``tensor``."""
    return "cuda" if backend_for(tensor) is not reference else "reference"
