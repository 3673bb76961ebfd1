"""CUDA kernels compiled at run time with NVRTC (cuda.core) and launched on PyTorch tensors.

Same entry points as :mod:`dualkv.reference`, for CUDA float16/bfloat16 tensors. Compilation needs no GPU
(``dualkv kernels --compile-only``); running needs compute capability >= 8.0.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=None)
def unavailable_reason(device_index: int) -> str | None:
    """Why the kernels cannot run on CUDA device ``device_index`` (None when they can): compute capability < 8.0,
    or cuda.core (the NVRTC / driver bindings) not importable."""
    import torch

    major, minor = torch.cuda.get_device_capability(device_index)
    if major < 8:
        return f"cuda:{device_index} is sm_{major}{minor}; the kernels need compute capability >= 8.0"
    try:
        import cuda.core  # noqa: F401
        from cuda.core.utils import FileStreamProgramCache  # noqa: F401
    except ImportError as err:
        return f"cuda.core is not importable ({err}); install the cuda-core package"
    return None


def __getattr__(name):
    if name in ("flash_attn_dualkv_varlen_func", "context_attention", "shared_prefix_attention"):
        from . import api

        return getattr(api, name)
    raise AttributeError(name)
