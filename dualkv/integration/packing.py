"""The P+ΣR packing of the paper's section 2.2, and the way back to the caller's rows.

Rows come in either as a padded batch (veRL's ``input_ids = cat(prompts, responses)``: prompts left-padded,
responses right-padded, an ``attention_mask`` over both) or as N(P+R) cu_seqlens-packed rows with per-row prompt
lengths; each row carries a group id (veRL's ``uid``). Rows of one group must be adjacent and share one prompt.

The packed stream is, per group, [prompt once; response 1; ...; response N] (see :class:`dualkv.GroupLayout`).
Row b of the input is response b of the packing, so no permutation is kept: the maps back are pure reshapes.

Response token k of a row is predicted by the packed position ``predictor_index``: for k = 0 that is the group's
last prompt position (one row shared by every response of the group), otherwise the previous response token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np
import torch

from .._checks import check_cu_seqlens, check_int
from ..layout import GroupLayout

__all__ = ["PackedBatch", "pack_padded", "pack_varlen", "unpack_token_values", "split_token_values"]


@dataclass(frozen=True, eq=False)
class PackedBatch:
    """A shared-prompt packed micro-batch and the maps back to the caller's rows.

    Attributes:
        input_ids: (T,) int64 packed tokens, T = sum_g (P_g + sum_i R_g,i).
        position_ids: (T,) int64 logical positions (prompt 0..P-1, response P..P+R-1).
        layout: the GroupLayout every consumer reads.
        response_ids: (sum R,) int64 response tokens of all rows, row after row (the log-prob targets).
        predictor_index: (sum R,) int64 packed position whose output predicts each entry of ``response_ids``.
        response_cu_seqlens: (B + 1,) int64 splitting the (sum R,) axis into rows.
        response_width: width of the caller's (right-padded) response layout; :func:`unpack_token_values` pads to it.
        group_ids: the id of each group, in packed order.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    layout: GroupLayout
    response_ids: torch.Tensor
    predictor_index: torch.Tensor
    response_cu_seqlens: torch.Tensor
    response_width: int
    group_ids: tuple

    @property
    def num_rows(self) -> int:
        return self.layout.num_responses

    def n_copy_input_ids(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The same rows in the N-copy packing: (input_ids (T_std,), position_ids (T_std,), cu_seqlens (B+1,))."""
        index = torch.from_numpy(self.layout.copy_token_index).to(self.input_ids.device)
        cu = torch.from_numpy(self.layout.copy_cu_seqlens).to(self.input_ids.device)
        return self.input_ids[index], self.position_ids[index], cu

    def to(self, device: torch.device | str) -> "PackedBatch":
        move = lambda t: t.to(device)  # noqa: E731
        return PackedBatch(move(self.input_ids), move(self.position_ids), self.layout, move(self.response_ids),
                           move(self.predictor_index), move(self.response_cu_seqlens), self.response_width,
                           self.group_ids)


def _group_runs(group_ids: Sequence[Hashable]) -> list[tuple[Hashable, int, int]]:
    """Split row group ids into runs (id, first_row, end_row); refuse ids that come back after another id."""
    runs: list[tuple[Hashable, int, int]] = []
    seen: dict[Hashable, int] = {}
    for row, gid in enumerate(group_ids):
        if runs and runs[-1][0] == gid:
            runs[-1] = (gid, runs[-1][1], row + 1)
            continue
        if gid in seen:
            first = seen[gid]
            raise ValueError(f"rows of group {gid!r} are not adjacent: the group starts at row {first} and comes "
                             f"back at row {row} after other groups; keep each group's rows together "
                             "(veRL: force_group_size, shuffle off, group-preserving balancing)")
        seen[gid] = row
        runs.append((gid, row, row + 1))
    return runs


def _normalise_group_ids(group_ids: Any, num_rows: int) -> list[Hashable]:
    if isinstance(group_ids, torch.Tensor):
        group_ids = group_ids.tolist()
    elif isinstance(group_ids, np.ndarray):
        group_ids = group_ids.tolist()
    group_ids = list(group_ids)
    if len(group_ids) != num_rows:
        raise ValueError(f"group_ids has {len(group_ids)} entries but the batch has {num_rows} rows")
    for row, gid in enumerate(group_ids):
        try:
            hash(gid)
        except TypeError:
            raise TypeError(f"group_ids[{row}] = {gid!r} is not hashable") from None
    return group_ids


def _build(prompts: list[torch.Tensor], responses: list[torch.Tensor], group_ids: list[Hashable],
           response_width: int, device: torch.device) -> PackedBatch:
    """Pack per-row prompt/response token tensors (already stripped of padding)."""
    runs = _group_runs(group_ids)
    pieces: list[torch.Tensor] = []
    prompt_lens, response_lens = [], []
    for gid, first, end in runs:
        prompt = prompts[first]
        if prompt.numel() == 0:
            raise ValueError(f"row {first} (group {gid!r}) has an empty prompt; every row needs >= 1 prompt token")
        for row in range(first + 1, end):
            if prompts[row].numel() != prompt.numel() or not torch.equal(prompts[row], prompt):
                what = (f"{prompt.numel()} vs {prompts[row].numel()} tokens" if prompts[row].numel() != prompt.numel()
                        else "same length, different tokens")
                raise ValueError(f"rows {first} and {row} share group id {gid!r} but their prompts differ ({what}); "
                                 "a group's rows must share one prompt")
        pieces.append(prompt)
        lens = []
        for row in range(first, end):
            if responses[row].numel() == 0:
                raise ValueError(f"row {row} (group {gid!r}) has an empty response; drop it before packing")
            pieces.append(responses[row])
            lens.append(responses[row].numel())
        prompt_lens.append(prompt.numel())
        response_lens.append(lens)
    layout = GroupLayout.from_lengths(prompt_lens, response_lens)
    input_ids = torch.cat(pieces).to(device=device, dtype=torch.long)
    return _finish_pack(input_ids, layout, torch.cat(responses).to(device=device, dtype=torch.long),
                        response_width, tuple(run[0] for run in runs))


def _finish_pack(input_ids: torch.Tensor, layout: GroupLayout, response_ids: torch.Tensor, response_width: int,
                 group_ids: tuple) -> PackedBatch:
    predictor = []
    for s, (start, r) in enumerate(zip(layout.response_starts, layout.flat_response_lens)):
        g = layout.response_group[s]
        predictor.append(np.concatenate([[layout.last_prompt_index(g)], np.arange(start, start + r - 1)]))
    device = input_ids.device
    cu = np.concatenate([[0], np.cumsum(layout.flat_response_lens)])
    return PackedBatch(
        input_ids=input_ids,
        position_ids=layout.position_ids(device),
        layout=layout,
        response_ids=response_ids,
        predictor_index=torch.from_numpy(np.concatenate(predictor).astype(np.int64)).to(device),
        response_cu_seqlens=torch.from_numpy(cu.astype(np.int64)).to(device),
        response_width=response_width,
        group_ids=group_ids,
    )


def _contiguous_run(mask_row: torch.Tensor, *, at_end: bool) -> bool:
    """True iff the ones of a 0/1 row form one run touching the end (at_end) or the start of the row."""
    n = int(mask_row.sum())
    if n == 0:
        return True
    width = mask_row.shape[0]
    expected = torch.zeros_like(mask_row)
    if at_end:
        expected[width - n:] = 1
    else:
        expected[:n] = 1
    return torch.equal(mask_row, expected)


def pack_padded(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int,
                group_ids: Sequence[Hashable] | torch.Tensor) -> PackedBatch:
    """Pack a padded batch of rows [left-padded prompt | right-padded response] into P+ΣR.

    Args:
        input_ids: (B, L) token ids; columns [0, prompt_width) are prompts, the rest responses.
        attention_mask: (B, L) 0/1 (or bool): 1 on real tokens.
        prompt_width: width of the prompt part (veRL: ``prompts.shape[1]``).
        group_ids: (B,) one id per row (veRL: ``uid``); rows of a group must be adjacent.
    Returns:
        PackedBatch; :func:`unpack_token_values` pads back to width ``L - prompt_width``.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a (B, L) tensor; got {getattr(input_ids, 'shape', type(input_ids))}")
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}; got "
                         f"{tuple(getattr(attention_mask, 'shape', ()))}")
    if attention_mask.device != input_ids.device:
        raise ValueError(f"attention_mask is on {attention_mask.device} but input_ids on {input_ids.device}")
    if input_ids.dtype.is_floating_point:
        raise TypeError(f"input_ids must hold integer token ids; got {input_ids.dtype}")
    batch, width = input_ids.shape
    if not (isinstance(prompt_width, int) and 0 < prompt_width < width):
        raise ValueError(f"prompt_width must be an int in (0, {width}); got {prompt_width!r}")
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):  # before the cast: 256 would become 0
        raise ValueError("attention_mask must hold only 0 and 1")
    mask = attention_mask.to(torch.int8).cpu()
    ids = input_ids.cpu()
    group_ids = _normalise_group_ids(group_ids, batch)
    prompts, responses = [], []
    for row in range(batch):
        pm, rm = mask[row, :prompt_width], mask[row, prompt_width:]
        if not _contiguous_run(pm, at_end=True):
            raise ValueError(f"row {row}: the prompt part of attention_mask is not left-padded (its ones must be "
                             "one run ending at the prompt/response boundary)")
        if not _contiguous_run(rm, at_end=False):
            raise ValueError(f"row {row}: the response part of attention_mask is not right-padded (its ones must "
                             "be one run starting at the prompt/response boundary)")
        prompts.append(ids[row, prompt_width - int(pm.sum()):prompt_width])
        responses.append(ids[row, prompt_width:prompt_width + int(rm.sum())])
    return _build(prompts, responses, group_ids, width - prompt_width, input_ids.device)


