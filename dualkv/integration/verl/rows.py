"""A veRL micro-batch's rows, packed P+ΣR per prompt group, and the way back to veRL's per-row layout.

veRL (0.9, ``use_remove_padding`` layout) hands the engine a micro-batch whose ``input_ids`` and ``position_ids``
are jagged nested tensors, one row [prompt_b; response_b] per sample (offsets = cu_seqlens), with the prompts as a
left-padded dense tensor (or a nested one in the v1 trainer), an ``attention_mask``, and the prompt-group id
``uid`` of every row. Rows of one group must be adjacent and carry the same prompt; anything else is refused with
:class:`DualKVBatchError` (a silently wrong log-prob is the one outcome that is never acceptable).

The way back: veRL's losses read row b's response log-probs at ``values[off_b - R_b - 1 : off_b - 1]`` of the
per-row stream (``verl.workers.utils.padding.no_padding_2_padding``), i.e. the value predicting response token k
sits at offset P_b - 1 + k of its row. :func:`to_nested_rows` fills exactly those slots (zeros elsewhere).

Empty responses (R_b = 0: a row of prompt tokens only, which stock veRL accepts) contribute nothing there: no slot
is read. The packing needs R >= 1, so such a row is packed with one placeholder token (its last prompt token
again, at position P_b) whose value :func:`to_nested_rows` zeroes and drops. Other rows do not attend to it, so
their values are unchanged, and its gradient is exactly zero; it keeps a group (or a whole micro-batch) of empty
responses running through the model like stock's, so the backward reaches every parameter on every rank.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ..packing import PackedBatch, pack_varlen

__all__ = ["DualKVBatchError", "group_ids_of", "prompt_lengths", "packed_response_lens", "pack_rows",
           "rows_with_placeholders", "to_nested_rows", "response_values_to_rows"]

#: What to change in veRL when a batch cannot be packed.
_HINT = ("dualkv needs each prompt group's rows adjacent inside a micro-batch and sharing one prompt: keep "
         "actor.shuffle=False, let dualkv's group-preserving balancing run (do not reorder rows by length), and "
         "give every prompt its own uid (where rows of one uid carry different prompts, as veRL's multi-output "
         "agent loop makes them, set actor.dualkv_packing=trie: it packs each micro-batch by shared prefix instead)")


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


def packed_response_lens(seq_lens: Sequence[int], prompt_lens: Sequence[int]) -> list[int]:
    """R_b as packed: the response length, or 1 for an empty response (its placeholder token)."""
    return [max(int(s) - int(p), 1) for s, p in zip(seq_lens, prompt_lens)]


def _with_placeholders(tokens: torch.Tensor, offsets: torch.Tensor, empty: list[bool]) -> tuple[torch.Tensor,
                                                                                                 torch.Tensor]:
    """(T,) row-packed values and (B + 1,) offsets with each empty row's last token repeated once at its end."""
    if not any(empty):
        return tokens, offsets
    bounds = offsets.tolist()
    pieces = []
    for b, is_empty in enumerate(empty):
        pieces.append(tokens[bounds[b]:bounds[b + 1]])
        if is_empty:
            pieces.append(tokens[bounds[b + 1] - 1:bounds[b + 1]])
    added = torch.tensor([0] + empty, dtype=offsets.dtype, device=offsets.device).cumsum(0)
    return torch.cat(pieces), offsets + added


