"""Radix-trie construction for :meth:`dualkv.PrefixTreeLayout.from_sequences`.

Sequences are inserted one after another into a compressed trie whose nodes are runs ``arrays[seq][start:end]``;
a run is compared with numpy, so the Python work is per node visited, not per token. A node is split where a later
sequence diverges from it or ends inside it; the tail keeps the node's identity (so sequences already ending there
still do) and its children. Nodes come out in depth-first order, children in order of first appearance.
"""

from __future__ import annotations

import numpy as np

__all__ = ["build_trie"]


class _Node:
    __slots__ = ("seq", "start", "end", "children")

    def __init__(self, seq: int, start: int, end: int) -> None:
        self.seq, self.start, self.end = seq, start, end
        self.children: dict[int, _Node] = {}


def _insert(root: _Node, arrays: list[np.ndarray], s: int) -> _Node:
    """Insert sequence s; return the node it ends at."""
    arr = arrays[s]
    node, off = root, 0
    while off < arr.shape[0]:
        key = int(arr[off])
        child = node.children.get(key)
        if child is None:
            new = _Node(s, off, arr.shape[0])
            node.children[key] = new
            return new
        run = arrays[child.seq][child.start:child.end]
        m = min(run.shape[0], arr.shape[0] - off)
        differ = np.flatnonzero(run[:m] != arr[off:off + m])
        k = int(differ[0]) if differ.size else m
        if k < run.shape[0]:  # diverges or ends inside the run: split it after k tokens (k >= 1: key matched)
            head = _Node(child.seq, child.start, child.start + k)
            head.children[int(run[k])] = child
            child.start += k
            node.children[key] = head  # same key: keeps the children's order
            child = head
        node, off = child, off + k
    return node


def build_trie(arrays: list[np.ndarray]) -> tuple[list[int], list[int], np.ndarray, list[int]]:
    """(node_lens, parents, packed ids (T,) int64, end node of each sequence) of the radix trie of ``arrays``."""
    root = _Node(-1, 0, 0)
    ends = [_insert(root, arrays, s) for s in range(len(arrays))]
    order: dict[int, int] = {}
    lens, parents, runs = [], [], []
    stack = [(child, -1) for child in reversed(list(root.children.values()))]
    while stack:
        node, parent = stack.pop()
        order[id(node)] = len(lens)
        lens.append(node.end - node.start)
        parents.append(parent)
        runs.append(arrays[node.seq][node.start:node.end])
        me = order[id(node)]
        stack.extend((child, me) for child in reversed(list(node.children.values())))
    return lens, parents, np.concatenate(runs).astype(np.int64), [order[id(n)] for n in ends]
