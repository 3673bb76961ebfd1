"""PrefixTreeLayout: a packed forest of token runs whose shared prefixes are stored once.

A layout is a list of *nodes*, each a run of ``node_lens[i] >= 1`` tokens with a parent ``parents[i] < i``
(-1 for a root). Nodes are packed back to back in index order, so the stream holds T = sum(node_lens) tokens and
node i occupies packed rows [node_starts[i], node_starts[i] + node_lens[i]).

Token t of node i sits at logical position ``node_positions[i] + t``, where ``node_positions[i]`` is the summed
length of i's ancestors. It attends to every token of every ancestor and causally to its own node's tokens 0..t:
exactly what it sees when the root-to-i path is run as one sequence. A :class:`dualkv.GroupLayout` is the depth-1
case (each prompt a root, each response a leaf child): :meth:`PrefixTreeLayout.from_group_layout`.

The *N-copy view* of a tree runs every root-to-leaf path as its own sequence (``copy_token_index``,
``copy_cu_seqlens``, ``first_copy_index``, with the same meaning as on :class:`dualkv.GroupLayout`).

:meth:`PrefixTreeLayout.from_sequences` builds the radix trie of any batch of token sequences and returns the
layout with a :class:`TreeIndex` (packed token ids, each sequence's packed rows, the log-prob targets).

Everything a kernel launch needs (offsets, maxima, the run table) is host-side numpy computed once per layout;
:meth:`PrefixTreeLayout.device_tensors` copies it to a device once and caches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np
import torch

from ._gather import gather_rows
from .layout import GroupLayout, refuse_unordered

__all__ = ["PrefixTreeLayout", "TreeIndex", "TreeTargets", "NODE_FIELDS", "RUN_FIELDS"]

#: Column order of :attr:`PrefixTreeLayout.node_table`.
NODE_FIELDS = ("q_start", "q_len", "pos_start", "ctx_first", "ctx_count")
#: Column order of :attr:`PrefixTreeLayout.context_runs`.
RUN_FIELDS = ("k_start", "k_len")


def _int_list(values: object, what: str) -> list[int]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.dtype.is_floating_point or values.dtype == torch.bool:
            raise TypeError(f"{what} must be a 1-D integer sequence; got a {values.dtype} tensor of shape "
                            f"{tuple(values.shape)}")
        values = values.tolist()
    elif isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise TypeError(f"{what} must be a 1-D integer sequence; got a {values.dtype} array of shape "
                            f"{values.shape}")
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a sequence of ints, got {type(values).__name__}")
    refuse_unordered(values, what)
    out = []
    for idx, value in enumerate(values):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{what}[{idx}] must be an int, got {type(value).__name__}")
        out.append(int(value))
    return out


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """int64 concatenation of arange(s, s + l) for each (s, l), vectorised."""
    lens = np.asarray(lens, dtype=np.int64)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.asarray(starts, dtype=np.int64) - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return np.arange(total, dtype=np.int64) + offsets


@dataclass(frozen=True, eq=False)
class PrefixTreeLayout:
    """A forest of token runs packed in node order, plus everything derived from it.

    Attributes:
        node_lens: tokens of each node (each >= 1).
        parents: parent of each node, ``parents[i] < i``, or -1 for a root.
    """

    node_lens: tuple[int, ...]
    parents: tuple[int, ...]
    _device_cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        lens = _int_list(self.node_lens, "node_lens")
        parents = _int_list(self.parents, "parents")
        if not lens:
            raise ValueError("a PrefixTreeLayout needs at least one node")
        if len(parents) != len(lens):
            raise ValueError(f"node_lens has {len(lens)} nodes but parents has {len(parents)} entries")
        for i, n in enumerate(lens):
            if n < 1:
                raise ValueError(f"node_lens[{i}] = {n}: every node needs >= 1 token (drop empty nodes and "
                                 "re-parent their children)")
        for i, p in enumerate(parents):
            if not -1 <= p < i:
                raise ValueError(f"parents[{i}] = {p}: a node's parent must come before it (-1 <= parents[i] < i; "
                                 "-1 marks a root)")
        if sum(lens) >= 2**31:
            raise ValueError(f"a packed tree of {sum(lens)} tokens exceeds int32 offsets")
        object.__setattr__(self, "node_lens", tuple(lens))
        object.__setattr__(self, "parents", tuple(parents))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_group_layout(cls, layout: GroupLayout) -> "PrefixTreeLayout":
        """The depth-1 tree of a :class:`GroupLayout`: each prompt a root, its responses its children, same packing
        (so packed tensors, positions and the N-copy view are unchanged)."""
        if not isinstance(layout, GroupLayout):
            raise TypeError(f"layout must be a dualkv.GroupLayout, got {type(layout).__name__}")
        lens, parents = [], []
        for p, responses in zip(layout.prompt_lens, layout.response_lens):
            root = len(lens)
            lens.append(p)
            parents.append(-1)
            lens.extend(responses)
            parents.extend([root] * len(responses))
        return cls(tuple(lens), tuple(parents))

    @classmethod
    def from_sequences(cls, seqs: Sequence) -> tuple["PrefixTreeLayout", "TreeIndex"]:
        """The radix trie of a batch of token sequences: every shared prefix stored once.

        Args:
            seqs: S sequences of token ids (1-D integer tensors, numpy arrays or lists), each >= 1 token.
                Duplicates and sequences that are prefixes of others are allowed.
        Returns:
            ``(layout, index)``: ``index.packed_ids[index[s]]`` equals ``seqs[s]`` for every s. Nodes are in
            depth-first order, children in order of first appearance in ``seqs``; a node boundary is placed
            wherever two sequences diverge or one ends.
        """
        from ._trie import build_trie

        arrays = _as_token_arrays(seqs)
        lens, parents, packed, end_nodes = build_trie(arrays)
        layout = cls(tuple(lens), tuple(parents))
        return layout, TreeIndex.build(layout, torch.from_numpy(packed), end_nodes)

    # ------------------------------------------------------------------ sizes
    @property
    def num_nodes(self) -> int:
        return len(self.node_lens)

    @cached_property
    def total_tokens(self) -> int:
        """T: packed tokens (every shared prefix once)."""
        return sum(self.node_lens)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Children of each node, in index order."""
        kids: list[list[int]] = [[] for _ in self.node_lens]
        for i, p in enumerate(self.parents):
            if p >= 0:
                kids[p].append(i)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def roots(self) -> tuple[int, ...]:
        return tuple(i for i, p in enumerate(self.parents) if p < 0)

    @cached_property
    def leaves(self) -> tuple[int, ...]:
        """Nodes without children, in index order: the ends of the root-to-leaf paths (the N-copy rows)."""
        return tuple(i for i, k in enumerate(self.children) if not k)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """Ancestors of each node (0 for a root)."""
        out: list[int] = []
        for p in self.parents:
            out.append(0 if p < 0 else out[p] + 1)
        return tuple(out)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @property
    def max_node_len(self) -> int:
        return max(self.node_lens)

    @cached_property
    def path_lens(self) -> tuple[int, ...]:
        """Length of the root-to-node path of each node (ancestors plus the node itself)."""
        return tuple(p + n for p, n in zip(self.node_positions, self.node_lens))

    @property
    def max_path_len(self) -> int:
        """The longest sequence the tree holds (the longest root-to-leaf path)."""
        return max(self.path_lens)

    @cached_property
    def tokens_std(self) -> int:
        """Tokens of the N-copy layout: every root-to-leaf path as its own sequence."""
        return sum(self.path_lens[i] for i in self.leaves)

    @property
    def num_paths(self) -> int:
        return len(self.leaves)

    # ------------------------------------------------------------------ offsets (host side)
    @cached_property
    def node_starts(self) -> tuple[int, ...]:
        """Packed offset of each node's first token."""
        return tuple(int(x) for x in np.concatenate([[0], np.cumsum(self.node_lens)[:-1]]))

    @cached_property
    def node_positions(self) -> tuple[int, ...]:
        """Logical position of each node's first token: the summed length of its ancestors."""
        out: list[int] = []
        for p in self.parents:
            out.append(0 if p < 0 else out[p] + self.node_lens[p])
        return tuple(out)

    def node_range(self, i: int) -> tuple[int, int]:
        start = self.node_starts[i]
        return start, start + self.node_lens[i]

    def ancestors(self, i: int) -> tuple[int, ...]:
        """Ancestors of node i, root first."""
        chain = []
        p = self.parents[i]
        while p >= 0:
            chain.append(p)
            p = self.parents[p]
        return tuple(reversed(chain))

    def path(self, i: int) -> tuple[int, ...]:
        """The root-to-i path: ancestors, root first, then i."""
        return self.ancestors(i) + (i,)

    def path_rows(self, i: int) -> np.ndarray:
        """int64 (path_lens[i],): packed rows of the root-to-i path in position order."""
        nodes = list(self.path(i))
        return _ranges(np.asarray(self.node_starts)[nodes], np.asarray(self.node_lens)[nodes])

    # ------------------------------------------------------------------ kernel view
    @cached_property
    def context_runs(self) -> np.ndarray:
        """int32 (sum of depths, 2) of (k_start, k_len): every node's ancestors as packed runs, root first, node
        after node (node i's are rows ``node_table[i, 3] : node_table[i, 3] + node_table[i, 4]``)."""
        rows = [(self.node_starts[a], self.node_lens[a]) for i in range(self.num_nodes) for a in self.ancestors(i)]
        return np.asarray(rows, dtype=np.int32).reshape(-1, 2)

    @cached_property
    def node_table(self) -> np.ndarray:
        """int32 (num_nodes, 5) of (q_start, q_len, pos_start, ctx_first, ctx_count): each node's query run, the
        logical position of its first token, and its slice of :attr:`context_runs`."""
        first = np.concatenate([[0], np.cumsum(self.depths)[:-1]])
        table = np.stack([self.node_starts, self.node_lens, self.node_positions, first, self.depths], axis=1)
        return table.astype(np.int32)

    def device_tensors(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        """Device copies of the index tensors (node table, context runs, position ids), made once per device."""
        device = torch.device(device)
        key = str(device)
        cached = self._device_cache.get(key)
        if cached is None:
            cached = {
                "node_table": torch.from_numpy(self.node_table.copy()).to(device),
                "context_runs": torch.from_numpy(self.context_runs.copy()).to(device),
                "position_ids": self.position_ids(device),
            }
            self._device_cache[key] = cached
        return cached

    # ------------------------------------------------------------------ positions, predictors, the N-copy view
    @cached_property
    def _positions(self) -> np.ndarray:
        shift = np.asarray(self.node_starts) - np.asarray(self.node_positions)
        return np.arange(self.total_tokens, dtype=np.int64) - np.repeat(shift, self.node_lens)

    def position_ids(self, device: torch.device | str | None = None) -> torch.Tensor:
        """(T,) int64 logical positions: token t of node i at ``node_positions[i] + t``."""
        return torch.from_numpy(self._positions.copy()).to(device=device)

    @cached_property
    def predictor_index(self) -> np.ndarray:
        """int64 (T,): the packed row whose output predicts each packed token — the previous token of its node, or
        for a node's first token its parent's last token; -1 for a root's first token (nothing predicts it)."""
        index = np.arange(-1, self.total_tokens - 1, dtype=np.int64)
        for i, p in enumerate(self.parents):
            index[self.node_starts[i]] = -1 if p < 0 else self.node_starts[p] + self.node_lens[p] - 1
        return index

    @cached_property
    def copy_token_index(self) -> np.ndarray:
        """int64 (T_std,): the packed token each token of the N-copy layout (root-to-leaf paths in leaf order) is a
        copy of. ``x_std = x_packed[copy_token_index]``."""
        return np.concatenate([self.path_rows(i) for i in self.leaves]).astype(np.int64)

    @cached_property
    def copy_cu_seqlens(self) -> np.ndarray:
        """int64 (num_paths + 1,): cu_seqlens of the N-copy layout."""
        return np.concatenate([[0], np.cumsum([self.path_lens[i] for i in self.leaves])]).astype(np.int64)

    @cached_property
    def first_copy_index(self) -> np.ndarray:
        """int64 (T,): for each packed token, the N-copy token of its first occurrence. ``x_packed =
        x_std[first_copy_index]``."""
        index = np.empty(self.total_tokens, dtype=np.int64)
        copy_index = self.copy_token_index
        index[copy_index[::-1]] = np.arange(copy_index.shape[0] - 1, -1, -1)
        return index

    # ------------------------------------------------------------------ GroupLayout
    def to_group_layout(self) -> GroupLayout:
        """The :class:`GroupLayout` with the same packing, if this tree is one: every root followed directly by its
        children, all of them leaves, and at least one child per root. Raises ValueError naming what differs."""
        prompts, responses = [], []
        i = 0
        while i < self.num_nodes:  # i is a root: earlier roots' children are contiguous leaves
            kids = self.children[i]
            if not kids:
                raise ValueError(f"root {i} has no children; a GroupLayout group needs >= 1 response")
            if kids != tuple(range(i + 1, i + 1 + len(kids))):
                raise ValueError(f"the children of root {i} are not packed right after it: not a GroupLayout packing")
            deep = [c for c in kids if self.children[c]]
            if deep:
                raise ValueError(f"node {deep[0]} has children (depth > 1): not a GroupLayout")
            prompts.append(self.node_lens[i])
            responses.append([self.node_lens[c] for c in kids])
            i += 1 + len(kids)
        return GroupLayout.from_lengths(prompts, responses)

    # ------------------------------------------------------------------ misc
    def to_dict(self) -> dict:
        return {"node_lens": list(self.node_lens), "parents": list(self.parents)}

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}<{p}" if p >= 0 else f"{n}" for n, p in zip(self.node_lens[:12], self.parents[:12]))
        more = f", ... ({self.num_nodes} nodes)" if self.num_nodes > 12 else ""
        return f"PrefixTreeLayout[{shown}{more}; T={self.total_tokens}]"


