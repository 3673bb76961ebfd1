"""Split shared-key tiles for the backwards whose dQ adds in a fixed order (the warp-specialised Hopper backward,
``csrc/bwd_sm90_ws.cu``, and the mma.sync dK/dV kernel's ordered dQ mode, ``csrc/bwd_dkdv.cu``): short prompts, long
responses.

With the shared-first dQ order the table starts with the shared-key tiles (a prompt's key blocks, each seen by every
response of its group), and one CTA per (tile, KV head) walks every dependent's query tiles. A short prompt has few
such tiles, so few CTAs carry most of the work: at (N, P, R) = (16, 1K, 2K) on 8 KV heads, 64 CTAs of ~2100 steps each
while the whole backward is ~2100 steps per SM of 132, and the responses' own tiles wait on them for their dQ rank.
Measured on an H200 before the split, the WS backward there was 1.18x slower than the cuDNN cascade's (8.51 against
7.19 ms; experiments/results/checks/s26a-h200-20261129T0414Z.log).

:func:`split_shared_tiles` cuts each shared-key row into ``parts`` rows with the same keys and contiguous, disjoint
ranges of its dependents (the first keeps the prompt's own causal walk; the others have ``own_seg = -1`` and read the
keys through their dependents' context, as the paper's call-2 tiles do). dQ is untouched: each (head, query tile)
still receives every key block exactly once, at the same rank, in the same CTA order, so its bits do not change. The
parts' fp32 dK / dV are summed by the last CTA of each run to finish, in part order (``csrc/split_parts.cuh``), so the
result stays bitwise reproducible; it differs from the unsplit kernel's by fp32 rounding only.

:func:`split_parts` chooses ``parts``: enough for the shared-key CTAs to fill the GPU once
(``sms // (shared rows x KV heads)``), at most :data:`MAX_PARTS` and the fewest dependents of any shared row; 1 (no
split) when they fill it already (every shape of the seed's Table 1). A CPU schedule model
(``experiments/ws_order_model.py``) put the WS backward's makespan at 1.04x its ideal at (16, 1K) with the split
against 1.45x without. Measured (H200, WS backward, ms off -> auto, two runs each; checks/s26b-h200-20261129T0444Z.log):
(16, 1K) R = 2K 8.96 / 8.68 -> 7.09 / 6.61, (16, 512) 8.63 / 8.35 -> 5.67 / 5.55, (16, 512) R = 4K 20.30 / 19.89 ->
15.55 / 15.09, (8, 256) R = 4K 10.72 / 10.56 -> 7.68 / 7.38; there the backward is then 1.04-1.10x and fwd+bwd
1.27-1.44x faster than the cuDNN cascade. At R = 2K (checks/s26f-h200-20261129T0503Z.log): (8, 1K) 4.45 / 4.82 -> 3.62 / 3.82,
(4, 1K) 2.64 / 2.81 -> 2.60 / 2.17, (8, 512) 4.24 / 4.50 -> 3.22 / 3.07, (32, 512) 15.00 / 15.34 -> 9.66 / 9.70; with
28 query / 4 KV heads (16, 1K) 10.59 / 10.71 -> 5.85 / 6.16 and (8, 512) 5.66 / 5.79 -> 2.92 / 3.28. Where the
shared-key CTAs fill the GPU a forced split only costs: at (28, 4K) / (8, 8K) / (16, 32K) 2 parts 25.8-26.0 /
16.6-16.8 / 150.0-150.4 ms and 3 parts 26.8-27.2 / 17.1 / 161.5-162.8 against 24.8-25.2 / 15.3-15.4 / 127.0-127.4
unsplit (checks/s34split-h200-20261130T0631Z.json).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Most CTAs a shared-key row is cut into.
MAX_PARTS = 8


@dataclass(frozen=True)
class WsSplit:
    """A split launch table: ``tiles`` (int32 (n, 4)), its head-major CTA split ``first_tiles``, and its first
    ``partial_rows`` rows in runs of ``parts`` (rows ``r - r % parts ..`` hold the same keys)."""

    tiles: np.ndarray
    first_tiles: int
    parts: int
    partial_rows: int


def shared_rows(tiles: np.ndarray, segments: np.ndarray) -> int:
    """The leading rows of a launch table (int32 (n, 4)) that are not a response's own tiles: under the shared-first
    order, its shared-key tiles (segments: the (S, 4) segment table)."""
    from .ws_schedule import is_own_response

    seg = np.asarray(segments).reshape(-1, 4)
    rows = np.asarray(tiles).reshape(-1, 4).tolist()
    own = [is_own_response(t, seg) for t in rows]
    return own.index(True) if True in own else len(rows)


def split_parts(tiles: np.ndarray, first_tiles: int, kv_heads: int, sms: int, max_parts: int = MAX_PARTS) -> int:
    """How many CTAs each of the first ``first_tiles`` rows of a shared-first table (its shared-key tiles) is cut
    into: ``sms // (first_tiles * kv_heads)``, capped by ``max_parts`` and by the fewest dependents of those rows;
    1 means no split."""
    if first_tiles <= 0 or kv_heads <= 0:
        return 1
    return max(1, min(sms // (first_tiles * kv_heads), max_parts, fewest_dependents(tiles, first_tiles)))


def fewest_dependents(tiles: np.ndarray, first_tiles: int) -> int:
    """The fewest dependents of the first ``first_tiles`` rows of a table (int32 (n, 4)): the most parts they split
    into."""
    rows = np.asarray(tiles).reshape(-1, 4)[:first_tiles]
    return int((rows[:, 3] - rows[:, 2]).min())


def _cuts(q_lens: np.ndarray, parts: int) -> list[int]:
    """``parts + 1`` cut points over dependents of ``q_lens`` query rows: each part non-empty, cut where the running
    row count is nearest to an equal share."""
    run = np.concatenate([[0], np.cumsum(q_lens)])
    n = len(q_lens)
    cuts = [0]
    for p in range(1, parts):
        target = run[-1] * p / parts
        i = int(np.searchsorted(run, target))
        if i > 0 and (i > n or abs(run[i - 1] - target) <= abs(run[i] - target)):
            i -= 1
        cuts.append(min(max(i, cuts[-1] + 1), n - (parts - p)))
    return cuts + [n]


def split_shared_tiles(tiles: np.ndarray, segments: np.ndarray, first_tiles: int, parts: int) -> WsSplit:
    """The table with each of its first ``first_tiles`` rows (own_seg, blk, dep_begin, dep_end) replaced by ``parts``
    consecutive rows over the same keys: (own_seg, blk, c0, c1), (-1, blk, c1, c2), ... with the dependents cut by
    query rows (:func:`_cuts`). ``parts`` 1 returns the table unchanged."""
    rows = np.asarray(tiles).reshape(-1, 4)
    if parts <= 1:
        return WsSplit(np.ascontiguousarray(rows.astype(np.int32)), first_tiles, 1, 0)
    seg = np.asarray(segments).reshape(-1, 4)
    out = []
    for own, blk, begin, end in rows[:first_tiles].tolist():
        if end - begin < parts:
            raise ValueError(f"key tile {[own, blk, begin, end]} has {end - begin} dependents: too few for {parts} "
                             "parts")
        cuts = [begin + c for c in _cuts(seg[begin:end, 1], parts)]
        out += [[own if p == 0 else -1, blk, cuts[p], cuts[p + 1]] for p in range(parts)]
    table = np.concatenate([np.asarray(out, dtype=np.int64).reshape(-1, 4), rows[first_tiles:]])
    split = WsSplit(np.ascontiguousarray(table.astype(np.int32)), len(out), parts, len(out))
    check_split(split, rows, segments)
    return split


def key_rows(tile, segments: np.ndarray) -> tuple[int, int, int]:
    """(first packed key row, key block, valid keys) a row of the table holds: its own segment's rows, or with
    own_seg -1 its first dependent's context rows (the same rows when the context is another segment's own rows)."""
    own, blk, dep_begin, _ = (int(x) for x in tile)
    seg = np.asarray(segments).reshape(-1, 4)
    q_start, q_len, ctx_start, ctx_len = (int(x) for x in seg[own if own >= 0 else dep_begin])
    start, length = (q_start, q_len) if own >= 0 else (ctx_start, ctx_len)
    return start, blk, length


def check_split(split: WsSplit, tiles: np.ndarray, segments: np.ndarray) -> None:
    """Raise unless ``split`` is ``tiles`` with each of its shared-key rows cut into a run of ``split.parts`` rows
    that hold the same keys, keep the original's own walk in the first row only, and cover its dependents exactly
    once, in order; the rows after the runs must be the original's, unchanged."""
    rows = np.asarray(tiles).reshape(-1, 4)
    table = np.asarray(split.tiles).reshape(-1, 4)
    parts, runs = split.parts, split.partial_rows // max(split.parts, 1)
    if parts < 1 or split.partial_rows != runs * parts or split.partial_rows > table.shape[0]:
        raise RuntimeError(f"split: {split.partial_rows} partial rows are not whole runs of {parts}")
    if parts == 1:
        if split.partial_rows or not np.array_equal(table, rows):
            raise RuntimeError("split: one part must leave the table unchanged, with no partial rows")
        return
    if split.first_tiles != split.partial_rows or not np.array_equal(table[split.partial_rows:], rows[runs:]):
        raise RuntimeError("split: the rows after the split runs must be the original table's, unchanged")
    for r in range(runs):
        orig, run = rows[r].tolist(), table[r * parts:(r + 1) * parts].tolist()
        keys = {key_rows(t, segments) for t in run}
        if keys != {key_rows(orig, segments)}:
            raise RuntimeError(f"split run {r} ({run}) does not hold the keys of {orig}")
        if run[0][0] != orig[0] or any(t[0] != -1 for t in run[1:]):
            raise RuntimeError(f"split run {r} ({run}): only its first row keeps the own walk of {orig}")
        bounds = [run[0][2]] + [t[3] for t in run]
        if (bounds[0] != orig[2] or bounds[-1] != orig[3] or any(t[2] != b for t, b in zip(run, bounds))
                or any(t[3] <= t[2] for t in run)):
            raise RuntimeError(f"split run {r} ({run}) does not cover the dependents {orig[2:]} once, in order")
