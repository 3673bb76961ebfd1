"""Host-side schedule of the kernels: segment tables and the ordered list of query tiles (CTAs).

A *segment* is (q_start, q_len, ctx_start, ctx_len): queries [q_start, q_start + q_len) attend to context keys
[ctx_start, ctx_start + ctx_len) (fully visible, logical positions 0..ctx_len-1) and causally to their own keys
(logical ctx_len + j; all of them in the non-causal kernels, ``causal=False`` below). A *tile* is (segment, m):
query positions [m * pos_per_tile, (m + 1) * pos_per_tile) of a segment. Tiles are ordered heaviest first
(longest-processing-time scheduling), and tiles of equal work keep segment order, so the N responses of a group
read the same context blocks at about the same time (L2 reuse).

:func:`key_range` and :func:`needs_mask` are the Python statements of the same logic in ``csrc/qtile.cuh``
(``key_range``, ``block_needs_mask``); :mod:`dualkv.cuda.mirror` runs them (numba) against the reference on the
CPU.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np



def segments_from_cu_seqlens(cu_seqlens: Sequence[int], ctx_len: int) -> np.ndarray:
    """int32 (N, 4) for sequences packed by ``cu_seqlens``, each with the same context of ``ctx_len`` keys at 0."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    table = np.stack([cu[:-1], cu[1:] - cu[:-1], np.zeros_like(cu[:-1]), np.full_like(cu[:-1], ctx_len)], 1)
    return table.astype(np.int32)


