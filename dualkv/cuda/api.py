"""The CUDA backend's public functions: same signatures and semantics as :mod:`dualkv.reference`, for CUDA
fp16/bf16 tensors.

Differentiable (custom ops with autograd, see :mod:`dualkv.cuda.ops`). The default backward is deterministic —
bitwise reproducible: every dK/dV row is summed by one CTA, every dQ row in a fixed order (by one CTA, or by reduce-adds
that per-tile counters put in order) (``$DUALKV_DETERMINISTIC=0`` changes the default). ``deterministic=False``
changes the path only where a non-deterministic one is faster: the cuDNN cascade's
backward (:func:`~dualkv.cuda.configs.attention_path`: Hopper, head dims 64 and 128: the fused forward with the
cascade's backward, :mod:`dualkv.cuda.hybrid`); on the mma.sync kernels (sm_80/86/89, ``kernel_family("mma")``) at head
dims 64-128 the atomic dQ inside the dK/dV kernel (:data:`~dualkv.cuda.configs.MMA_BACKWARDS`, "auto"); elsewhere the
deterministic kernels run, being the faster (the warp-specialised backward on Hopper; the split mma.sync backward at
head dim 32).

Head dims: any multiple of 8 up to 512. A head dim that is not a kernel head dim (e.g. 80) is zero-padded to the
next one (:func:`~dualkv.cuda.configs.kernel_head_dim`) with the softmax scale of the original; the padded output
and gradient columns are dropped, so the result is exact. ``causal=False`` runs the non-causal kernels
(``DKV_CAUSAL=0``), without a window. The paper's call 2 with query rows other than one per decoded key is mapped
onto the segment table by :mod:`dualkv.cuda.call2`.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
import torch.nn.functional as F

from .._checks import (check_context_inputs, check_deterministic, check_dualkv_inputs, check_layout_tensors,
                       check_window, resolve_scale)
from .._warnings import warn_once
from ..layout import GroupLayout
from ..tree import PrefixTreeLayout
from .call2 import gather_inputs, map_call2, scatter_outputs
from .configs import (ATOMIC_HEAD_DIMS, DTYPES, WINDOW_HEAD_DIMS, attention_path, ws_backward_for,
                      forward_kernel_for, kernel_head_dim)
from . import launch
from .launch import Plan, make_plan, make_tree_plan
from .ops import fwd as _fwd_op
from .runtime import arch_of, device_index
from .schedule import segments_from_cu_seqlens


def _kernel_head_dim(q: torch.Tensor, head_dim: int, causal: bool, window: tuple[int, int]) -> int:
    """Check what the kernels can serve; returns the kernel head dim the inputs are padded to."""
    if not q.is_cuda:
        raise ValueError(f"the CUDA kernels need CUDA tensors; q is on {q.device}")
    if q.dtype not in DTYPES:
        raise TypeError(f"the CUDA kernels take float16 or bfloat16; got {q.dtype} (use dualkv.reference)")
    padded = kernel_head_dim(head_dim)
    if not causal and tuple(window) != (-1, -1):
        raise NotImplementedError(f"the CUDA kernels have no sliding window with causal=False (got window_size="
                                  f"{tuple(window)}); use dualkv.reference for non-causal windows")
    if window[0] >= 0 and padded not in WINDOW_HEAD_DIMS:
        raise NotImplementedError(f"sliding windows are supported for head dims up to {WINDOW_HEAD_DIMS[-1]}, not "
                                  f"{head_dim}")
    return padded


def _pad_head_dim(tensors, padded: int) -> list[torch.Tensor]:
    """Zero-pad the last (head) dim of each tensor to ``padded`` (differentiable; a no-op when already there)."""
    return [t if t.shape[-1] == padded else F.pad(t, (0, padded - t.shape[-1])) for t in tensors]


def default_deterministic() -> bool:
    """The backward mode when the caller does not choose: ``$DUALKV_DETERMINISTIC`` (read at every call), ``1``
    (deterministic; also unset or empty) or ``0`` (the faster non-deterministic paths where they exist: the setting
    for integrations that call :func:`shared_prefix_attention` without the argument, such as the HF backend)."""
    text = os.environ.get("DUALKV_DETERMINISTIC", "")
    if text in ("", "1"):
        return True
    if text == "0":
        return False
    raise ValueError(f"DUALKV_DETERMINISTIC must be 1 (deterministic, the default) or 0; got {text!r}")


def resolve_deterministic(deterministic: bool | None, head_dim: int | None = None, ws_backward: bool = False) -> bool:
    """``None`` means: deterministic if ``torch.are_deterministic_algorithms_enabled()``, else
    :func:`default_deterministic`.

    ``False`` allows a non-deterministic backward where one is faster (the hybrid path or the cascade where
    :func:`~dualkv.cuda.configs.attention_path` routes to them; the mma.sync kernels' atomic dQ at head dims 64-128,
    :data:`~dualkv.cuda.configs.MMA_BACKWARDS`); the deterministic kernels run otherwise, being the faster. Beyond head
    dims :data:`ATOMIC_HEAD_DIMS` no non-deterministic mode exists, and a warning says so (once), except where the
    warp-specialised backward serves the call (``ws_backward``; Hopper, 192 and 256): it is as fast as cuDNN's or
    faster, so nothing is lost there.
    """
    default = default_deterministic()  # checked on every call, also where the argument or torch decides
    if check_deterministic(deterministic) is None:
        return torch.are_deterministic_algorithms_enabled() or default
    if (not deterministic and head_dim is not None and head_dim not in ATOMIC_HEAD_DIMS
            and not ws_backward):
        warn_once(f"deterministic=False has no effect at head dim {head_dim} here: the fused kernels' non-deterministic"
                  f" modes exist for head dims {ATOMIC_HEAD_DIMS} (shared_prefix_attention on Hopper also routes it to "
                  f"the cuDNN cascade's backward, dualkv.cuda.configs.CASCADE_FASTER); the deterministic backward runs",
                  stacklevel=5)
    return deterministic


def _run(q, k_ctx, v_ctx, k_own, v_own, plan: Plan, scale: float, window_left: int, deterministic: bool | None):
    return _fwd_op(q, k_ctx, v_ctx, k_own, v_own, plan.segments, plan.fwd_tiles, plan.dq_tiles, plan.key_tiles,
                   plan.dkdv_key_tiles, plan.split_key_tiles, plan.fwd_kernel, plan.fwd_pack, plan.dq_pack,
                   plan.ws_first_tiles, plan.split_parts, plan.ctx_shared, scale,
                   window_left, plan.causal,
                   resolve_deterministic(deterministic, q.shape[-1], ws_backward_for(
                       q.shape[-1], arch_of(device_index(q.device)), window_left >= 0, plan.causal, plan.tree)),
                   plan.tree)


def _finish(out, lse, return_lse):
    return (out, lse) if return_lse else out


def _finish_padded(out, lse, head_dim: int, return_lse: bool):
    return _finish(out[..., :head_dim] if out.shape[-1] != head_dim else out, lse, return_lse)


def flash_attn_dualkv_varlen_func(q, k_context, v_context, k_decoded, v_decoded, cu_seqlens_q, cu_seqlens_k_decoded,
                                  max_seqlen_q, context_seqlen, max_seqlen_k_decoded, softmax_scale=None,
                                  causal=True, window_size: Sequence[int] = (-1, -1), return_lse=False,
                                  deterministic: bool | None = None):
    """Call 2 on the GPU; see :func:`dualkv.reference.flash_attn_dualkv_varlen_func` for the contract (any
    L_i <= P + R_i query rows per sequence, bottom-right aligned; causal or not)."""
    h, hk, d, cu_q, cu_k = check_dualkv_inputs(q, k_context, v_context, k_decoded, v_decoded, cu_seqlens_q,
                                               cu_seqlens_k_decoded, max_seqlen_q, context_seqlen,
                                               max_seqlen_k_decoded)
    window = check_window(window_size, causal)
    padded = _kernel_head_dim(q, d, causal, window)
    mapping = map_call2(cu_q, cu_k, int(context_seqlen))  # (a numpy integer is accepted)
    inputs = _pad_head_dim(gather_inputs(mapping, q, k_context, v_context, k_decoded, v_decoded), padded)
    plan = make_plan(mapping.segments, head_dim=padded, group_size=h // hk, window_left=window[0], device=q.device,
                     ctx_shared=False, causal=causal, kv_heads=hk)
    out, lse = _run(*inputs, plan, resolve_scale(softmax_scale, d), window[0], deterministic)
    out, lse = scatter_outputs(mapping, out, lse)
    return _finish_padded(out, lse, d, return_lse)


def context_attention(q, k, v, cu_seqlens=None, max_seqlen=None, softmax_scale=None, causal=True,
                      window_size: Sequence[int] = (-1, -1), return_lse=False, deterministic: bool | None = None):
    """Call 1 on the GPU (self-attention of one or several packed prompts; causal or not)."""
    h, hk, d, cu = check_context_inputs(q, k, v, cu_seqlens, max_seqlen)
    window = check_window(window_size, causal)
    padded = _kernel_head_dim(q, d, causal, window)
    q, k, v = _pad_head_dim((q, k, v), padded)
    plan = make_plan(segments_from_cu_seqlens(cu, 0), head_dim=padded, group_size=h // hk, window_left=window[0],
                     device=q.device, ctx_shared=True, causal=causal)
    out, lse = _run(q, k, v, k, v, plan, resolve_scale(softmax_scale, d), window[0], deterministic)
    return _finish_padded(out, lse, d, return_lse)


def _order_key() -> tuple[bool, bool, bool, str]:
    """The launch/dQ orders a cached plan was built for (the settings the launcher reads: a plan must never meet
    kernels built for another dQ order), and its split of the shared-key tiles."""
    return launch.KEY_TILES_NODE_MAJOR, launch.TREE_DQ_ROOT_FIRST, launch.TWO_LEVEL_SHARED_FIRST, launch.WS_SPLIT


def layout_plan(layout: GroupLayout, *, head_dim: int, group_size: int, window_left: int,
                device: torch.device, kv_heads: int | None = None) -> Plan:
    """The kernels' schedule of a layout, built once per (shape, device) and cached on the layout (``kv_heads``
    sizes the warp-specialised backward's split, :func:`~dualkv.cuda.launch.ws_split_for`)."""
    fwd_kernel = forward_kernel_for(head_dim, arch_of(device_index(device)))
    key = ("plan", head_dim, group_size, kv_heads, window_left, str(device), fwd_kernel, _order_key())
    plan = layout._device_cache.get(key)
    if plan is None:
        plan = make_plan(layout.segment_table, head_dim=head_dim, group_size=group_size, window_left=window_left,
                         device=device, ctx_shared=True, fwd_kernel=fwd_kernel, kv_heads=kv_heads)
        layout._device_cache[key] = plan
    return plan


