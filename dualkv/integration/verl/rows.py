"""A veRL micro-batch's rows, packed P+ΣR per prompt group, and the way back to veRL's per-row layout.

veRL (0.9, ``use_remove_padding`` layout) hands the engine a micro-batch whose ``input_ids`` and ``position_ids``
are jagged nested tensors, one row [prompt_b; response_b] per sample (offsets = cu_seqlens), with the prompts as a
left-padded dense tensor (or a nested one in the v1 trainer), an ``attention_mask``, and the prompt-group id
``uid`` of every row. Rows of one group must be adjacent and carry the same prompt; anything else is refused with
:class:`DualKVBatchError` (a silently wrong log-prob is the one outcome that is never acceptable).

The way back: veRL's losses read row b's response log-probs at ``values[off_b - R_b - 1 : off_b - 1]`` of the
per-row stream (``verl.workers.utils.padding.no_padding_2_padding``), i.e. the value predicting response token k
sits at offset P_b - 1 + k of its row. :func:`to_nested_rows` fills exactly those slots (zeros elsewhere).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ..logprobs import to_sequence_layout
from ..packing import PackedBatch, pack_varlen

__all__ = ["DualKVBatchError", "group_ids_of", "prompt_lengths", "pack_rows", "to_nested_rows"]

#: What to change in veRL when a batch cannot be packed.
_HINT = ("dualkv needs each prompt group's rows adjacent inside a micro-batch and sharing one prompt: keep "
         "actor.shuffle=False, let dualkv's group-preserving balancing run (do not reorder rows by length), and "
         "give every prompt its own uid")


class DualKVBatchError(ValueError):
    """A veRL micro-batch that the shared-prompt packing cannot represent exactly (split groups, differing
    prompts, missing uids, unsupported inputs)."""


def group_ids_of(values: Any, num_rows: int) -> list:
    """The group id of every row from veRL's ``uid`` field (list, numpy array, NonTensorStack or tensor)."""
    if values is None:
        raise DualKVBatchError("the micro-batch has no 'uid' field: dualkv groups rows by veRL's per-prompt uid "
                               "(set before batch.repeat(n)); it is required")
    if hasattr(values, "tolist"):
        values = values.tolist()
    values = list(values)
    if len(values) != num_rows:
        raise DualKVBatchError(f"'uid' has {len(values)} entries but the micro-batch has {num_rows} rows")
    return values


def prompt_lengths(prompts: torch.Tensor, attention_mask: torch.Tensor | None) -> list[int]:
    """Real prompt length of every row, the way ``no_padding_2_padding`` reads it.

    Args:
        prompts: (B, Lp) left-padded prompt ids, or a nested (B, j) tensor of the real prompts.
        attention_mask: (B, Lp + Lr) 0/1 mask over [prompt | response] (needed for dense prompts).
    """
    if prompts.is_nested:
        return prompts.offsets().diff().tolist()
    if attention_mask is None or attention_mask.is_nested:
        raise DualKVBatchError("dense 'prompts' need the dense 'attention_mask' to find each row's prompt length")
    return attention_mask[:, : prompts.shape[1]].sum(dim=1).tolist()


def pack_rows(input_ids: torch.Tensor, position_ids: torch.Tensor, prompt_lens: Sequence[int],
              group_ids: Sequence) -> PackedBatch:
    """Pack a micro-batch's nested rows into P+ΣR per group, checking what would make the result wrong.

    Args:
        input_ids: nested (B, j) token ids, row b = [prompt_b; response_b].
        position_ids: nested (B, j) veRL position ids; must be 0..P_b+R_b-1 in every row (what the packing gives
            each token), else RoPE would see other positions than the stock forward.
        prompt_lens: P_b of every row.
        group_ids: the group (uid) of every row; a group's rows must be adjacent and share a prompt.
    Raises:
        DualKVBatchError: naming the row(s) and what is wrong.
    """
    if not (input_ids.is_nested and position_ids.is_nested):
        raise DualKVBatchError("dualkv expects veRL's no-padding micro-batch (nested input_ids/position_ids)")
    if position_ids.dim() != 2:
        raise DualKVBatchError(f"position_ids have {position_ids.dim()} dims (multimodal rope?); dualkv supports "
                               "text models with 1-D position ids per row")
    offsets = input_ids.offsets()
    lengths = offsets.diff().tolist()
    for row, (length, p) in enumerate(zip(lengths, prompt_lens)):
        if not 0 < p < length:
            raise DualKVBatchError(f"row {row} has {length} tokens of which {p} prompt tokens: dualkv needs a "
                                   "non-empty prompt and a non-empty response in every row")
    try:
        packed = pack_varlen(input_ids.values(), offsets, list(prompt_lens), group_ids)
    except ValueError as err:
        raise DualKVBatchError(f"{err}. {_HINT}") from err
    expected = packed.position_ids[torch.from_numpy(packed.layout.copy_token_index).to(packed.position_ids.device)]
    given = position_ids.values()
    if given.shape != expected.shape or not torch.equal(given.to(expected.dtype), expected):
        raise DualKVBatchError("position_ids are not 0..P+R-1 in every row; dualkv numbers each response after its "
                               "prompt (prompt 0..P-1, response P..P+R-1) and would change RoPE positions")
    return packed


def to_nested_rows(values: torch.Tensor, packed: PackedBatch, offsets: torch.Tensor) -> torch.Tensor:
    """(ΣR,) row-order per-response-token values -> veRL's nested per-row layout with ``offsets``.

    Row b's value for response token k lands at offset P_b - 1 + k of its row (where the stock forward's log-prob
    of that token sits); the other slots hold 0 and no veRL loss reads them.
    """
    flat, cu = to_sequence_layout(values, packed)
    if not np.array_equal(cu.cpu().numpy(), offsets.cpu().numpy()):
        raise DualKVBatchError("the packed rows do not match the micro-batch's offsets")
    return torch.nested.nested_tensor_from_jagged(flat, offsets)
