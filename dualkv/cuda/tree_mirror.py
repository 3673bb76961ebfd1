"""CPU mirror of the tree kernels' walks (``DKV_TREE=1``), checked against :mod:`dualkv.reference.tree` in CI.

The three kernels' work decompositions replayed in float64 from the SAME host tables the GPU reads
(:func:`dualkv.cuda.tree_schedule.tree_segments`, ``tree_tile_table``, ``tree_key_tiles``), decoded the way the
kernels decode them (:func:`~dualkv.cuda.tree_schedule.parse_segment`, ``context_list``, ``tree_block``):

* :func:`mirror_tree_forward` — per query tile (packed heads, positions of one node): own blocks last-first, then
  the context blocks of every ancestor run last-first, the per-block mask decision of ``block_needs_mask`` and the
  log2-domain online softmax; rows past a node and keys past a partial block are masked.
* :func:`mirror_tree_dq` — the dQ kernel's query tiles over the same blocks: dQ = sum over blocks of dS K.
* :func:`mirror_tree_dkdv` — each key tile WRITES its node's rows, summed over its own queries (causal) and every
  query of its dependent segments (fully visible), over the GQA group; a row written twice or never stays wrong.

Only the matrix products are plain numpy instead of tensor-core fragments. Known-wrong tables (a missing ancestor, a
key tile that does not sum over every descendant) make the mirror disagree with the reference; the tests check that.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..tree import PrefixTreeLayout
from .schedule import needs_mask
from .tree_schedule import (context_blocks, context_list, parse_segment, tree_block, tree_key_tiles, tree_segments,
                            tree_tile_table)

LOG2E = math.log2(math.e)


def context_key_base(j: int, block_n: int) -> int:
    """``block_key_base`` (csrc/qtile.cuh) of a tree's context block j: 0, as every context key precedes every query
    of the segment. (Its blocks are numbered run after run, so j * block_n is no key position: a kernel that used it
    masked partial context runs as future keys — the test suite checks that this mirror catches that.)"""
    return 0


def _tile(table: np.ndarray, s: int, m: int, pos_per_tile: int, block_n: int):
    """Tile (s, m) as ``make_qtile`` sees it: (q_start, pos0, n_pos, pos, blocks), blocks in the kernels' visiting
    order as (is_own, first row, count, key_base)."""
    q_start, q_len, runs_at, pos = parse_segment(table, s)
    pos0 = m * pos_per_tile
    n_pos = min(pos_per_tile, q_len - pos0)
    runs = context_list(table, runs_at)
    own_end = (pos0 + n_pos - 1 + block_n) // block_n
    out = []
    for it in range(own_end):
        k0 = (own_end - 1 - it) * block_n
        out.append((True, q_start + k0, min(block_n, q_len - k0), pos + k0))
    n_ctx = context_blocks(runs, block_n)
    for j in range(n_ctx - 1, -1, -1):
        row, count = tree_block(runs, j, block_n)
        out.append((False, row, count, context_key_base(j, block_n)))
    return q_start, pos0, n_pos, pos, out


def _scores(qt: np.ndarray, kt: np.ndarray, is_own: bool, count: int, key_base: int, i_rows: np.ndarray,
            valid: np.ndarray, block_n: int, scale_log2: float) -> np.ndarray:
    """Scaled (log2) scores of a tile's rows against one block, masked as the kernels mask (-inf)."""
    sc = qt @ kt.T * scale_log2
    i_min, i_max = int(i_rows[valid].min()), int(i_rows[valid].max())
    if needs_mask(is_own, count, key_base, i_min, i_max, block_n, -1, True):
        j = np.arange(block_n)[None, :]
        vis = (j < count) & (key_base + j <= i_rows[:, None])  # key_visible: the causal test applies to every block
        sc = np.where(vis, sc, -np.inf)
    return sc


def _tile_rows(s_q_start: int, pos0: int, n_pos: int, pos: int, block_m: int, pack: int, head0: int):
    ppt = block_m // pack
    r = np.arange(block_m)
    p = r % ppt
    valid = p < n_pos
    tokens = s_q_start + pos0 + np.minimum(p, n_pos - 1)
    heads = head0 + r // ppt
    return tokens, heads, valid, pos + pos0 + p