def tree_plan(layout: PrefixTreeLayout, *, head_dim: int, group_size: int, device: torch.device) -> Plan:
    """The tree kernels' schedule of a preorder tree, built once per (shape, device) and cached on the layout."""
    fwd_kernel = forward_kernel_for(head_dim, arch_of(device_index(device)))
    key = ("tree_plan", head_dim, group_size, str(device), fwd_kernel, _order_key())
    plan = layout._device_cache.get(key)
    if plan is None:
        plan = make_tree_plan(layout, head_dim=head_dim, group_size=group_size, device=device, fwd_kernel=fwd_kernel)
        layout._device_cache[key] = plan
    return plan


def _cached(layout: PrefixTreeLayout, key: str, build):
    if key not in layout._device_cache:
        layout._device_cache[key] = build()
    return layout._device_cache[key]


def _as_group_layout(layout: PrefixTreeLayout) -> GroupLayout | None:
    """The GroupLayout with the same packing, if the tree is one (then the two-level kernels serve it unchanged)."""
    def build():
        try:
            return layout.to_group_layout()
        except ValueError:
            return None
    return _cached(layout, "as_group_layout", build)


def tree_attention(q, k, v, layout: PrefixTreeLayout, softmax_scale=None, window_size: Sequence[int] = (-1, -1),
                   return_lse=False, deterministic: bool | None = None, tree_kernels: bool = False):
    """Exact attention of a packed prefix tree on the GPU (see :func:`dualkv.reference.tree.tree_attention`).

    A tree that is a :class:`GroupLayout` packing (depth 1, each root followed by its leaf children) runs the
    two-level kernels unchanged, unless ``tree_kernels`` (for comparing the tree kernels with the two-level ones on
    the same packing); any other tree runs the ``DKV_TREE=1`` query kernels (context = the ancestors' runs)
    and the dK/dV kernels over descendant ranges (:mod:`dualkv.cuda.tree_schedule`) — on sm_90 at head dim 128 the
    warp-specialised backward's ``DKV_TREE=1`` build (:mod:`dualkv.cuda.ws_schedule`), as for a GroupLayout. Nodes
    not in DFS preorder are permuted into it (a gather of q, k, v and of the outputs). Sliding windows on trees run
    the reference (with a warning).
    """
    from ..reference.tree import check_tree_tensors
    from .tree_schedule import is_preorder, preorder_permutation

    h, hk, d = check_tree_tensors(q, k, v, layout)
    window = check_window(window_size, True)
    group = None if tree_kernels else _as_group_layout(layout)
    if group is not None:
        return shared_prefix_attention(q, k, v, group, softmax_scale, window_size, return_lse, deterministic)
    if window[0] >= 0:
        from ..reference.tree import tree_attention as reference_tree

        warn_once("the CUDA tree kernels have no sliding window: this windowed PrefixTreeLayout call runs the "
                  "pure-PyTorch reference (dualkv.reference.tree), which is slow on long sequences", stacklevel=4)
        return reference_tree(q, k, v, layout, softmax_scale, window_size, return_lse, deterministic)
    padded = _kernel_head_dim(q, d, True, window)
    perm = inverse = None
    if not is_preorder(layout):
        layout, perm_np = _cached(layout, "preorder", lambda: preorder_permutation(layout))
        perm = torch.from_numpy(perm_np).to(q.device)
        inverse = torch.argsort(perm)
        q, k, v = q[perm], k[perm], v[perm]
    q, k, v = _pad_head_dim((q, k, v), padded)
    plan = tree_plan(layout, head_dim=padded, group_size=h // hk, device=q.device)
    out, lse = _run(q, k, v, k, v, plan, resolve_scale(softmax_scale, d), -1, deterministic)
    if perm is not None:
        out, lse = out[inverse], lse[:, inverse]
    return _finish_padded(out, lse, d, return_lse)


def shared_prefix_attention(q, k, v, layout: GroupLayout | PrefixTreeLayout, softmax_scale=None,
                            window_size: Sequence[int] = (-1, -1), return_lse=False,
                            deterministic: bool | None = None):
    """Calls 1 and 2 of every group in ONE launch over the layout's segment table — or, with ``deterministic=False``
    where it is faster (:func:`dualkv.cuda.configs.attention_path`), the cuDNN cascade or the fused forward with the
    cascade's cuDNN backward (:mod:`dualkv.cuda.hybrid`). A :class:`PrefixTreeLayout` runs :func:`tree_attention`."""
    if isinstance(layout, PrefixTreeLayout):
        return tree_attention(q, k, v, layout, softmax_scale, window_size, return_lse, deterministic)
    h, hk, d = check_layout_tensors(q, k, v, layout)
    window = check_window(window_size, True)
    padded = _kernel_head_dim(q, d, True, window)
    arch = arch_of(device_index(q.device))
    path = attention_path(arch, d, window[0] >= 0, resolve_deterministic(deterministic))
    if path == "cascade":
        from ..cascade import shared_prefix_attention as cascade

        return cascade(q, k, v, layout, softmax_scale=softmax_scale, return_lse=return_lse)
    q, k, v = _pad_head_dim((q, k, v), padded)
    plan = layout_plan(layout, head_dim=padded, group_size=h // hk, window_left=window[0], device=q.device,
                       kv_heads=hk)
    if path == "hybrid" and padded == d:
        from .hybrid import FusedForwardCascadeBackward

        out, lse = FusedForwardCascadeBackward.apply(q, k, v, layout, plan, resolve_scale(softmax_scale, d))
        return _finish(out, lse, return_lse)
    out, lse = _run(q, k, v, k, v, plan, resolve_scale(softmax_scale, d), window[0], deterministic)
    return _finish_padded(out, lse, d, return_lse)