def _as_token_arrays(seqs: Sequence) -> list[np.ndarray]:
    if isinstance(seqs, (str, bytes)) or not isinstance(seqs, Sequence) and not isinstance(seqs, torch.Tensor):
        raise TypeError(f"seqs must be a sequence of token sequences, got {type(seqs).__name__}")
    if isinstance(seqs, torch.Tensor):
        raise TypeError("seqs must be a list of 1-D token sequences (a padded 2-D tensor would count its padding; "
                        "strip it first)")
    if len(seqs) == 0:
        raise ValueError("seqs is empty: need at least one sequence")
    arrays = []
    for s, seq in enumerate(seqs):
        if isinstance(seq, torch.Tensor):
            if seq.dim() != 1 or seq.dtype.is_floating_point or seq.dtype.is_complex or seq.dtype == torch.bool:
                raise TypeError(f"seqs[{s}] must be a 1-D integer tensor; got {seq.dtype} of shape "
                                f"{tuple(seq.shape)}")
            arr = seq.detach().to("cpu", torch.int64).numpy()
        else:
            arr = np.asarray(_int_list(seq, f"seqs[{s}]"), dtype=np.int64)
        if arr.shape[0] == 0:
            raise ValueError(f"seqs[{s}] is empty; every sequence needs >= 1 token")
        arrays.append(arr)
    return arrays


