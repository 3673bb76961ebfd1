"""CUDA kernels compiled at run time with NVRTC (cuda.core) and launched on PyTorch tensors.

Same entry points as :mod:`dualkv.reference`, for CUDA float16/bfloat16 tensors. Compilation needs no GPU
(``dualkv kernels --compile-only``); running needs compute capability >= 8.0.
"""

from __future__ import annotations

from functools import lru_cache

#: The kernels have a (deterministic) backward.
HAS_BACKWARD = True


@lru_cache(maxsize=1)
def available() -> bool:
    """True when the kernels can run here: a CUDA device of compute capability >= 8.0 and cuda.core importable."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
        return False
    try:
        import cuda.core  # noqa: F401
        from cuda.core.utils import FileStreamProgramCache  # noqa: F401
    except ImportError:
        return False
    return True


def __getattr__(name):
    if name in ("flash_attn_dualkv_varlen_func", "context_attention", "shared_prefix_attention"):
        from . import api

        return getattr(api, name)
    raise AttributeError(name)
