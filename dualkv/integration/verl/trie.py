"""Trie packing of a veRL micro-batch (``dualkv_packing=trie``): its rows as one radix trie.

The group packing (:mod:`.rows`) stores each prompt group's prompt once. A trie stores every prefix shared by
rows once, across groups too: a system prompt common to every prompt, prompts that start alike, responses of one
prompt that begin with the same tokens. Rows [prompt_b; response_b] (an empty response with its one placeholder
token, as in :mod:`.rows`) go through :meth:`dualkv.PrefixTreeLayout.from_sequences`; the model runs on the T
packed tokens with the tree layout, and the log-prob targets (:meth:`dualkv.tree.TreeIndex.targets` with start =
P_b) score each packed response token once and read it back once per row (:meth:`dualkv.tree.TreeTargets.unpack`),
so log-probs, entropy, the loss and every gradient are those of the rows run one by one.

No uid is read: a trie is exact for any rows, so groups need not be adjacent here. Micro-batching still keeps
groups whole and counts them as P+ΣR tokens (:mod:`.micro_batches`), an upper bound of the trie's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ...tree import PrefixTreeLayout, TreeIndex, TreeTargets
from .rows import DualKVBatchError, rows_with_placeholders

__all__ = ["TrieRows", "pack_rows_as_trie"]


@dataclass(frozen=True, eq=False)
class TrieRows:
    """A micro-batch packed as a trie.

    Attributes:
        index: the trie (``index.layout``), its (T,) packed ids and each row's packed rows.
        targets: the response tokens of every row (t >= P_b), each packed token scored once; ``targets.unpack``
            gives (Σ_b R'_b,) values row after row.
    """

    index: TreeIndex
    targets: TreeTargets

    @property
    def layout(self) -> PrefixTreeLayout:
        return self.index.layout


def pack_rows_as_trie(input_ids: torch.Tensor, position_ids: torch.Tensor, prompt_lens: Sequence[int]) -> TrieRows:
    """Pack a micro-batch's nested rows as their radix trie.

    Args:
        input_ids: nested (B, j) token ids, row b = [prompt_b; response_b] (response_b may be empty).
        position_ids: nested (B, j) veRL position ids; must be 0..L_b-1 in every row (the trie numbers each token
            by its depth in its row), else RoPE would see other positions than the stock forward.
        prompt_lens: P_b of every row (1 <= P_b <= L_b).
    Raises:
        DualKVBatchError: naming the row and what is wrong.
    """
    tokens, packed_offsets, _ = rows_with_placeholders(input_ids, position_ids, prompt_lens)
    offsets = input_ids.offsets()
    given = position_ids.values()
    starts = torch.repeat_interleave(offsets[:-1], offsets.diff())
    expected = torch.arange(int(offsets[-1]), device=offsets.device) - starts
    if given.shape != expected.shape or not torch.equal(given.to(expected.dtype), expected.to(given.device)):
        raise DualKVBatchError("position_ids are not 0..L-1 in every row; trie packing numbers each token by its "
                               "place in its row and would change RoPE positions")
    rows = list(torch.split(tokens, packed_offsets.diff().tolist()))
    _, index = PrefixTreeLayout.from_sequences(rows)
    index = index.to(input_ids.device)
    return TrieRows(index=index, targets=index.targets([int(p) for p in prompt_lens]))
