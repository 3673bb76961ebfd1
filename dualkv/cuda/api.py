"""The CUDA backend's public functions: same signatures as :mod:`dualkv.reference`, for CUDA fp16/bf16 tensors.

Differentiable (custom ops with autograd, see :mod:`dualkv.cuda.ops`); the backward is deterministic — every
gradient row is summed by one CTA in a fixed order, with no atomics — so ``deterministic=True`` (and
``torch.use_deterministic_algorithms``) need nothing extra.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .._checks import (check_context_inputs, check_deterministic, check_dualkv_inputs, check_layout_tensors,
                       check_window, resolve_scale)
from .._warnings import warn_once
from ..layout import GroupLayout
from .configs import ATOMIC_HEAD_DIMS, DTYPES, HEAD_DIMS, WINDOW_HEAD_DIMS, forward_kernel_for
from .launch import Plan, make_plan
from .ops import fwd as _fwd_op
from .runtime import arch_of, device_index
from .schedule import segments_from_cu_seqlens


def _check_kernel_inputs(q: torch.Tensor, head_dim: int, causal: bool, window_left: int) -> None:
    if not q.is_cuda:
        raise ValueError(f"the CUDA kernels need CUDA tensors; q is on {q.device}")
    if q.dtype not in DTYPES:
        raise TypeError(f"the CUDA kernels take float16 or bfloat16; got {q.dtype} (use dualkv.reference)")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} is not supported by the CUDA kernels (supported: {HEAD_DIMS})")
    if not causal:
        raise NotImplementedError("the CUDA kernels are causal only (training always is); use dualkv.reference for "
                                  "causal=False")
    if window_left >= 0 and head_dim not in WINDOW_HEAD_DIMS:
        raise NotImplementedError(f"sliding windows are supported for head dims {WINDOW_HEAD_DIMS}, not {head_dim}")


#: Backward mode when the caller does not choose: the deterministic two-kernel backward, unless measurements say
#: the atomic mode is worth its run-to-run differences (see README, "Deterministic backward").
DEFAULT_DETERMINISTIC = True


def resolve_deterministic(deterministic: bool | None, head_dim: int | None = None) -> bool:
    """``None`` means: deterministic if ``torch.are_deterministic_algorithms_enabled()``, else the default mode.

    ``False`` selects the atomic-dQ backward, which exists for head dims :data:`ATOMIC_HEAD_DIMS`; at other head
    dims the backward stays deterministic, and a warning says so (once).
    """
    if check_deterministic(deterministic) is None:
        return torch.are_deterministic_algorithms_enabled() or DEFAULT_DETERMINISTIC
    if not deterministic and head_dim is not None and head_dim not in ATOMIC_HEAD_DIMS:
        warn_once(f"deterministic=False has no effect at head dim {head_dim}: the CUDA backward's atomic-dQ mode "
                  f"exists for head dims {ATOMIC_HEAD_DIMS}; the deterministic backward runs", stacklevel=5)
    return deterministic


def _run(q, k_ctx, v_ctx, k_own, v_own, plan: Plan, scale: float, window_left: int, deterministic: bool | None):
    return _fwd_op(q, k_ctx, v_ctx, k_own, v_own, plan.segments, plan.fwd_tiles, plan.dq_tiles, plan.key_tiles,
                   plan.fwd_kernel, plan.fwd_pack, plan.dq_pack, plan.ctx_shared, scale, window_left,
                   resolve_deterministic(deterministic, q.shape[-1]))


def _finish(out, lse, return_lse):
    return (out, lse) if return_lse else out


def flash_attn_dualkv_varlen_func(q, k_context, v_context, k_decoded, v_decoded, cu_seqlens_q, cu_seqlens_k_decoded,
                                  max_seqlen_q, context_seqlen, max_seqlen_k_decoded, softmax_scale=None,
                                  causal=True, window_size: Sequence[int] = (-1, -1), return_lse=False,
                                  deterministic: bool | None = None):
    """Call 2 on the GPU; see :func:`dualkv.reference.flash_attn_dualkv_varlen_func` for the contract."""
    h, hk, d, cu = check_dualkv_inputs(q, k_context, v_context, k_decoded, v_decoded, cu_seqlens_q,
                                       cu_seqlens_k_decoded, max_seqlen_q, context_seqlen, max_seqlen_k_decoded)
    window = check_window(window_size, causal)
    _check_kernel_inputs(q, d, causal, window[0])
    plan = make_plan(segments_from_cu_seqlens(cu, context_seqlen), head_dim=d, group_size=h // hk,
                     window_left=window[0], device=q.device, ctx_shared=False)
    out, lse = _run(q, k_context, v_context, k_decoded, v_decoded, plan, resolve_scale(softmax_scale, d), window[0],
                    deterministic)
    return _finish(out, lse, return_lse)


def context_attention(q, k, v, cu_seqlens=None, max_seqlen=None, softmax_scale=None, causal=True,
                      window_size: Sequence[int] = (-1, -1), return_lse=False, deterministic: bool | None = None):
    """Call 1 on the GPU (causal self-attention of one or several packed prompts)."""
    h, hk, d, cu = check_context_inputs(q, k, v, cu_seqlens, max_seqlen)
    window = check_window(window_size, causal)
    _check_kernel_inputs(q, d, causal, window[0])
    plan = make_plan(segments_from_cu_seqlens(cu, 0), head_dim=d, group_size=h // hk, window_left=window[0],
                     device=q.device, ctx_shared=True)
    out, lse = _run(q, k, v, k, v, plan, resolve_scale(softmax_scale, d), window[0], deterministic)
    return _finish(out, lse, return_lse)


def layout_plan(layout: GroupLayout, *, head_dim: int, group_size: int, window_left: int,
                device: torch.device) -> Plan:
    """The kernels' schedule of a layout, built once per (shape, device) and cached on the layout."""
    fwd_kernel = forward_kernel_for(head_dim, arch_of(device_index(device)))
    key = ("plan", head_dim, group_size, window_left, str(device), fwd_kernel)
    plan = layout._device_cache.get(key)
    if plan is None:
        plan = make_plan(layout.segment_table, head_dim=head_dim, group_size=group_size, window_left=window_left,
                         device=device, ctx_shared=True, fwd_kernel=fwd_kernel)
        layout._device_cache[key] = plan
    return plan


def shared_prefix_attention(q, k, v, layout: GroupLayout, softmax_scale=None, window_size: Sequence[int] = (-1, -1),
                            return_lse=False, deterministic: bool | None = None):
    """Calls 1 and 2 of every group in ONE launch over the layout's segment table."""
    h, hk, d = check_layout_tensors(q, k, v, layout)
    window = check_window(window_size, True)
    _check_kernel_inputs(q, d, True, window[0])
    plan = layout_plan(layout, head_dim=d, group_size=h // hk, window_left=window[0], device=q.device)
    out, lse = _run(q, k, v, k, v, plan, resolve_scale(softmax_scale, d), window[0], deterministic)
    return _finish(out, lse, return_lse)
