"""The kernels as ``torch.library`` custom ops (``dualkv::fwd``, ``dualkv::bwd``) with fake implementations and
autograd, so models using them trace under ``torch.compile`` and gradients reach all five inputs.

``ctx_shared``: the context rows are own rows of the same K/V tensors (shared_prefix_attention, call 1); then the
op is called with k_ctx = k_own, v_ctx = v_own and the whole gradient is returned through the own slots.
"""

from __future__ import annotations

import torch

from .launch import run_backward, run_forward

Tensor = torch.Tensor


@torch.library.custom_op("dualkv::fwd", mutates_args=(), device_types="cuda")
def fwd(q: Tensor, k_ctx: Tensor, v_ctx: Tensor, k_own: Tensor, v_own: Tensor, segments: Tensor, fwd_tiles: Tensor,
        dq_tiles: Tensor, key_tiles: Tensor, dkdv_key_tiles: Tensor, split_key_tiles: Tensor | None, fwd_kernel: str,
        fwd_pack: int, dq_pack: int, ws_first_tiles: int, split_parts: int, ctx_shared: bool, scale: float,
        window_left: int, causal: bool, deterministic: bool, tree: bool) -> tuple[Tensor, Tensor]:
    return run_forward(q, k_ctx, v_ctx, k_own, v_own, segments, fwd_tiles, fwd_pack, scale=scale,
                       window_left=window_left, kernel=fwd_kernel, causal=causal, tree=tree)


@fwd.register_fake
def _(q, k_ctx, v_ctx, k_own, v_own, segments, fwd_tiles, dq_tiles, key_tiles, dkdv_key_tiles, split_key_tiles,
      fwd_kernel, fwd_pack, dq_pack, ws_first_tiles, split_parts, ctx_shared, scale, window_left, causal, deterministic,
      tree):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("dualkv::bwd", mutates_args=(), device_types="cuda")
def bwd(dout: Tensor, d_lse: Tensor | None, q: Tensor, k_ctx: Tensor, v_ctx: Tensor, k_own: Tensor, v_own: Tensor,
        out: Tensor, lse: Tensor, segments: Tensor, dq_tiles: Tensor, key_tiles: Tensor, dkdv_key_tiles: Tensor,
        split_key_tiles: Tensor | None, dq_pack: int, ws_first_tiles: int, split_parts: int, ctx_shared: bool,
        scale: float, window_left: int, causal: bool, deterministic: bool,
        tree: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return run_backward(dout, q, k_ctx, v_ctx, k_own, v_own, out, lse, segments, dq_tiles, key_tiles, dq_pack,
                        ctx_shared, scale=scale, window_left=window_left, d_lse=d_lse, deterministic=deterministic,
                        causal=causal, tree=tree, dkdv_key_tiles_t=dkdv_key_tiles, ws_first_tiles=ws_first_tiles,
                        split_key_tiles_t=split_key_tiles, split_parts=split_parts)


@bwd.register_fake
def _(dout, d_lse, q, k_ctx, v_ctx, k_own, v_own, out, lse, segments, dq_tiles, key_tiles, dkdv_key_tiles,
      split_key_tiles, dq_pack, ws_first_tiles, split_parts, ctx_shared, scale, window_left, causal, deterministic,
      tree):
    ctx_k = k_own.new_empty((0,)) if ctx_shared else k_ctx.new_empty(k_ctx.shape)
    ctx_v = v_own.new_empty((0,)) if ctx_shared else v_ctx.new_empty(v_ctx.shape)
    return q.new_empty(q.shape), ctx_k, ctx_v, k_own.new_empty(k_own.shape), v_own.new_empty(v_own.shape)


def _setup_context(ctx, inputs, output):
    (q, k_ctx, v_ctx, k_own, v_own, segments, fwd_tiles, dq_tiles, key_tiles, dkdv_key_tiles, split_key_tiles,
     fwd_kernel, fwd_pack, dq_pack, ws_first_tiles, split_parts, ctx_shared, scale, window_left, causal, deterministic,
     tree) = inputs
    out, lse = output
    ctx.save_for_backward(q, k_ctx, v_ctx, k_own, v_own, out, lse, segments, dq_tiles, key_tiles, dkdv_key_tiles,
                          split_key_tiles)
    ctx.meta = (dq_pack, ws_first_tiles, split_parts, ctx_shared, scale, window_left, causal, deterministic, tree)
    ctx.set_materialize_grads(False)


def _backward(ctx, d_out, d_lse):
    q, k_ctx, v_ctx, k_own, v_own, out, lse, segments, dq_tiles, key_tiles, dkdv_key_tiles, split_key_tiles = \
        ctx.saved_tensors
    dq_pack, ws_first_tiles, split_parts, ctx_shared, scale, window_left, causal, deterministic, tree = ctx.meta
    if d_out is None and d_lse is None:
        return (None,) * 22
    if d_out is None:
        d_out = torch.zeros_like(out)
    dq, dk_ctx, dv_ctx, dk_own, dv_own = bwd(d_out, d_lse, q, k_ctx, v_ctx, k_own, v_own, out, lse, segments,
                                             dq_tiles, key_tiles, dkdv_key_tiles, split_key_tiles, dq_pack,
                                             ws_first_tiles, split_parts, ctx_shared, scale, window_left, causal,
                                             deterministic, tree)
    if ctx_shared:
        dk_ctx = dv_ctx = None
    return (dq, dk_ctx, dv_ctx, dk_own, dv_own) + (None,) * 17


fwd.register_autograd(_backward, setup_context=_setup_context)
