"""Host-side schedule of the kernels for a :class:`dualkv.PrefixTreeLayout` (the ``DKV_TREE=1`` query kernels).

A tree runs on the same kernels as a :class:`dualkv.GroupLayout`, with two generalisations:

* **Context = the ancestor chain.** The segment of node i is ``(q_start, q_len, runs, pos)``: its own queries,
  ``runs`` the int2 index (from the start of the table) of its context list, and ``pos`` the logical position of
  its first token (the summed length of its ancestors, which plays the role of ``ctx_len`` in the causal masks). The
  context list is ``(n_runs, A)`` followed by the ancestors' packed runs ``(k_start, k_len)``, root first, with runs
  that touch in the packed stream merged (a chain of first children is one run). The forward and dQ kernels tile each
  run into ``block_n``-key blocks from its own start and visit them after the own (causal) blocks, all under one
  online softmax; :func:`tree_block` is the Python statement of ``tree_block`` in ``csrc/qtile.cuh``.
* **Dependents = the descendants.** A key tile ``(node, blk, dep_begin, dep_end)`` owns keys of one node and walks
  that node's queries causally, then every query of segments ``dep_begin .. dep_end - 1`` fully: with nodes in DFS
  preorder those are exactly the node's descendants. So each ancestor key row's dK/dV is summed over every
  descendant and the GQA group in fp32, in a fixed order, by one CTA (the unchanged dK/dV kernels: deterministic).
* **dQ order of the warp-specialised backward.** The ``A`` of a context list header is the node's
  :func:`ancestor_key_blocks` (key blocks of :data:`RANK_BLOCK_KEYS` keys of all its proper ancestors): the DKV_TREE=1
  ``bwd_sm90_ws`` ranks a dQ contribution by it (dualkv/cuda/ws_schedule.py); the query kernels ignore it.

Nodes must be in DFS preorder (what :meth:`PrefixTreeLayout.from_sequences` and ``from_group_layout`` emit);
:func:`preorder_permutation` reorders any other tree. Trees have no sliding window in the kernels.
"""

from __future__ import annotations

import numpy as np

from ..tree import PrefixTreeLayout

__all__ = ["RANK_BLOCK_KEYS", "ancestor_key_blocks", "subtree_ends", "is_preorder", "check_preorder",
           "preorder_permutation", "tree_runs", "tree_segments", "rank_base", "tree_rows", "tree_block",
           "context_block_counts", "tree_tile_table", "tree_key_tiles"]


#: Keys per block of the warp-specialised backward (``kBlockKeys`` of csrc/bwd_sm90_ws.cu), the unit of the
#: ancestor block counts in the tree table.
RANK_BLOCK_KEYS = 128


