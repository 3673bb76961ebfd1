"""Launcher of the forward kernel: tensors in, (out, lse) out.

The kernel reads rows of (tokens, heads, head_dim) tensors through token and head strides, so views (e.g. q/k/v
split from a fused projection, or transposed HF (1, H, T, d) tensors) need no copy as long as the last axis is
contiguous and rows are 16-byte aligned; anything else is copied once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from .configs import TileConfig, fwd_spec, pack_for
from .runtime import arch_of, f32, get_kernel, i32, i64, poison_enabled
from .schedule import tile_table


def kernel_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` if the kernel can read it in place (unit last stride, 16-byte aligned rows), else a contiguous copy."""
    elem = t.element_size()
    aligned = (t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * elem) % 16 == 0
               and (t.stride(1) * elem) % 16 == 0)
    return t if aligned else t.contiguous()


@dataclass
class ForwardPlan:
    """Device-side schedule of one forward launch (cacheable per layout)."""

    segments: torch.Tensor  # int32 (S, 4)
    tiles: torch.Tensor     # int32 (num_tiles, 2)
    pack: int
    tile: TileConfig


def make_plan(segments: np.ndarray, *, head_dim: int, dtype: torch.dtype, group_size: int, window_left: int,
              device: torch.device, tile: TileConfig | None = None, pack: int | None = None) -> ForwardPlan:
    """Schedule for the default tile of ``head_dim`` (or ``tile``/``pack`` overrides, for tuning)."""
    tile = tile or fwd_spec(head_dim, dtype, group_size, window_left >= 0, "sm_90").tile
    pack = pack or pack_for(group_size, tile)
    if group_size % pack:
        raise ValueError(f"pack {pack} does not divide the GQA group size {group_size}")
    tiles = tile_table(segments, tile.block_m // pack, tile.block_n, window_left)
    seg = torch.from_numpy(np.ascontiguousarray(segments, dtype=np.int32)).to(device, non_blocking=True)
    return ForwardPlan(seg, torch.from_numpy(tiles).to(device, non_blocking=True), pack, tile)


def attention_forward(q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, k_own: torch.Tensor,
                      v_own: torch.Tensor, plan: ForwardPlan, *, scale: float, window_left: int,
                      out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel over ``plan``'s segments.

    Args:
        q: (T_q, H, d); k_own, v_own: (T_q, H_k, d) indexed like q; k_ctx, v_ctx: (T_c, H_k, d) (may be k_own/v_own).
        window_left: -1 for none, else the causal window's left extent in logical positions.
    Returns:
        out (T_q, H, d) in q's dtype, lse (H, T_q) float32.
    """
    heads, head_dim = q.shape[1], q.shape[2]
    group = heads // k_own.shape[1]
    device = q.device
    spec = replace(fwd_spec(head_dim, q.dtype, group, window_left >= 0, arch_of(device.index or 0)),
                   tile=plan.tile, pack=plan.pack)
    q, k_ctx, v_ctx, k_own, v_own = (kernel_ready(t) for t in (q, k_ctx, v_ctx, k_own, v_own))
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=device)
    lse = torch.empty((heads, q.shape[0]), dtype=torch.float32, device=device)
    if poison_enabled():
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    out = kernel_ready(out)
    kernel = get_kernel(spec, device.index or 0)
    args = [q.data_ptr(), i64(q.stride(0)), i64(q.stride(1)),
            k_ctx.data_ptr(), i64(k_ctx.stride(0)), i64(k_ctx.stride(1)),
            v_ctx.data_ptr(), i64(v_ctx.stride(0)), i64(v_ctx.stride(1)),
            k_own.data_ptr(), i64(k_own.stride(0)), i64(k_own.stride(1)),
            v_own.data_ptr(), i64(v_own.stride(0)), i64(v_own.stride(1)),
            out.data_ptr(), i64(out.stride(0)), i64(out.stride(1)),
            lse.data_ptr(), i64(lse.stride(0)),
            plan.segments.data_ptr(), plan.tiles.data_ptr(),
            i32(group), f32(scale * math.log2(math.e)), i32(window_left)]
    kernel.launch((plan.tiles.shape[0], heads // plan.pack, 1), args)
    return out, lse
