"""The warp-specialised Hopper backward's walk, launch order and dQ ordering, stated in Python
(``csrc/bwd_sm90_ws.cu`` runs the same logic), so the CPU can check what the GPU relies on:

* the walk of a key tile: every dependent segment's query tiles in order (they see the whole block), then the own
  segment's query tiles from the last one down to the block's first (causal), query heads innermost;
* every step's dQ goes into ONE accumulator, in a fixed order per (query head, query tile): a contribution of rank r
  waits until the tile's counter reads r. A response's own (causal) key blocks b have rank b; the blocks b of keys a
  group shares (a prompt, or a separate context) have rank (own blocks reaching the tile) + b when the tile is a
  dependent's, and b when it is the prompt's own tile. So the ranks reaching every counter must be exactly
  0, 1, ..., k - 1 in launch order — a gap would leave its successors waiting forever, and a rank launched after a
  higher one would deadlock;
* the launch order (:func:`launch_order`): every own-response tile before every shared-key tile, blocks in order
  within a run (:func:`dualkv.cuda.schedule.check_block_order`);
* the CTA order (:func:`cta_order`): head-major, each KV head's first ``first_tiles`` rows of the table in turn, then
  its other rows; every KV head sees the table in order, so the two statements above carry over to CTAs.

That is the own-first order (``DUALKV_TWO_LEVEL_DQ_ORDER=own``); the default is the shared-first order below, whose
CTA order splits after the shared-key tiles (:func:`head_major_split`).

Prefix trees (:class:`dualkv.PrefixTreeLayout` in preorder, the DKV_TREE=1 build; pass :class:`TreeRanks`): a key
tile ``(i, b, i + 1, end)`` owns block b of node i and its dependents are i's descendants. In the nearest-first
order (``DUALKV_TREE_DQ_ORDER=nearest``; the default is root-first, below) a query tile of node j receives its own
node's blocks first, then its parent's, its grandparent's, ... (nearest ancestor first): a
contribution of ancestor i's block b ranks (own blocks reaching the tile) + (A[j] - A[i] - blocks(i)) + b, with
blocks(x) = ceil(len(x) / 128) and A[x] the blocks of x's proper ancestors (the blocks of the nodes strictly
between i and j come before i's). A GroupLayout's depth-1 tree has A[response] = blocks(prompt): today's rank. The
launch order puts deeper nodes' tiles first (depth descending; stable, so blocks stay in order within a node).

Root-first tree order (``TreeRanks(root_first=True)``, the kernels' DKV_TREE_ROOT_FIRST=1 builds, chosen by
``DUALKV_TREE_DQ_ORDER=root``): a query tile of node j receives its root's blocks first, then each ancestor's down
the chain, then its own causal blocks — ancestor (or own node) i's block b has rank A[i] + b, one constant per key
tile. The launch order is then depth ascending with each node's tiles adjacent (nodes in heaviest-first order,
blocks in order): the CTAs of one node start together and sweep the same query tiles in lockstep, so the dQ
accumulator and Q/dO tiles they share can be reused from L2, and the longest walks (the roots') start first.

Shared-first two-level order (``shared_first=True``, the kernels' DKV_TREE_ROOT_FIRST=1 builds without DKV_TREE,
``DUALKV_TWO_LEVEL_DQ_ORDER=shared``, the default): a dependent's query tile receives the shared (context) keys' blocks
b first (rank b), then its own causal blocks (rank ceil(ctx_len / block_keys) + b) — a depth-1 tree's root-first
order — and the shared-key tiles, the heaviest, are launched before the own-response tiles.

Node-major launch (``launch_order(..., node_major_tiles=True)``, ``DUALKV_KEY_TILE_ORDER=node``; always part of the
root-first order): before the orders above are applied, each key run's tiles (a segment's or node's own keys, or a
separate context's) are made adjacent, blocks in order (:func:`node_major`), instead of the heaviest-first table's
interleaving of equal-weight runs (block 0 of every prompt of a micro-batch, then block 1, ...). Ranks are untouched,
so every counter receives its contributions in the same order as before: the same bits.

The mma.sync dK/dV kernel's ordered-dQ mode (``csrc/bwd_dkdv.cu``, DKV_DQ_ORDERED) runs the same walk and ranks at
its own tile sizes (:class:`Geometry`: ``step`` query rows per counter, ``block_keys`` keys per rank; see
:func:`mma_geometry`) and also without causal masks (``causal=False``: a dependent's tile then receives all of its
segment's own blocks first, and the own walk goes down to tile 0). Every function below takes the geometry; the
default, :data:`WS`, is the warp-specialised kernel's.

:func:`numeric_backward` replays the walk in float64 (masks included) so the CPU tests can compare its dQ, dK, dV
with the reference backward.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from .tree_schedule import RANK_BLOCK_KEYS, ancestor_key_blocks

STEP = 64
BLOCK_KEYS = RANK_BLOCK_KEYS


@dataclass(frozen=True)
class Geometry:
    """A kernel's dQ-order geometry: a counter per ``step`` query rows of a segment, a rank per ``block_keys`` keys,
    and whether a segment's own keys are causal. ``block_keys`` must be a multiple of ``step`` (a causal own walk
    then starts at a tile boundary, and a tile lies inside one key block)."""

    step: int = STEP
    block_keys: int = BLOCK_KEYS
    causal: bool = True

    def __post_init__(self):
        if self.step <= 0 or self.block_keys <= 0 or self.block_keys % self.step:
            raise ValueError(f"block_keys ({self.block_keys}) must be a positive multiple of step ({self.step})")


#: The warp-specialised Hopper backward's geometry (csrc/bwd_sm90_ws.cu: 64-query steps, 128-key tiles, causal; its
#: wide builds, head dims 192 and 256, rank per 64-key tile: ``Geometry(block_keys=64)``).
WS = Geometry()


def mma_geometry(head_dim: int, causal: bool = True) -> Geometry:
    """The mma.sync dK/dV kernel's geometry at ``head_dim`` (its tile from :data:`dualkv.cuda.configs.DKDV_TILES`)."""
    from .configs import DKDV_TILES

    tile = DKDV_TILES[head_dim]
    return Geometry(tile.block_m, tile.block_keys, causal)