def key_range(q_len: int, ctx_len: int, pos_lo: int, pos_hi: int, block_n: int, window_left: int,
              causal: bool = True):
    """Key blocks [first, end) per region for query positions [pos_lo, pos_hi] (window_left < 0: no window;
    ``causal=False``: every own key, no window).

    Returns (own_first, own_end, ctx_first, ctx_end).
    """
    own_end = (pos_hi + block_n) // block_n if causal else (q_len + block_n - 1) // block_n
    own_lo = max(0, pos_lo - window_left) if window_left >= 0 else 0
    own_first = own_lo // block_n
    ctx_end = (ctx_len + block_n - 1) // block_n
    if window_left >= 0:
        ctx_lo = ctx_len + pos_lo - window_left
        ctx_first = 0 if ctx_lo <= 0 else (ctx_end if ctx_lo >= ctx_len else ctx_lo // block_n)
    else:
        ctx_first = 0
    return own_first, own_end, ctx_first, ctx_end


def needs_mask(is_own: bool, count: int, key_base: int, i_min: int, i_max: int, block_n: int,
               window_left: int, causal: bool = True) -> bool:
    """Whether a key block needs per-element masking for rows at logical positions [i_min, i_max]."""
    return (count < block_n or (causal and is_own and key_base + block_n - 1 > i_min)
            or (window_left >= 0 and key_base < i_max - window_left))


def tile_ranges(segments: np.ndarray, pos_per_tile: int, block_n: int, window_left: int = -1,
                causal: bool = True) -> np.ndarray:
    """Vectorised :func:`key_range` for every tile: int64 (num_tiles, 6) of
    (segment, m, own_first, own_end, ctx_first, ctx_end), in segment order."""
    seg = np.asarray(segments, dtype=np.int64).reshape(-1, 4)
    q_len, ctx_len = seg[:, 1], seg[:, 3]
    n_tiles = (q_len + pos_per_tile - 1) // pos_per_tile
    s = np.repeat(np.arange(seg.shape[0]), n_tiles)
    m = np.arange(s.shape[0]) - np.repeat(np.cumsum(n_tiles) - n_tiles, n_tiles)
    lo = m * pos_per_tile
    hi = np.minimum(q_len[s], lo + pos_per_tile) - 1
    own_end = (hi + block_n) // block_n if causal else (q_len[s] + block_n - 1) // block_n
    own_first = (np.maximum(0, lo - window_left) if window_left >= 0 else np.zeros_like(lo)) // block_n
    ctx_end = (ctx_len[s] + block_n - 1) // block_n
    if window_left >= 0:
        ctx_lo = ctx_len[s] + lo - window_left
        ctx_first = np.where(ctx_lo <= 0, 0, np.where(ctx_lo >= ctx_len[s], ctx_end, ctx_lo // block_n))
    else:
        ctx_first = np.zeros_like(lo)
    return np.stack([s, m, own_first, own_end, ctx_first, ctx_end], 1)


def tile_table(segments: np.ndarray, pos_per_tile: int, block_n: int, window_left: int = -1,
               causal: bool = True) -> np.ndarray:
    """int32 (num_tiles, 2) of (segment, m), heaviest first (stable for equal work)."""
    ranges = tile_ranges(segments, pos_per_tile, block_n, window_left, causal)
    work = (ranges[:, 3] - ranges[:, 2]) + (ranges[:, 5] - ranges[:, 4])
    order = np.argsort(-work, kind="stable")
    return np.ascontiguousarray(ranges[order, :2].astype(np.int32))


def key_tiles(segments: np.ndarray, block_keys: int, ctx_shared: bool, causal: bool = True) -> np.ndarray:
    """int32 (num_tiles, 4) of (own_seg, blk, dep_begin, dep_end) for the dK/dV kernel, heaviest first.

    Every key row is owned by exactly one tile. With ``ctx_shared`` (shared_prefix: the context rows of a segment
    are another segment's own rows, same tensor) a segment's own tiles also serve the segments using its rows as
    context; otherwise (the paper's call 2: a separate context tensor) each distinct context gets tiles with
    ``own_seg = -1``. Dependents of one context must be consecutive segments.
    """
    seg = np.asarray(segments, dtype=np.int64).reshape(-1, 4)
    q_start, q_len, ctx_start, ctx_len = seg.T
    rows, work = [], []

    def dep_range(mask: np.ndarray) -> tuple[int, int]:
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            return 0, 0
        if idx[-1] - idx[0] + 1 != idx.size:
            raise ValueError("segments sharing one context must be consecutive in the segment table")
        return int(idx[0]), int(idx[-1]) + 1

    def add(own: int, length: int, deps: tuple[int, int]):
        dep_work = int(q_len[deps[0]:deps[1]].sum())
        for b in range((length + block_keys - 1) // block_keys):
            rows.append((own, b, *deps))
            own_work = (max(0, length - b * block_keys) if causal else length) if own >= 0 else 0
            work.append(own_work + dep_work)

    for s in range(seg.shape[0]):
        deps = (0, 0)
        if ctx_shared:
            deps = dep_range((ctx_len > 0) & (ctx_start == q_start[s]) & (ctx_len == q_len[s]))
        add(s, int(q_len[s]), deps)
    if not ctx_shared:
        seen = set()
        for s in range(seg.shape[0]):
            key = (int(ctx_start[s]), int(ctx_len[s]))
            if key[1] == 0 or key in seen:
                continue
            seen.add(key)
            add(-1, key[1], dep_range((ctx_start == key[0]) & (ctx_len == key[1])))
    if not rows:
        return np.zeros((0, 4), dtype=np.int32)
    order = np.argsort(-np.asarray(work), kind="stable")
    return np.ascontiguousarray(np.asarray(rows, dtype=np.int32)[order])


def check_block_order(tiles: np.ndarray) -> None:
    """Raise unless, within every run of key blocks (same ``own_seg`` and dependents), the blocks appear in ascending
    order. The warp-specialised backward relies on it: it adds the dQ contributions of a run's blocks in block order
    (block b waits for block b - 1) and CTAs start in table order, so a CTA must never wait on a later one."""
    last: dict[tuple[int, int, int], int] = {}
    for own, blk, dep_begin, dep_end in np.asarray(tiles).reshape(-1, 4).tolist():
        run = (own, dep_begin, dep_end) if own >= 0 else (-1, dep_begin, dep_end)
        if blk != last.get(run, -1) + 1:
            raise RuntimeError(f"key tile table out of block order for run {run}: block {blk} after "
                               f"{last.get(run, -1)} (the warp-specialised backward would deadlock)")
        last[run] = blk