def ancestor_key_blocks(layout: PrefixTreeLayout, block_keys: int = RANK_BLOCK_KEYS) -> np.ndarray:
    """int64 (num_nodes,): A[i] = the summed key-block count ceil(len / block_keys) of node i's proper ancestors."""
    blocks = -(-np.asarray(layout.node_lens, dtype=np.int64) // block_keys)
    out = np.zeros(layout.num_nodes, dtype=np.int64)
    for i, p in enumerate(layout.parents):  # parents precede their children
        if p >= 0:
            out[i] = out[p] + blocks[p]
    return out


def subtree_ends(layout: PrefixTreeLayout) -> np.ndarray:
    """int64 (num_nodes,): one past the last node index in each node's subtree (its descendants are
    ``i + 1 .. end - 1`` when the layout is in preorder)."""
    end = np.arange(1, layout.num_nodes + 1, dtype=np.int64)
    for i in range(layout.num_nodes - 1, -1, -1):
        p = layout.parents[i]
        if p >= 0:
            end[p] = max(end[p], end[i])
    return end


def is_preorder(layout: PrefixTreeLayout) -> bool:
    """Whether every node's subtree occupies consecutive node indices starting at the node (DFS preorder)."""
    sizes = np.ones(layout.num_nodes, dtype=np.int64)
    for i in range(layout.num_nodes - 1, -1, -1):
        p = layout.parents[i]
        if p >= 0:
            sizes[p] += sizes[i]
    return bool(np.array_equal(subtree_ends(layout) - np.arange(layout.num_nodes), sizes))


def check_preorder(layout: PrefixTreeLayout) -> None:
    """Raise ValueError naming the first node whose subtree is not contiguous."""
    if is_preorder(layout):
        return
    stack: list[int] = []
    for i, p in enumerate(layout.parents):
        while stack and stack[-1] != p:
            stack.pop()
        if p >= 0 and not stack:
            raise ValueError(f"the tree's nodes are not in depth-first preorder: node {i} (parent {p}) comes after "
                             f"another subtree closed node {p}'s; the tree kernels need every subtree contiguous "
                             "(PrefixTreeLayout.from_sequences emits preorder; see "
                             "dualkv.cuda.tree_schedule.preorder_permutation)")
        stack.append(i)
    raise AssertionError("unreachable: a non-preorder tree has a node whose parent left the DFS stack")


def preorder_permutation(layout: PrefixTreeLayout) -> tuple[PrefixTreeLayout, np.ndarray]:
    """The same forest with its nodes in DFS preorder (children in index order), and the int64 (T,) token
    permutation: ``x_preorder = x[perm]`` for packed (T, ...) tensors, ``x = x_preorder[argsort(perm)]``."""
    order: list[int] = []
    stack = list(reversed(layout.roots))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(layout.children[i]))
    new_index = {old: new for new, old in enumerate(order)}
    lens = tuple(layout.node_lens[i] for i in order)
    parents = tuple(-1 if layout.parents[i] < 0 else new_index[layout.parents[i]] for i in order)
    perm = np.concatenate([np.arange(*layout.node_range(i), dtype=np.int64) for i in order])
    return PrefixTreeLayout(lens, parents), perm


def tree_runs(layout: PrefixTreeLayout, node: int) -> list[tuple[int, int]]:
    """The packed runs ``(k_start, k_len)`` of ``node``'s ancestors, root first, touching runs merged."""
    runs: list[list[int]] = []
    for a in layout.ancestors(node):
        start, n = layout.node_starts[a], layout.node_lens[a]
        if runs and runs[-1][0] + runs[-1][1] == start:
            runs[-1][1] += n
        else:
            runs.append([start, n])
    return [(s, n) for s, n in runs]


def tree_segments(layout: PrefixTreeLayout, rank_block_keys: int = RANK_BLOCK_KEYS) -> np.ndarray:
    """int32 (4 S + 2 (S + R),) the kernels' table for a preorder tree of S nodes and R context runs: S rows
    ``(q_start, q_len, runs, pos)`` then, node after node, ``(n_runs, A)`` and the node's runs ``(k_start, k_len)``
    (``runs`` is the int2 index of that header from the start of the table; ``A`` its :func:`ancestor_key_blocks` in
    blocks of ``rank_block_keys``: the warp-specialised backward's key tile, 64 in its wide builds)."""
    check_preorder(layout)
    n = layout.num_nodes
    rows = np.zeros((n, 4), dtype=np.int64)
    lists: list[tuple[int, int]] = []
    ancestors = ancestor_key_blocks(layout, rank_block_keys)
    for i in range(n):
        runs = tree_runs(layout, i)
        rows[i] = (layout.node_starts[i], layout.node_lens[i], 2 * n + len(lists), layout.node_positions[i])
        lists.append((len(runs), int(ancestors[i])))
        lists.extend(runs)
    table = np.concatenate([rows.reshape(-1), np.asarray(lists, dtype=np.int64).reshape(-1)])
    if table.max(initial=0) >= 2**31:
        raise ValueError("the tree's kernel table exceeds int32 offsets")
    return table.astype(np.int32)


def parse_segment(table: np.ndarray, s: int) -> tuple[int, int, int, int]:
    """Row ``s`` of a :func:`tree_segments` table: (q_start, q_len, runs, pos) — ``load_segment`` in the kernels."""
    q_start, q_len, runs, pos = (int(x) for x in table[4 * s:4 * s + 4])
    return q_start, q_len, runs, pos


