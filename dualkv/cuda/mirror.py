"""CPU mirrors of the kernels' schedules, checked against the reference in CI.

:func:`mirror_forward` (numba) runs the forward kernel's algorithm tile by tile with the SAME tile sizes
(:data:`configs.FWD_TILES`), head packing, tile order (:func:`schedule.tile_table`), key-block ranges
(:func:`schedule.key_range`: causal pruning and window skipping), visiting order (own blocks last-first, then
context blocks), per-block mask decision (:func:`schedule.needs_mask`), per-element masks of partial / diagonal /
window-boundary blocks, zero-filled out-of-bounds rows, and the log2-domain online softmax — only the matrix
products are plain loops instead of tensor-core fragments; ``causal=False`` runs the non-causal (``DKV_CAUSAL=0``)
schedule. If the schedule prunes a block it should not, or masks wrongly, the mirror disagrees with the reference.
The softmax is the kernels' lazy one (softmax.cuh, DKV_SOFTMAX_LAZY): a row keeps its running max until a block's
exceeds it by more than :data:`LAZY_RESCALE` (log2 units).

:func:`mirror_dkdv` (torch, float64) runs the dK/dV kernel's decomposition: each key tile of
:func:`schedule.key_tiles` writes its rows from the source segments it lists, so overlapping or missing tiles and
wrong dependents disagree with the reference's gradients."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from .configs import TileConfig, pack_for
from .schedule import key_range, key_tiles, needs_mask, tile_table

#: softmax.cuh's kLazyRescale: how far (log2 units) a block's max may exceed a row's running max before the row moves
#: it (and the output is rescaled); P <= 2^LAZY_RESCALE.
LAZY_RESCALE = 8.0


def make_mirror(key_range_fn: Callable = key_range, needs_mask_fn: Callable = needs_mask, rescale: bool = True):
    """Compile the mirror around the given schedule functions (the real ones, or a known-wrong variant);
    ``rescale=False`` is a known-wrong softmax that never rescales the output (softmax.cuh's DKV_SOFTMAX_LAZY=2)."""
    import numba

    kr = numba.njit(cache=False)(key_range_fn)
    nm = numba.njit(cache=False)(needs_mask_fn)

    @numba.njit(cache=False)
    def run(q, kc, vc, kd, vd, segments, tiles, group, pack, block_m, block_n, scale_log2, window_left, causal, out,
            lse, visits):
        heads, d = q.shape[1], q.shape[2]
        ppt = block_m // pack
        for t in range(tiles.shape[0]):
            s, m = tiles[t, 0], tiles[t, 1]
            q_start, q_len, ctx_start, ctx_len = segments[s, 0], segments[s, 1], segments[s, 2], segments[s, 3]
            pos0 = m * ppt
            n_pos = min(ppt, q_len - pos0)
            own_first, own_end, ctx_first, ctx_end = kr(q_len, ctx_len, pos0, pos0 + n_pos - 1, block_n,
                                                        window_left, causal)
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
                    mask_block = nm(is_own, count, key_base, i_min, i_max, block_n, window_left, causal)
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
                                if not (j < count and (not causal or key <= i)
                                        and (window_left < 0 or key >= i - window_left)):
                                    sc[j] = -np.inf
                        m_new = max(row_max[r], sc.max())
                        if m_new <= row_max[r] + LAZY_RESCALE:
                            m_new = row_max[r]  # (-inf stays -inf until the row sees a key)
                        m_use = 0.0 if m_new == -np.inf else m_new
                        alpha = 2.0 ** (row_max[r] - m_use) if rescale else 1.0
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
                   window_left: int = -1, causal: bool = True, pack: int | None = None, mirror=None):
    """Run the kernel schedule on the CPU in float64 (``causal=False``: the DKV_CAUSAL=0 kernels' schedule).

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
    tiles = tile_table(segments, tile.block_m // pack, tile.block_n, window_left, causal)
    arrays = [t.detach().double().cpu().numpy() for t in (q, k_ctx, v_ctx, k_own, v_own)]
    out = np.full(q.shape, np.nan)
    lse = np.full((heads, q.shape[0]), np.nan)
    visits = np.zeros((tiles.shape[0], heads // pack), dtype=np.int64)
    mirror(*arrays, np.asarray(segments, dtype=np.int64), tiles.astype(np.int64), group, pack, tile.block_m,
           tile.block_n, scale * math.log2(math.e), window_left, causal, out, lse, visits)
    return torch.from_numpy(out), torch.from_numpy(lse), visits, tiles


def mirror_dkdv(q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, k_own: torch.Tensor,
                v_own: torch.Tensor, d_out: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, segments: np.ndarray,
                *, block_keys: int, ctx_shared: bool, scale: float, window_left: int = -1, causal: bool = True):
    """The dK/dV kernel's work decomposition on the CPU in float64: every key tile of
    :func:`schedule.key_tiles` sums its keys' gradients over exactly the source segments it lists (its own
    segment, causally or not, and the segments that see its keys as context) and WRITES its rows.

    A row written by two tiles (contexts overlapping in one tensor), a row no tile writes, or a missing source
    shows up as a difference from the reference's gradients (rows never written stay NaN).

    Args:
        q, d_out, out: (T_q, H, d); k_own, v_own: (T_q, H_k, d); k_ctx, v_ctx: (T_c, H_k, d);
        lse: (H, T_q) natural-log LSE of the forward; segments: int32 (S, 4).
    Returns:
        dk_own, dv_own (T_q, H_k, d), dk_ctx, dv_ctx (T_c, H_k, d) — with ``ctx_shared`` the context rows are own
        rows and dk_ctx/dv_ctx stay NaN — and writes (T_q + T_c,): how many tiles wrote each own / context row.
    """
    f64 = [t.detach().double().cpu() for t in (q, k_ctx, v_ctx, k_own, v_own, d_out, out)]
    q, k_ctx, v_ctx, k_own, v_own, d_out, out = f64
    lse = lse.detach().double().cpu()
    seg = np.asarray(segments, dtype=np.int64).reshape(-1, 4)
    heads, kv_heads = q.shape[1], k_own.shape[1]
    group = heads // kv_heads
    delta = (d_out * out).sum(-1).t()                                  # (H, T_q)
    grads = [torch.full(t.shape, float("nan"), dtype=torch.float64) for t in (k_own, v_own, k_ctx, v_ctx)]
    writes = np.zeros(k_own.shape[0] + k_ctx.shape[0], dtype=np.int64)
    for own_seg, blk, dep_begin, dep_end in key_tiles(seg, block_keys, ctx_shared, causal).tolist():
        key_seg = seg[own_seg if own_seg >= 0 else dep_begin]
        key0 = blk * block_keys
        count = min(block_keys, (key_seg[1] if own_seg >= 0 else key_seg[3]) - key0)
        row0 = (key_seg[0] if own_seg >= 0 else key_seg[2]) + key0
        keys, values = (k_own, v_own) if own_seg >= 0 else (k_ctx, v_ctx)
        sources = ([own_seg] if own_seg >= 0 else []) + list(range(dep_begin, dep_end))
        dk = torch.zeros(count, kv_heads, q.shape[2], dtype=torch.float64)
        dv = torch.zeros_like(dk)
        for src in sources:
            q_start, q_len, _, ctx_len = seg[src]
            own = src == own_seg
            i = torch.arange(q_len, dtype=torch.float64)[:, None] + ctx_len          # query positions
            j = torch.arange(count, dtype=torch.float64)[None, :] + key0 + (ctx_len if own else 0)
            visible = torch.ones(q_len, count, dtype=torch.bool)
            if own and causal:
                visible &= j <= i
            if window_left >= 0:
                visible &= j >= i - window_left
            rows = slice(q_start, q_start + q_len)
            for h in range(heads):
                kvh = h // group
                s = q[rows, h] @ keys[row0:row0 + count, kvh].t() * scale
                p = torch.exp(s - lse[h, rows, None]).masked_fill(~visible, 0.0)
                dp = d_out[rows, h] @ values[row0:row0 + count, kvh].t()
                ds = p * (dp - delta[h, rows, None])
                dv[:, kvh] += p.t() @ d_out[rows, h]
                dk[:, kvh] += ds.t() @ q[rows, h] * scale
        target = 0 if own_seg >= 0 else 2
        grads[target][row0:row0 + count] = dk
        grads[target + 1][row0:row0 + count] = dv
        writes[(0 if own_seg >= 0 else k_own.shape[0]) + row0:][:count] += 1
    return (*grads, writes)