@dataclass(frozen=True, eq=False)
class TreeTargets:
    """The log-prob targets of a :class:`TreeIndex`: which packed tokens to score and how to unpack them.

    Attributes:
        rows: (M,) int64 packed tokens scored (sorted, unique; none is a root's first token).
        predictor_index: (M,) int64 packed row whose output predicts ``rows[m]`` (``layout.predictor_index``).
        target_ids: (M,) int64 token ids of ``rows``.
        gather: (sum_s (L_s - start_s),) int64: entry for token t >= start_s of sequence s (sequence after
            sequence) is its position in ``rows``. ``values_per_sequence = values[gather]``.
        cu_seqlens: (S + 1,) int64 splitting the gathered axis into sequences.
    """

    rows: torch.Tensor
    predictor_index: torch.Tensor
    target_ids: torch.Tensor
    gather: torch.Tensor
    cu_seqlens: torch.Tensor

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """(M, ...) values of ``rows`` -> (sum_s (L_s - start_s), ...) per-sequence values, sequence after
        sequence (tokens shared by several sequences are read once per sequence, so gradients sum over them)."""
        if not isinstance(values, torch.Tensor) or values.dim() < 1 or values.shape[0] != self.rows.shape[0]:
            raise ValueError(f"values must have {self.rows.shape[0]} rows (one per scored packed token); got "
                             f"{tuple(getattr(values, 'shape', ()))}")
        return gather_rows(values, self.gather.to(values.device))

    def split(self, values: torch.Tensor) -> list[torch.Tensor]:
        """(sum_s (L_s - start_s), ...) per-sequence values (:meth:`unpack`'s output, or what
        :func:`dualkv.integration.tree.tree_logprobs` returns) -> one (L_s - start_s, ...) tensor per sequence."""
        total = int(self.cu_seqlens[-1])
        if not isinstance(values, torch.Tensor) or values.dim() < 1 or values.shape[0] != total:
            raise ValueError(f"values must have {total} rows (the scored tokens of every sequence, sequence after "
                             f"sequence); got {tuple(getattr(values, 'shape', ()))}")
        return list(torch.split(values, (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).tolist()))

    def to(self, device: torch.device | str) -> "TreeTargets":
        return TreeTargets(*(t.to(device) for t in (self.rows, self.predictor_index, self.target_ids, self.gather,
                                                    self.cu_seqlens)))