def pack_varlen(input_ids: torch.Tensor, cu_seqlens: torch.Tensor, prompt_lens: Sequence[int] | torch.Tensor,
                group_ids: Sequence[Hashable] | torch.Tensor) -> PackedBatch:
    """Pack N(P+R) cu_seqlens-packed rows (row b = [prompt_b; response_b]) into P+ΣR.

    Args:
        input_ids: (total,) token ids of all rows back to back.
        cu_seqlens: (B + 1,) row offsets into ``input_ids``.
        prompt_lens: (B,) prompt length of each row.
        group_ids: (B,) one id per row; rows of a group must be adjacent.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1:
        raise ValueError(f"input_ids must be a 1-D (total,) tensor; got {getattr(input_ids, 'shape', None)}")
    if input_ids.dtype.is_floating_point:
        raise TypeError(f"input_ids must hold integer token ids; got {input_ids.dtype}")
    cu = check_cu_seqlens(cu_seqlens, "cu_seqlens", input_ids.shape[0], input_ids.device)
    batch = len(cu) - 1
    if isinstance(prompt_lens, torch.Tensor):
        if prompt_lens.dtype.is_floating_point or prompt_lens.dtype == torch.bool:
            raise TypeError(f"prompt_lens must hold integers; got {prompt_lens.dtype}")
        prompt_lens = prompt_lens.tolist()
    prompt_lens = [check_int(p, f"prompt_lens[{i}]", 0) for i, p in enumerate(prompt_lens)]
    if len(prompt_lens) != batch:
        raise ValueError(f"prompt_lens has {len(prompt_lens)} entries but cu_seqlens describes {batch} rows")
    group_ids = _normalise_group_ids(group_ids, batch)
    ids = input_ids.cpu()
    prompts, responses = [], []
    for row in range(batch):
        a, b, p = cu[row], cu[row + 1], prompt_lens[row]
        if not 0 <= p <= b - a:
            raise ValueError(f"row {row}: prompt_lens[{row}] = {p} but the row has {b - a} tokens")
        prompts.append(ids[a:a + p])
        responses.append(ids[a + p:b])
    width = max(b - a - p for a, b, p in zip(cu, cu[1:], prompt_lens))
    return _build(prompts, responses, group_ids, width, input_ids.device)


def split_token_values(values: torch.Tensor, packed: PackedBatch) -> list[torch.Tensor]:
    """(sum R, ...) per-response-token values in row order -> one (R_b, ...) tensor per row."""
    _check_values(values, packed)
    return list(torch.split(values, list(packed.layout.flat_response_lens)))


def unpack_token_values(values: torch.Tensor, packed: PackedBatch, pad_value: float = 0.0) -> torch.Tensor:
    """(sum R, ...) per-response-token values in row order -> (B, response_width, ...) right-padded.

    Entry [b, k] is the value for row b's response token k (e.g. its log-prob, predicted from the group's shared
    last prompt position when k = 0).
    """
    _check_values(values, packed)
    lens = torch.as_tensor(packed.layout.flat_response_lens, device=values.device)
    rows = torch.repeat_interleave(torch.arange(len(lens), device=values.device), lens)
    starts = torch.repeat_interleave(packed.response_cu_seqlens[:-1].to(values.device), lens)
    cols = torch.arange(values.shape[0], device=values.device) - starts
    out = values.new_full((len(lens), packed.response_width, *values.shape[1:]), pad_value)
    out[rows, cols] = values
    return out


def _check_values(values: torch.Tensor, packed: PackedBatch) -> None:
    expected = packed.layout.total_response_tokens
    if not isinstance(values, torch.Tensor) or values.dim() < 1 or values.shape[0] != expected:
        raise ValueError(f"values must have {expected} rows (one per response token, row order); got "
                         f"{tuple(getattr(values, 'shape', ()))}")
