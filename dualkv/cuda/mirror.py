"""A CPU mirror of the forward kernel's block schedule (numba), checked against the reference in CI.

It runs the kernel's algorithm tile by tile with the SAME tile sizes (:data:`configs.FWD_TILES`), head packing,
tile order (:func:`schedule.tile_table`), key-block ranges (:func:`schedule.key_range`: causal pruning and
window skipping), visiting order (own blocks last-first, then context blocks), per-block mask decision
(:func:`schedule.needs_mask`), per-element masks of partial / diagonal / window-boundary blocks, zero-filled
out-of-bounds rows, and the log2-domain online softmax — only the matrix products are plain loops instead of
tensor-core fragments. If the schedule prunes a block it should not, or masks wrongly, the mirror disagrees with
the reference.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from .configs import TileConfig, pack_for
from .schedule import key_range, needs_mask, tile_table


def make_mirror(key_range_fn: Callable = key_range, needs_mask_fn: Callable = needs_mask):
    """Compile the mirror around the given schedule functions (the real ones, or a known-wrong variant)."""
    import numba

    kr = numba.njit(cache=False)(key_range_fn)
    nm = numba.njit(cache=False)(needs_mask_fn)

    @numba.njit(cache=False)
    def run(q, kc, vc, kd, vd, segments, tiles, group, pack, block_m, block_n, scale_log2, window_left, out, lse,
            visits):
        heads, d = q.shape[1], q.shape[2]
        ppt = block_m // pack
        for t in range(tiles.shape[0]):
            s, m = tiles[t, 0], tiles[t, 1]
            q_start, q_len, ctx_start, ctx_len = segments[s, 0], segments[s, 1], segments[s, 2], segments[s, 3]
            pos0 = m * ppt
            n_pos = min(ppt, q_len - pos0)
            own_first, own_end, ctx_first, ctx_end = kr(q_len, ctx_len, pos0, pos0 + n_pos - 1, block_n,
                                                        window_left)
            n_own = own_end - own_first
            n_iter = n_own + (ctx_end - ctx_first)
            i_min = ctx_len + pos0
            i_max = ctx_len + pos0 + n_pos - 1
            for hg in range(heads // pack):
                head0 = hg * pack
                kvh = head0 // group
                qt = np.zeros((block_m, d))
                for r in range(block_m):
                    p = r % ppt
                    if p < n_pos:
                        qt[r] = q[q_start + pos0 + p, head0 + r // ppt]
                row_max = np.full(block_m, -np.inf)
                row_sum = np.zeros(block_m)
                acc = np.zeros((block_m, d))
                for it in range(n_iter):
                    is_own = it < n_own
                    blk = own_end - 1 - it if is_own else ctx_end - 1 - (it - n_own)
                    k0 = blk * block_n
                    count = min(block_n, (q_len if is_own else ctx_len) - k0)
                    key_base = (ctx_len if is_own else 0) + k0
                    kt = np.zeros((block_n, d))
                    vt = np.zeros((block_n, d))
                    for j in range(count):
                        if is_own:
                            kt[j] = kd[q_start + k0 + j, kvh]
                            vt[j] = vd[q_start + k0 + j, kvh]
                        else:
                            kt[j] = kc[ctx_start + k0 + j, kvh]
                            vt[j] = vc[ctx_start + k0 + j, kvh]
                    mask_block = nm(is_own, count, key_base, i_min, i_max, block_n, window_left)
                    for r in range(block_m):
                        i = ctx_len + pos0 + r % ppt
                        sc = np.zeros(block_n)
                        for j in range(block_n):
                            dot = 0.0
                            for c in range(d):
                                dot += qt[r, c] * kt[j, c]
                            sc[j] = dot * scale_log2
                        if mask_block:
                            for j in range(block_n):
                                key = key_base + j
                                if not (j < count and key <= i and (window_left < 0 or key >= i - window_left)):
                                    sc[j] = -np.inf
                        m_new = max(row_max[r], sc.max())
                        m_use = 0.0 if m_new == -np.inf else m_new
                        alpha = 2.0 ** (row_max[r] - m_use)
                        p_row = 2.0 ** (sc - m_use)
                        row_max[r] = m_new
                        row_sum[r] = row_sum[r] * alpha + p_row.sum()
                        for c in range(d):
                            pv = 0.0
                            for j in range(block_n):
                                pv += p_row[j] * vt[j, c]
                            acc[r, c] = acc[r, c] * alpha + pv
                visits[t, hg] = n_iter
                for r in range(block_m):
                    p = r % ppt
                    if p < n_pos:
                        token = q_start + pos0 + p
                        head = head0 + r // ppt
                        out[token, head] = acc[r] / row_sum[r]
                        lse[head, token] = (row_max[r] + np.log2(row_sum[r])) * math.log(2.0)

    return run


_default_mirror = None


def mirror_forward(q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, k_own: torch.Tensor,
                   v_own: torch.Tensor, segments: np.ndarray, tile: TileConfig, *, scale: float,
                   window_left: int = -1, pack: int | None = None, mirror=None):
    """Run the kernel schedule on the CPU in float64.

    Args:
        q: (T_q, H, d); k_own, v_own: (T_q, H_k, d); k_ctx, v_ctx: (T_c, H_k, d); segments: int32 (S, 4).
    Returns:
        out (T_q, H, d) float64, lse (H, T_q) float64, visits (num_tiles, H / pack) key blocks visited per CTA,
        and the tile table used.
    """
    global _default_mirror
    if mirror is None:
        if _default_mirror is None:
            _default_mirror = make_mirror()
        mirror = _default_mirror
    heads = q.shape[1]
    group = heads // k_own.shape[1]
    pack = pack_for(group, tile) if pack is None else pack
    tiles = tile_table(segments, tile.block_m // pack, tile.block_n, window_left)
    arrays = [t.detach().double().cpu().numpy() for t in (q, k_ctx, v_ctx, k_own, v_own)]
    out = np.full(q.shape, np.nan)
    lse = np.full((heads, q.shape[0]), np.nan)
    visits = np.zeros((tiles.shape[0], heads // pack), dtype=np.int64)
    mirror(*arrays, np.asarray(segments, dtype=np.int64), tiles.astype(np.int64), group, pack, tile.block_m,
           tile.block_n, scale * math.log2(math.e), window_left, out, lse, visits)
    return torch.from_numpy(out), torch.from_numpy(lse), visits, tiles