@dataclass(frozen=True, eq=False)
class TreeIndex:
    """Where each sequence of a :meth:`PrefixTreeLayout.from_sequences` batch lies in the packed tree.

    Attributes:
        layout: the tree.
        packed_ids: (T,) int64 packed token ids.
        end_nodes: the node each sequence ends at (its last token is that node's last token).
        token_rows: (sum_s L_s,) int64 packed row of every token of every sequence, sequence after sequence.
        cu_seqlens: (S + 1,) int64 splitting ``token_rows`` into sequences.

    ``index[s]`` is sequence s's (L_s,) packed rows: ``packed_ids[index[s]] == seqs[s]``, and its token t >= 1 is
    predicted by the packed row ``index[s][t - 1]`` (possibly in an ancestor node).
    """

    layout: PrefixTreeLayout
    packed_ids: torch.Tensor
    end_nodes: tuple[int, ...]
    token_rows: torch.Tensor
    cu_seqlens: torch.Tensor

    @classmethod
    def build(cls, layout: PrefixTreeLayout, packed_ids: torch.Tensor, end_nodes: Sequence[int]) -> "TreeIndex":
        """The index of sequences ending at ``end_nodes`` (each one a root-to-node path of ``layout``)."""
        if not isinstance(packed_ids, torch.Tensor) or packed_ids.dim() != 1 \
                or packed_ids.shape[0] != layout.total_tokens:
            raise ValueError(f"packed_ids must be a (T,) = ({layout.total_tokens},) tensor; got "
                             f"{tuple(getattr(packed_ids, 'shape', ()))}")
        ends = _int_list(end_nodes, "end_nodes")
        for s, node in enumerate(ends):
            if not 0 <= node < layout.num_nodes:
                raise ValueError(f"end_nodes[{s}] = {node} is not a node of the {layout.num_nodes}-node layout")
        rows = [layout.path_rows(n) for n in ends]
        cu = np.concatenate([[0], np.cumsum([r.shape[0] for r in rows])]).astype(np.int64)
        token_rows = torch.from_numpy(np.concatenate(rows) if rows else np.zeros(0, np.int64))
        return cls(layout, packed_ids.to(torch.int64), tuple(ends), token_rows.to(packed_ids.device),
                   torch.from_numpy(cu).to(packed_ids.device))

    def __len__(self) -> int:
        return len(self.end_nodes)

    def __getitem__(self, s: int) -> torch.Tensor:
        if not -len(self) <= s < len(self):
            raise IndexError(f"sequence {s} out of range for {len(self)} sequences")
        s %= len(self)
        return self.token_rows[int(self.cu_seqlens[s]):int(self.cu_seqlens[s + 1])]

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(self.layout.path_lens[n] for n in self.end_nodes)

    @property
    def position_ids(self) -> torch.Tensor:
        """(T,) logical positions of the packed tokens, on ``packed_ids``' device (a fresh tensor)."""
        return self.layout.position_ids(self.packed_ids.device)

    def sequences(self) -> list[torch.Tensor]:
        """The sequences back from the packed ids (``packed_ids[index[s]]``)."""
        return [self.packed_ids[self[s]] for s in range(len(self))]

    def targets(self, start: int | Sequence[int] = 1) -> TreeTargets:
        """Log-prob targets: tokens t >= ``start[s]`` of each sequence s (``start`` an int for all, or one per
        sequence; 1 <= start <= L_s, e.g. the prompt length to score only the response).

        A packed token scored for several sequences (a shared node, a duplicate) is computed once and read back
        once per sequence by :meth:`TreeTargets.unpack`.
        """
        lens = self.seq_lens
        if isinstance(start, (int, np.integer)) and not isinstance(start, (bool, np.bool_)):
            starts = [int(start)] * len(lens)
        else:
            starts = _int_list(start, "start")
            if len(starts) != len(lens):
                raise ValueError(f"start has {len(starts)} entries but the index holds {len(lens)} sequences")
        for s, (a, n) in enumerate(zip(starts, lens)):
            if not 1 <= a <= n:
                raise ValueError(f"start[{s}] = {a}: must be in [1, {n}] (token 0 has no predictor; sequence {s} "
                                 f"has {n} tokens)")
        cu = self.cu_seqlens.cpu().numpy()
        all_rows = self.token_rows.cpu().numpy()
        wanted = np.concatenate([all_rows[cu[s] + a:cu[s + 1]] for s, a in enumerate(starts)]).astype(np.int64)
        rows, gather = np.unique(wanted, return_inverse=True)
        device = self.packed_ids.device
        rows_t = torch.from_numpy(rows).to(device)
        cu_out = np.concatenate([[0], np.cumsum([n - a for a, n in zip(starts, lens)])]).astype(np.int64)
        return TreeTargets(rows=rows_t,
                           predictor_index=torch.from_numpy(self.layout.predictor_index[rows]).to(device),
                           target_ids=self.packed_ids.index_select(0, rows_t),
                           gather=torch.from_numpy(gather.reshape(-1).astype(np.int64)).to(device),
                           cu_seqlens=torch.from_numpy(cu_out).to(device))

    def to(self, device: torch.device | str) -> "TreeIndex":
        return TreeIndex(self.layout, self.packed_ids.to(device), self.end_nodes, self.token_rows.to(device),
                         self.cu_seqlens.to(device))