def _ctas(table: np.ndarray, layout: PrefixTreeLayout, block_m: int, block_n: int, pack: int, heads: int,
          group: int):
    """Every CTA (tile, head group) of a query kernel in launch order: (tokens, heads, valid, positions, kv head,
    blocks) of its block_m rows."""
    for s, m in tree_tile_table(layout, block_m // pack, block_n).tolist():
        q_start, pos0, n_pos, pos, blocks = _tile(table, s, m, block_m // pack, block_n)
        for head0 in range(0, heads, pack):
            yield (*_tile_rows(q_start, pos0, n_pos, pos, block_m, pack, head0), head0 // group, blocks)


def _load_block(k: np.ndarray, row: int, count: int, block_n: int, kv_head: int) -> np.ndarray:
    out = np.zeros((block_n, k.shape[2]))
    out[:count] = k[row:row + count, kv_head]
    return out


def mirror_tree_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: PrefixTreeLayout, *,
                        block_m: int, block_n: int, pack: int, scale: float,
                        table_fn: Callable = tree_segments) -> tuple[torch.Tensor, torch.Tensor]:
    """The tree forward's schedule in float64. q: (T, H, d); k, v: (T, H_k, d). Returns out (T, H, d) and the
    natural-log LSE (H, T) (rows no tile writes stay NaN)."""
    qn, kn, vn = (t.detach().double().cpu().numpy() for t in (q, k, v))
    heads, group = qn.shape[1], qn.shape[1] // kn.shape[1]
    table = table_fn(layout)
    out = np.full(qn.shape, np.nan)
    lse = np.full((heads, qn.shape[0]), np.nan)
    scale_log2 = scale * LOG2E
    for tokens, hs, valid, i_rows, kvh, blocks in _ctas(table, layout, block_m, block_n, pack, heads, group):
        qt = np.where(valid[:, None], qn[tokens, hs], 0.0)
        row_max = np.full(block_m, -np.inf)
        row_sum = np.zeros(block_m)
        acc = np.zeros((block_m, qn.shape[2]))
        for is_own, row, count, key_base in blocks:
            kt, vt = _load_block(kn, row, count, block_n, kvh), _load_block(vn, row, count, block_n, kvh)
            sc = _scores(qt, kt, is_own, count, key_base, i_rows, valid, block_n, scale_log2)
            m_new = np.maximum(row_max, sc.max(1))
            m_use = np.where(m_new == -np.inf, 0.0, m_new)
            alpha = np.exp2(row_max - m_use)
            p = np.exp2(sc - m_use[:, None])
            row_max, row_sum = m_new, row_sum * alpha + p.sum(1)
            acc = acc * alpha[:, None] + p @ vt
        out[tokens[valid], hs[valid]] = acc[valid] / row_sum[valid, None]
        lse[hs[valid], tokens[valid]] = (row_max[valid] + np.log2(row_sum[valid])) * math.log(2.0)
    return torch.from_numpy(out), torch.from_numpy(lse)


def mirror_tree_dq(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_out: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, layout: PrefixTreeLayout, *, block_m: int, block_n: int, pack: int,
                   scale: float, table_fn: Callable = tree_segments) -> torch.Tensor:
    """The dQ kernel's query tiles over the tree's blocks in float64: dQ (T, H, d) (NaN where no tile writes)."""
    qn, kn, vn, don, on = (t.detach().double().cpu().numpy() for t in (q, k, v, d_out, out))
    lse2 = lse.detach().double().cpu().numpy() * LOG2E
    delta = (don * on).sum(-1).T  # (H, T)
    heads, group = qn.shape[1], qn.shape[1] // kn.shape[1]
    table = table_fn(layout)
    dq = np.full(qn.shape, np.nan)
    for tokens, hs, valid, i_rows, kvh, blocks in _ctas(table, layout, block_m, block_n, pack, heads, group):
        qt = np.where(valid[:, None], qn[tokens, hs], 0.0)
        dot = np.where(valid[:, None], don[tokens, hs], 0.0)
        row_lse, row_delta = lse2[hs, tokens], delta[hs, tokens]
        acc = np.zeros((block_m, qn.shape[2]))
        for is_own, row, count, key_base in blocks:
            kt, vt = _load_block(kn, row, count, block_n, kvh), _load_block(vn, row, count, block_n, kvh)
            sc = _scores(qt, kt, is_own, count, key_base, i_rows, valid, block_n, scale * LOG2E)
            p = np.exp2(sc - row_lse[:, None])
            ds = p * (dot @ vt.T - row_delta[:, None])
            acc += ds @ kt
        dq[tokens[valid], hs[valid]] = acc[valid] * scale
    return torch.from_numpy(dq)


def mirror_tree_dkdv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_out: torch.Tensor, out: torch.Tensor,
                     lse: torch.Tensor, layout: PrefixTreeLayout, *, block_keys: int, scale: float,
                     key_tiles_fn: Callable = tree_key_tiles) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The dK/dV kernels' key tiles in float64: dk, dv (T, H_k, d) (NaN where no tile writes) and writes (T,): how
    many tiles wrote each row."""
    qn, kn, vn, don, on = (t.detach().double().cpu().numpy() for t in (q, k, v, d_out, out))
    lse_n = lse.detach().double().cpu().numpy()
    delta = (don * on).sum(-1).T
    heads, kv_heads = qn.shape[1], kn.shape[1]
    group = heads // kv_heads
    dk, dv = np.full(kn.shape, np.nan), np.full(vn.shape, np.nan)
    writes = np.zeros(kn.shape[0], dtype=np.int64)
    starts, lens = layout.node_starts, layout.node_lens
    for node, blk, dep_begin, dep_end in key_tiles_fn(layout, block_keys).tolist():
        key0 = blk * block_keys
        count = min(block_keys, lens[node] - key0)
        row0 = starts[node] + key0
        acc_k = np.zeros((count, kv_heads, qn.shape[2]))
        acc_v = np.zeros_like(acc_k)
        for src in [node, *range(dep_begin, dep_end)]:
            rows = slice(starts[src], starts[src] + lens[src])
            visible = np.ones((lens[src], count), dtype=bool)
            if src == node:  # own queries see the block causally
                visible = (np.arange(count)[None, :] + key0) <= np.arange(lens[src])[:, None]
            for h in range(heads):
                kvh = h // group
                s = qn[rows, h] @ kn[row0:row0 + count, kvh].T * scale
                p = np.where(visible, np.exp(s - lse_n[h, rows, None]), 0.0)
                ds = p * (don[rows, h] @ vn[row0:row0 + count, kvh].T - delta[h, rows, None])
                acc_v[:, kvh] += p.T @ don[rows, h]
                acc_k[:, kvh] += ds.T @ qn[rows, h] * scale
        dk[row0:row0 + count], dv[row0:row0 + count] = acc_k, acc_v
        writes[row0:row0 + count] += 1
    return torch.from_numpy(dk), torch.from_numpy(dv), writes
