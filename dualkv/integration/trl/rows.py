"""TRL's GRPO rows grouped by prompt, cut into packable chunks, and shuffled without splitting a group.

``GRPOTrainer`` hands every log-prob call a padded batch: ``input_ids = cat(prompt_ids, completion_ids)`` with the
prompts left-padded and the completions right-padded, and ``attention_mask = cat(prompt_mask, completion_mask)``.
It carries no group ids: the ``num_generations`` copies of a prompt are simply rows with the same prompt tokens
(TRL's ``RepeatSampler`` puts them next to each other, its ``shuffle_sequence_dict`` scatters them). So a group here
is *every row of the call whose real prompt tokens are equal* — rows with one prompt share it exactly whatever their
origin, which makes the packing exact for any row order. Rows whose completion has no real token (a truncated
completion under ``mask_truncated_completions``) are left out of the packing; their log-probs are 0, as stock's.

:func:`plan_chunks` cuts a call into chunks of whole groups of at most a token budget (a group too big for the
budget is cut into sub-groups, each packing its own copy of the prompt); :func:`group_shuffle` is the
group-preserving replacement for TRL's row shuffle of the generation batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

__all__ = ["RowGroups", "group_rows", "plan_chunks", "group_shuffle_order", "group_shuffle"]


@dataclass(frozen=True)
class RowGroups:
    """The rows of one log-prob call grouped by prompt.

    Attributes:
        groups: row indices of each group (rows with equal real prompt tokens), groups in order of first row.
        prompt_lens: real prompt length of each group.
        completion_lens: (B,) real completion length of every row (0: an empty row, packed nowhere).
    """

    groups: tuple[tuple[int, ...], ...]
    prompt_lens: tuple[int, ...]
    completion_lens: tuple[int, ...]

    @property
    def empty_rows(self) -> tuple[int, ...]:
        return tuple(row for row, n in enumerate(self.completion_lens) if n == 0)


def group_rows(attention_mask: torch.Tensor, input_ids: torch.Tensor, prompt_width: int) -> RowGroups:
    """Group the rows of a TRL batch by their real prompt tokens.

    Args:
        attention_mask: (B, L) 0/1: ``cat(prompt_mask, completion_mask)``.
        input_ids: (B, L) ``cat(prompt_ids, completion_ids)``.
        prompt_width: width of the (left-padded) prompt part, ``L - logits_to_keep``.
    Returns:
        RowGroups; rows with an empty completion are in no group.
    """
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(f"input_ids and attention_mask must be (B, L) of one shape; got {tuple(input_ids.shape)} and "
                         f"{tuple(attention_mask.shape)}")
    if not 0 < prompt_width < input_ids.shape[1]:
        raise ValueError(f"prompt width {prompt_width} must lie in (0, {input_ids.shape[1]})")
    mask = attention_mask.detach().to("cpu", torch.int64)
    ids = input_ids.detach().cpu()
    prompt_real = mask[:, :prompt_width].sum(1).tolist()
    completion_lens = tuple(int(n) for n in mask[:, prompt_width:].sum(1).tolist())
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for row, p in enumerate(prompt_real):
        if completion_lens[row] == 0:
            continue
        key = tuple(ids[row, prompt_width - p:prompt_width].tolist())
        by_prompt.setdefault(key, []).append(row)
    groups = tuple(tuple(rows) for rows in by_prompt.values())
    return RowGroups(groups, tuple(len(key) for key in by_prompt), completion_lens)


def plan_chunks(row_groups: RowGroups, budget: int | None) -> list[list[tuple[int, ...]]]:
    """Chunks of whole groups, each at most ``budget`` packed tokens (P + sum R per group); None: one chunk.

    A group whose P + sum R exceeds the budget is cut, rows in order, into sub-groups that fit (a single row always
    fits: its P + R is at most one stock row). Returns, per chunk, its groups as row tuples.
    """
    if budget is not None and budget < 1:
        raise ValueError(f"token budget must be >= 1 or None; got {budget}")
    units: list[tuple[int, tuple[int, ...]]] = []
    for rows, p in zip(row_groups.groups, row_groups.prompt_lens):
        piece: list[int] = []
        tokens = p
        for row in rows:
            r = row_groups.completion_lens[row]
            if piece and budget is not None and tokens + r > budget:
                units.append((tokens, tuple(piece)))
                piece, tokens = [], p
            piece.append(row)
            tokens += r
        units.append((tokens, tuple(piece)))
    chunks: list[list[tuple[int, ...]]] = []
    used = 0
    for tokens, rows in units:
        if not chunks or (budget is not None and used + tokens > budget):
            chunks.append([])
            used = 0
        chunks[-1].append(rows)
        used += tokens
    return chunks


def group_shuffle_order(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """A random row order that keeps every prompt group's rows together (and in their order).

    Draws exactly what TRL's ``shuffle_sequence_dict`` draws (one ``torch.randperm(B)``), so the random stream after
    the shuffle — and with it every later generation — is the one a stock run sees. Group order: by the first place
    any of the group's rows takes in that permutation.
    """
    batch = prompt_ids.shape[0]
    permutation = torch.randperm(batch)
    place = torch.empty(batch, dtype=torch.long)
    place[permutation] = torch.arange(batch)
    mask = prompt_mask.detach().cpu().bool()
    ids = prompt_ids.detach().cpu()
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for row in range(batch):
        by_prompt.setdefault(tuple(ids[row][mask[row]].tolist()), []).append(row)
    groups = sorted(by_prompt.values(), key=lambda rows: int(place[rows].min()))
    return torch.tensor([row for rows in groups for row in rows], dtype=torch.long)


def group_shuffle(seq_dict: dict[str, Sequence | None]) -> dict[str, Sequence | None]:
    """Drop-in for TRL's ``shuffle_sequence_dict`` on a generation batch: shuffles prompt groups, not rows.

    Needs ``prompt_ids`` and ``prompt_mask`` in ``seq_dict`` (TRL's generation batch has both). Values are permuted
    as TRL does: 0-d tensors and None kept, tensors indexed along dim 0, lists reordered.
    """
    for key in ("prompt_ids", "prompt_mask"):
        if not isinstance(seq_dict.get(key), torch.Tensor):
            raise KeyError(f"the generation batch has no tensor {key!r}; dualkv's group-preserving shuffle needs it")
    order = group_shuffle_order(seq_dict["prompt_ids"], seq_dict["prompt_mask"])

    def permute(v: Any) -> Any:
        if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
            return v
        if isinstance(v, torch.Tensor):
            return v[order.to(v.device)]
        return [v[i] for i in order.tolist()]

    return {key: permute(val) for key, val in seq_dict.items()}