def rank_base(table: np.ndarray, s: int) -> int:
    """The ancestor key-block count ``A`` of segment ``s`` in a :func:`tree_segments` table (the header's second
    int): ``tree_rank_base`` in ``csrc/bwd_sm90_ws.cu``."""
    return int(table[2 * parse_segment(table, s)[2] + 1])


def tree_rows(table: np.ndarray, num_nodes: int) -> np.ndarray:
    """int64 (num_nodes, 4): the segment rows ``(q_start, q_len, runs, pos)`` of a :func:`tree_segments` table."""
    return np.asarray(table[:4 * num_nodes], dtype=np.int64).reshape(num_nodes, 4)


def context_list(table: np.ndarray, runs: int) -> list[tuple[int, int]]:
    """The runs of the context list at int2 index ``runs`` of a :func:`tree_segments` table."""
    n_runs = int(table[2 * runs])
    return [(int(table[2 * (runs + r)]), int(table[2 * (runs + r) + 1])) for r in range(1, n_runs + 1)]


def context_blocks(runs: list[tuple[int, int]], block_n: int) -> int:
    """``tree_context_blocks`` in ``csrc/qtile.cuh``: context blocks of a node, each run tiled from its start."""
    return sum((n + block_n - 1) // block_n for _, n in runs)


def tree_block(runs: list[tuple[int, int]], j: int, block_n: int) -> tuple[int, int]:
    """``tree_block`` in ``csrc/qtile.cuh``: (first packed row, valid keys) of context block ``j``."""
    for start, n in runs[:-1]:
        nb = (n + block_n - 1) // block_n
        if j < nb:
            return start + j * block_n, min(block_n, n - j * block_n)
        j -= nb
    start, n = runs[-1]
    return start + j * block_n, min(block_n, n - j * block_n)


def context_block_counts(layout: PrefixTreeLayout, block_n: int) -> np.ndarray:
    """int64 (num_nodes,): context blocks each node's query tiles visit."""
    return np.asarray([context_blocks(tree_runs(layout, i), block_n) for i in range(layout.num_nodes)],
                      dtype=np.int64)


def tree_tile_table(layout: PrefixTreeLayout, pos_per_tile: int, block_n: int) -> np.ndarray:
    """int32 (num_tiles, 2) of (segment, m) for the query kernels, heaviest first (stable: equal work keeps node
    order, so siblings read their shared ancestors' blocks at about the same time)."""
    lens = np.asarray(layout.node_lens, dtype=np.int64)
    n_tiles = (lens + pos_per_tile - 1) // pos_per_tile
    s = np.repeat(np.arange(layout.num_nodes), n_tiles)
    m = np.arange(s.shape[0]) - np.repeat(np.cumsum(n_tiles) - n_tiles, n_tiles)
    hi = np.minimum(lens[s], (m + 1) * pos_per_tile) - 1
    own = (hi + block_n) // block_n
    work = own + context_block_counts(layout, block_n)[s]
    order = np.argsort(-work, kind="stable")
    return np.ascontiguousarray(np.stack([s, m], 1)[order].astype(np.int32))


def tree_key_tiles(layout: PrefixTreeLayout, block_keys: int) -> np.ndarray:
    """int32 (num_tiles, 4) of (node, blk, dep_begin, dep_end) for the dK/dV kernels, heaviest first: every key row
    of every node owned by exactly one tile, whose dependents are the node's descendants (a preorder range)."""
    check_preorder(layout)
    lens = np.asarray(layout.node_lens, dtype=np.int64)
    ends = subtree_ends(layout)
    cum = np.concatenate([[0], np.cumsum(lens)])
    rows, work = [], []
    for i, n in enumerate(layout.node_lens):
        dep_work = int(cum[ends[i]] - cum[i + 1])
        for b in range((n + block_keys - 1) // block_keys):
            rows.append((i, b, i + 1, int(ends[i])))
            work.append(n - b * block_keys + dep_work)
    order = np.argsort(-np.asarray(work), kind="stable")
    return np.ascontiguousarray(np.asarray(rows, dtype=np.int32).reshape(-1, 4)[order])