@dataclass(frozen=True)
class TreeRanks:
    """What the tree ranks and launch order need per node of a preorder tree (S nodes)."""

    depth: np.ndarray            # int64 (S,): 0 for a root
    blocks: np.ndarray           # int64 (S,): ceil(len / BLOCK_KEYS), the node's key blocks
    ancestor_blocks: np.ndarray  # int64 (S,): A, the summed blocks of the node's proper ancestors
    root_first: bool = False     # the root-first dQ order (module docstring); default: nearest ancestor first

    @classmethod
    def of(cls, layout, root_first: bool = False, block_keys: int = BLOCK_KEYS) -> "TreeRanks":
        """From a :class:`dualkv.PrefixTreeLayout` (A as the tree table stores it), in key blocks of ``block_keys``
        (the kernel's key tile)."""
        return cls(np.asarray(layout.depths, dtype=np.int64),
                   -(-np.asarray(layout.node_lens, dtype=np.int64) // block_keys),
                   ancestor_key_blocks(layout, block_keys), root_first)


@dataclass(frozen=True)
class Step:
    seg: int      # segment whose queries this step reads
    qt: int       # query tile (STEP rows) of that segment
    head: int     # query head within the GQA group
    own: bool     # causal (the key tile's own segment) or fully visible (a dependent)
    reach: int = 0  # own key blocks of ``seg`` reaching the tile (:func:`own_reach`): a dependent's rank offset
    ctx_blocks: int = 0  # an own step's context key blocks (all reach it): its rank offset in the shared-first order


def _own_first_tile(blk: int, geo: Geometry) -> int:
    """The lowest query tile of a key block's own walk: the block's first key (causal), else tile 0."""
    return blk * geo.block_keys // geo.step if geo.causal else 0


def walk(tile: tuple[int, int, int, int], segments: np.ndarray, group: int, geo: Geometry = WS) -> list[Step]:
    """The steps of one key tile (own_seg, blk, dep_begin, dep_end), in the kernel's order."""
    own_seg, blk, dep_begin, dep_end = tile
    step = geo.step
    steps = []
    for src in range(dep_begin, dep_end):
        q_len = int(segments[src, 1])
        for qt in range((q_len + step - 1) // step):
            steps += [Step(src, qt, h, False, own_reach(qt, geo, q_len)) for h in range(group)]
    if own_seg >= 0:
        top = (int(segments[own_seg, 1]) + step - 1) // step - 1
        ctx_blocks = (int(segments[own_seg, 3]) + geo.block_keys - 1) // geo.block_keys
        for qt in range(top, _own_first_tile(blk, geo) - 1, -1):
            steps += [Step(own_seg, qt, h, True, 0, ctx_blocks) for h in range(group)]
    return steps


def walk_length(tile: tuple[int, int, int, int], segments: np.ndarray, group: int, geo: Geometry = WS) -> int:
    """The number of steps of :func:`walk` by the closed form the kernel's consumers loop on (``walk_steps``)."""
    own_seg, blk, dep_begin, dep_end = tile
    step = geo.step
    n = sum(max((int(segments[src, 1]) + step - 1) // step, 1) for src in range(dep_begin, dep_end))
    if own_seg >= 0:
        top = (int(segments[own_seg, 1]) + step - 1) // step - 1
        n += max(0, top - _own_first_tile(blk, geo) + 1)
    return n * group


def is_own_response(tile: tuple[int, int, int, int], segments: np.ndarray) -> bool:
    """Whether a key tile holds a response's own keys (its segment has a context), which rank first."""
    own_seg = tile[0]
    return own_seg >= 0 and int(segments[own_seg, 3]) > 0


def own_reach(qt: int, geo: Geometry = WS, q_len: int = 0) -> int:
    """Own key blocks reaching query tile ``qt`` of a segment of ``q_len`` rows. Causal: blocks 0 .. (last row of
    the tile) // block_keys (the last one exists: its first key, at most the tile's first row, is inside the
    segment); not causal: all of the segment's blocks."""
    if not geo.causal:
        return (q_len + geo.block_keys - 1) // geo.block_keys
    return (qt * geo.step + geo.step - 1) // geo.block_keys + 1


def rank(tile: tuple[int, int, int, int], step: Step, tree: TreeRanks | None = None,
         shared_first: bool = False) -> int:
    """The position of ``tile``'s contribution among those reaching ``step``'s (head, query tile) counter
    (``shared_first``: the two-level shared-first order, module docstring)."""
    if tree is not None and tree.root_first:  # own or a descendant's tile: A[key node] + block
        return int(tree.ancestor_blocks[tile[0]]) + tile[1]
    if shared_first and tree is None:  # a dependent's shared block b first, then the own blocks after all of those
        return tile[1] + (step.ctx_blocks if step.own else 0)
    if step.own:
        return tile[1]
    between = 0  # two-level layouts: the shared keys come right after the dependent's own blocks
    if tree is not None:  # the blocks of the nodes strictly between the key's node and the dependent
        between = int(tree.ancestor_blocks[step.seg] - tree.ancestor_blocks[tile[0]] - tree.blocks[tile[0]])
    return tile[1] + step.reach + between


def launch_order(tiles: np.ndarray, segments: np.ndarray, tree: TreeRanks | None = None,
                 node_major_tiles: bool = False, shared_first: bool = False) -> np.ndarray:
    """``tiles`` (int32 (n, 4), heaviest first) with every own-response tile moved before the shared-key tiles,
    each part keeping its order; for a tree, the tiles of deeper nodes first (stable), or with ``tree.root_first``
    shallower nodes first. With ``node_major_tiles`` (always under ``root_first``) each segment's (node's) tiles are
    adjacent first (:func:`node_major`), so the CTAs of one key run start together and share their query tiles."""
    tiles = np.asarray(tiles).reshape(-1, 4)
    if node_major_tiles or (tree is not None and tree.root_first):
        tiles = node_major(tiles)
    if tree is not None and tree.root_first:
        order = np.argsort(tree.depth[tiles[:, 0]], kind="stable")
        return np.ascontiguousarray(tiles[order].astype(np.int32))
    if tree is not None:
        order = np.argsort(-tree.depth[tiles[:, 0]], kind="stable")
        return np.ascontiguousarray(tiles[order].astype(np.int32))
    seg = np.asarray(segments).reshape(-1, 4)
    own = np.array([is_own_response(t, seg) for t in tiles.tolist()], dtype=bool)
    first = ~own if shared_first else own
    return np.ascontiguousarray(np.concatenate([tiles[first], tiles[~first]]).astype(np.int32))


def _key_run(tile) -> tuple[int, int]:
    """The key run a tile belongs to: its own segment (node), or for a separate context (own_seg -1, the paper's
    call 2) the context's first dependent."""
    return (int(tile[0]), -1) if tile[0] >= 0 else (-1, int(tile[2]))


def node_major(tiles: np.ndarray) -> np.ndarray:
    """Key tiles (int32 (n, 4)) regrouped so each key run's (segment's, node's, separate context's) tiles are
    adjacent, blocks in order; runs in the order of their first tile in ``tiles`` (heaviest first for
    :func:`dualkv.cuda.schedule.key_tiles` and :func:`dualkv.cuda.tree_schedule.tree_key_tiles`)."""
    tiles = np.asarray(tiles).reshape(-1, 4)
    rows = tiles.tolist()
    first: dict[tuple[int, int], int] = {}
    for i, tile in enumerate(rows):
        first.setdefault(_key_run(tile), i)
    order = sorted(range(len(rows)), key=lambda i: (first[_key_run(rows[i])], rows[i][1]))
    return np.ascontiguousarray(tiles[order])


def check_launch_order(tiles: np.ndarray, segments: np.ndarray, tree: TreeRanks | None = None,
                       shared_first: bool = False) -> None:
    """Raise unless every own-response tile comes before every shared-key tile (``shared_first``: after every one;
    for a tree: no tile after a shallower node's; root-first: no tile after a deeper node's), which the dQ ranks rely
    on."""
    if tree is not None:
        rows = np.asarray(tiles).reshape(-1, 4)
        depth = tree.depth[rows[:, 0]]
        step = np.diff(depth)
        bad = np.flatnonzero(step < 0 if tree.root_first else step > 0)
        if bad.size:
            t = bad[0] + 1
            raise RuntimeError(f"key tile {rows[t].tolist()} (row {t}, a node of depth {depth[t]}) comes after a "
                               f"tile of depth {depth[t - 1]}: the {'root-first ' if tree.root_first else ''}"
                               "warp-specialised backward's dQ order would deadlock")
        return
    seg = np.asarray(segments).reshape(-1, 4)
    seen_second = False
    for t in np.asarray(tiles).reshape(-1, 4).tolist():
        if is_own_response(t, seg) == shared_first:
            seen_second = True
        elif seen_second:
            first, second = ("a shared-key", "a response's own") if shared_first else ("a response's own",
                                                                                        "a shared-key")
            raise RuntimeError(f"key tile {t} ({first} keys) comes after {second} tile: the "
                               f"{'shared-first ' if shared_first else ''}warp-specialised backward's dQ order would "
                               "deadlock")


def head_major_split(tiles: np.ndarray, segments: np.ndarray | None, shared_first: bool) -> int:
    """``first_tiles`` of the head-major CTA order (:func:`cta_order`) for a two-level launch order: with the
    shared-first order, the number of leading shared-key tiles (every KV head's heavy tiles then launch before any
    light own-response tile); otherwise (or on a tree, ``segments`` None) the whole table (plain head-major)."""
    rows = np.asarray(tiles).reshape(-1, 4)
    if not shared_first or segments is None:
        return int(rows.shape[0])
    seg = np.asarray(segments).reshape(-1, 4)
    own = [is_own_response(t, seg) for t in rows.tolist()]
    return own.index(True) if True in own else int(rows.shape[0])


def cta_order(n_tiles: int, kv_heads: int, first_tiles: int | None = None, head_major: bool = True) -> np.ndarray:
    """int64 (n_tiles * kv_heads, 2): the (KV head, table row) of each CTA in launch (blockIdx.x) order, as
    ``cta_head_tile`` in csrc/keywalk.cuh computes it. Head-major: the table's first ``first_tiles`` rows of every
    KV head in turn, then its other rows of every KV head in turn (``first_tiles`` None or ``n_tiles``: each head's
    whole table in turn); otherwise a row's KV heads adjacent. Every KV head sees its rows in table order, so a CTA
    waits only on CTAs launched before it whenever the table is a valid launch order (:func:`check_cta_order`)."""
    first = n_tiles if first_tiles is None else first_tiles
    if not 0 <= first <= n_tiles:
        raise ValueError(f"first_tiles ({first}) must lie in [0, {n_tiles}]")
    if not head_major:
        bid = np.arange(n_tiles * kv_heads)
        return np.stack([bid % kv_heads, bid // kv_heads], 1)

    def each_head(rows: np.ndarray) -> np.ndarray:  # rows of every KV head in turn
        return np.stack([np.repeat(np.arange(kv_heads), len(rows)), np.tile(rows, kv_heads)], 1)

    return np.concatenate([each_head(np.arange(first)), each_head(np.arange(first, n_tiles))]).astype(np.int64)


def check_cta_order(order: np.ndarray, n_tiles: int, kv_heads: int) -> None:
    """Raise unless ``order`` (:func:`cta_order`) launches every (KV head, row) exactly once and each KV head's rows
    in table order (the dQ counters of a head then receive their contributions in launch order)."""
    order = np.asarray(order).reshape(-1, 2)
    if order.shape[0] != n_tiles * kv_heads or len({tuple(r) for r in order.tolist()}) != order.shape[0]:
        raise RuntimeError(f"the CTA order does not launch each of the {n_tiles} rows x {kv_heads} KV heads once")
    for h in range(kv_heads):
        rows = order[order[:, 0] == h, 1]
        if not np.array_equal(rows, np.arange(n_tiles)):
            raise RuntimeError(f"KV head {h}'s key tiles launch out of table order: {rows[:8].tolist()}...")


def dq_contributors(tiles: np.ndarray, segments: np.ndarray, group: int, tree: TreeRanks | None = None,
                    geo: Geometry = WS, shared_first: bool = False,
                    ctas: np.ndarray | None = None) -> dict[tuple, list[int]]:
    """(segment, query tile, head) -> the ranks of the contributions adding into it, in table (= launch) order; with
    ``ctas`` (:func:`cta_order`), (KV head, segment, query tile, head) -> the ranks in that CTA launch order."""
    if tree is not None and not geo.causal:
        raise ValueError("tree ranks are defined for causal kernels only")
    rows = np.asarray(tiles).reshape(-1, 4).tolist()
    launched = [(None, row) for row in range(len(rows))] if ctas is None else np.asarray(ctas).tolist()
    out: dict[tuple, list[int]] = defaultdict(list)
    for kv_head, row in launched:
        for st in walk(rows[row], segments, group, geo):
            key = (st.seg, st.qt, st.head) if ctas is None else (kv_head, st.seg, st.qt, st.head)
            out[key].append(rank(rows[row], st, tree, shared_first))
    return out


def check_dq_order(tiles: np.ndarray, segments: np.ndarray, group: int = 1, tree: TreeRanks | None = None,
                   geo: Geometry = WS, shared_first: bool = False, ctas: np.ndarray | None = None) -> None:
    """Raise unless every dQ counter receives ranks 0, 1, ..., k - 1 in launch order (see the module docstring): the
    table's, or with ``ctas`` that CTA order's."""
    for key, ranks in dq_contributors(tiles, segments, group, tree, geo, shared_first, ctas).items():
        if ranks != list(range(len(ranks))):
            raise RuntimeError(f"dQ counter {key} would receive ranks {ranks}: not 0..k-1 in launch order")


def numeric_backward(q, k_ctx, v_ctx, k_own, v_own, dout, segments: np.ndarray, tiles: np.ndarray, scale: float,
                     tree=None, geo: Geometry = WS):
    """dQ, dK/dV (context rows and own rows) by replaying the walk in the inputs' dtype (float64 for proofs).

    q, dout: (T, H, d); k_own/v_own: (T, H_k, d) aligned with q; k_ctx/v_ctx: the context rows' tensor (the same
    tensor as k_own when the context is another segment's own rows). ``tree``: the preorder
    :class:`dualkv.PrefixTreeLayout` whose (S, 4) tree-table rows ``segments`` are (the forward statistics then come
    from the tree reference). ``geo``: the kernel's step, key block and causality (``tiles`` built at its
    ``block_keys``). Returns (dq, dk_ctx, dv_ctx, dk_own, dv_own).
    """
    step, block_keys = geo.step, geo.block_keys
    heads, kv_heads = q.shape[1], k_own.shape[1]
    group = heads // kv_heads
    seg = np.asarray(segments).reshape(-1, 4)
    lse, out = _forward_statistics(q, k_ctx, v_ctx, k_own, v_own, seg, scale, tree, geo.causal)
    delta = (dout * out).sum(-1).t()  # (H, T)

    dq = torch.zeros_like(q)
    dk_own, dv_own = torch.zeros_like(k_own), torch.zeros_like(v_own)
    dk_ctx, dv_ctx = torch.zeros_like(k_ctx), torch.zeros_like(v_ctx)
    for tile in np.asarray(tiles).reshape(-1, 4).tolist():
        own_seg, blk, dep_begin, dep_end = tile
        key_seg = own_seg if own_seg >= 0 else dep_begin
        q0k, qlk, c0k, clk = (int(x) for x in seg[key_seg])
        key0 = blk * block_keys
        length = qlk if own_seg >= 0 else clk
        count = min(block_keys, length - key0)
        row0 = (q0k if own_seg >= 0 else c0k) + key0
        k_src, v_src = (k_own, v_own) if own_seg >= 0 else (k_ctx, v_ctx)
        dk_dst, dv_dst = (dk_own, dv_own) if own_seg >= 0 else (dk_ctx, dv_ctx)
        for kv in range(kv_heads):
            kb, vb = k_src[row0:row0 + count, kv], v_src[row0:row0 + count, kv]
            for st in walk(tile, seg, group, geo):
                q0, ql, c0, cl = (int(x) for x in seg[st.seg])
                h = kv * group + st.head
                p0 = st.qt * step
                n = min(step, ql - p0)
                rows = slice(q0 + p0, q0 + p0 + n)
                s_t = kb @ q[rows, h].t() * scale                          # (count, n)
                p_t = torch.exp(s_t - lse[h, rows][None, :])
                # a tree row's 4th column is the node's position: the same relative causal mask
                if st.own and geo.causal:
                    key_pos = cl + key0 + torch.arange(count)
                    q_pos = cl + p0 + torch.arange(n)
                    p_t = p_t.masked_fill(key_pos[:, None] > q_pos[None, :], 0.0)
                dp_t = vb @ dout[rows, h].t()
                ds_t = p_t * (dp_t - delta[h, rows][None, :])
                dv_dst[row0:row0 + count, kv] += p_t @ dout[rows, h]
                dk_dst[row0:row0 + count, kv] += ds_t @ q[rows, h] * scale
                dq[rows, h] += ds_t.t() @ kb * scale
    return dq, dk_ctx, dv_ctx, dk_own, dv_own


def _forward_statistics(q, k_ctx, v_ctx, k_own, v_own, seg: np.ndarray, scale: float, tree, causal: bool = True):
    """(LSE (H, T), out (T, H, d)): what the kernel reads (its LSE and D = rowsum(dO * O))."""
    heads, kv_heads = q.shape[1], k_own.shape[1]
    group = heads // kv_heads
    if tree is not None:
        from ..reference.tree import tree_attention

        out, lse = tree_attention(q, k_own, v_own, tree, softmax_scale=scale, return_lse=True)
        return lse.to(q.dtype), out
    lse = torch.full((heads, q.shape[0]), float("-inf"), dtype=q.dtype)
    out = torch.zeros_like(q)
    for s in range(seg.shape[0]):
        q0, ql, c0, cl = (int(x) for x in seg[s])
        keys = torch.cat([k_ctx[c0:c0 + cl], k_own[q0:q0 + ql]]).repeat_interleave(group, 1)
        vals = torch.cat([v_ctx[c0:c0 + cl], v_own[q0:q0 + ql]]).repeat_interleave(group, 1)
        sc = torch.einsum("qhd,khd->hqk", q[q0:q0 + ql], keys) * scale
        pos_q = cl + torch.arange(ql)
        pos_k = torch.arange(cl + ql)
        if causal:
            sc = sc.masked_fill(pos_k[None, None, :] > pos_q[None, :, None], float("-inf"))
        l_s = torch.logsumexp(sc, -1)
        lse[:, q0:q0 + ql] = l_s
        out[q0:q0 + ql] = torch.einsum("hqk,khd->qhd", torch.exp(sc - l_s[..., None]), vals)
    return lse, out