def rows_with_placeholders(input_ids: torch.Tensor, position_ids: torch.Tensor,
                           prompt_lens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
    """Check a micro-batch's nested rows (no-padding layout, 1-D positions, 1 <= P_b <= L_b) and return its (T',)
    row-packed tokens and (B + 1,) offsets with each empty row's placeholder token, and which rows are empty.

    Raises:
        DualKVBatchError: naming the row and what is wrong.
    """
    if not (getattr(input_ids, "is_nested", False) and getattr(position_ids, "is_nested", False)):
        raise DualKVBatchError("dualkv expects veRL's no-padding micro-batch (nested input_ids/position_ids)")
    if position_ids.dim() != 2:
        raise DualKVBatchError(f"position_ids have {position_ids.dim()} dims (multimodal rope?); dualkv supports "
                               "text models with 1-D position ids per row")
    offsets = input_ids.offsets()
    lengths = offsets.diff().tolist()
    if len(prompt_lens) != len(lengths):
        raise DualKVBatchError(f"{len(prompt_lens)} prompt lengths for {len(lengths)} rows")
    for row, (length, p) in enumerate(zip(lengths, prompt_lens)):
        if not 0 < p <= length:
            raise DualKVBatchError(f"row {row} has {length} tokens of which {p} prompt tokens: dualkv needs a "
                                   "non-empty prompt in every row (as veRL's no_padding_2_padding does)")
    empty = [length == p for length, p in zip(lengths, prompt_lens)]
    tokens, packed_offsets = _with_placeholders(input_ids.values(), offsets, empty)
    return tokens, packed_offsets, empty


def pack_rows(input_ids: torch.Tensor, position_ids: torch.Tensor, prompt_lens: Sequence[int],
              group_ids: Sequence) -> PackedBatch:
    """Pack a micro-batch's nested rows into P+ΣR per group, checking what would make the result wrong.

    A row without response tokens is packed with one placeholder token (module docstring), so row b of the packing
    has ``packed_response_lens(...)[b]`` response tokens.

    Args:
        input_ids: nested (B, j) token ids, row b = [prompt_b; response_b] (response_b may be empty).
        position_ids: nested (B, j) veRL position ids; must be 0..P_b+R_b-1 in every row (what the packing gives
            each token), else RoPE would see other positions than the stock forward.
        prompt_lens: P_b of every row.
        group_ids: the group (uid) of every row; a group's rows must be adjacent and share a prompt.
    Raises:
        DualKVBatchError: naming the row(s) and what is wrong.
    """
    tokens, packed_offsets, empty = rows_with_placeholders(input_ids, position_ids, prompt_lens)
    try:
        packed = pack_varlen(tokens, packed_offsets, list(prompt_lens), group_ids)
    except ValueError as err:
        raise DualKVBatchError(f"{err}. {_HINT}") from err
    expected = packed.position_ids[torch.from_numpy(packed.layout.copy_token_index).to(packed.position_ids.device)]
    if any(empty):
        expected = expected[_real_slots(packed_offsets, torch.tensor(empty)).to(expected.device)]
    given = position_ids.values()
    if given.shape != expected.shape or not torch.equal(given.to(expected.dtype), expected):
        raise DualKVBatchError("position_ids are not 0..P+R-1 in every row; dualkv numbers each response after its "
                               "prompt (prompt 0..P-1, response P..P+R-1) and would change RoPE positions")
    return packed


def _placeholder_rows(packed: PackedBatch, offsets: torch.Tensor) -> torch.Tensor:
    """(B,) bool on the CPU: the rows packed as one placeholder token, i.e. one token longer in the packing's
    per-row stream than in the micro-batch (``offsets``). Raises if the two layouts differ in any other way."""
    packed_offsets, offsets = torch.from_numpy(packed.layout.copy_cu_seqlens), offsets.cpu()
    extra = packed_offsets.diff() - offsets.diff() if packed_offsets.shape == offsets.shape else None
    if extra is None or bool(((extra != 0) & (extra != 1)).any()) \
            or bool((packed.response_cu_seqlens.cpu().diff()[extra.bool()] != 1).any()):
        raise DualKVBatchError("the packed rows do not match the micro-batch's offsets")
    return extra.bool()


def _real_slots(packed_offsets: torch.Tensor, placeholder: torch.Tensor) -> torch.Tensor:
    """Indices of the per-row stream of ``packed_offsets`` without each placeholder row's last slot."""
    keep = torch.ones(int(packed_offsets[-1]), dtype=torch.bool)
    keep[packed_offsets.cpu()[1:][placeholder] - 1] = False
    return torch.nonzero(keep).flatten()


def to_nested_rows(values: torch.Tensor, packed: PackedBatch, offsets: torch.Tensor) -> torch.Tensor:
    """(ΣR,) row-order per-response-token values of a group packing -> veRL's nested per-row layout with
    ``offsets`` (:func:`response_values_to_rows`, after checking the packing matches the micro-batch)."""
    _placeholder_rows(packed, offsets)
    layout = packed.layout
    return response_values_to_rows(values, [layout.prompt_lens[g] for g in layout.response_group], offsets)


def response_values_to_rows(values: torch.Tensor, prompt_lens: Sequence[int], offsets: torch.Tensor) -> torch.Tensor:
    """(Σ_b R'_b, ...) values, row after row (R'_b = :func:`packed_response_lens`: an empty row has one placeholder
    value) -> veRL's nested per-row layout with ``offsets`` (any packing: group or trie).

    Row b's value for response token k lands at offset P_b - 1 + k of its row (where the stock forward's log-prob
    of that token sits); the other slots hold 0 and no veRL loss reads them. An empty row's placeholder value is
    zeroed (it stays in the autograd graph, with a zero gradient) and its slot dropped.
    """
    lengths = offsets.diff().tolist()
    response_lens = packed_response_lens(lengths, prompt_lens)
    if not isinstance(values, torch.Tensor) or values.dim() < 1 or values.shape[0] != sum(response_lens):
        raise DualKVBatchError(f"expected {sum(response_lens)} response values (row after row) for the micro-batch; "
                               f"got {tuple(getattr(values, 'shape', ()))}")
    placeholder = torch.tensor([n == p for n, p in zip(lengths, prompt_lens)], dtype=torch.bool)
    packed_offsets = offsets.cpu() + torch.cat([placeholder.new_zeros(1), placeholder]).cumsum(0)
    if bool(placeholder.any()):
        per_value = torch.repeat_interleave(placeholder, torch.tensor(response_lens)).to(values.device)
        values = torch.where(per_value.view(-1, *[1] * (values.dim() - 1)), values.new_zeros(()), values)
    starts = packed_offsets[:-1].numpy() + np.asarray(prompt_lens, dtype=np.int64) - 1
    index = np.concatenate([np.arange(a, a + r) for a, r in zip(starts, response_lens)]).astype(np.int64)
    flat = values.new_zeros((int(packed_offsets[-1]), *values.shape[1:]))
    flat[torch.from_numpy(index).to(values.device)] = values
    if bool(placeholder.any()):
        flat = flat[_real_slots(packed_offsets, placeholder).to(flat.device)]
    return torch.nested.nested_tensor_from_jagged(flat, offsets)
