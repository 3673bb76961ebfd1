"""GroupLayout: the one description of a shared-prompt packed micro-batch.

A packed micro-batch holds G prompt groups back to back. Group g is laid out as

    [prompt_g (P_g tokens), response_g,1 (R_g,1 tokens), ..., response_g,N_g (R_g,N_g tokens)]

so the whole stream has T = sum_g (P_g + sum_i R_g,i) tokens. Every consumer (reference attention, CUDA kernels,
log-prob head, Ulysses SP, analysis) reads this object; nobody re-derives offsets on its own.

Logical positions (what RoPE and the causal mask see): prompt token j has position j; response token r of any
response has position P_g + r.

The kernels see the layout as a table of *segments*. A segment is a run of query tokens that attend causally to
themselves and, before that, to a fully visible context run:

    segment = (q_start, q_len, ctx_start, ctx_len)

Each prompt is a segment with ctx_len = 0 (call 1); each response is a segment whose context is its group's prompt
(call 2). One launch over the table covers the whole micro-batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np
import torch

__all__ = ["GroupLayout", "SEGMENT_FIELDS"]

#: Column order of :meth:`GroupLayout.segment_table`.
SEGMENT_FIELDS = ("q_start", "q_len", "ctx_start", "ctx_len")


def refuse_unordered(values: object, what: str) -> None:
    """Lengths are read in order: a set (no order; equal lengths merge) or a dict (its keys) would pack the rows
    silently in another order or drop some."""
    if isinstance(values, (set, frozenset, Mapping)):
        raise TypeError(f"{what} is a {type(values).__name__}; pass the lengths as an ordered sequence (list, tuple, "
                        "array) in packed order")


def _as_positive_ints(values: Iterable[int], what: str) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{what} must be a sequence of ints, got {type(values).__name__}")
    refuse_unordered(values, what)
    out = []
    for idx, value in enumerate(values):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{what}[{idx}] must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{what}[{idx}] = {int(value)}: lengths must be >= 1 (empty prompts and empty "
                             "responses are refused; drop such rows before packing)")
        out.append(int(value))
    return tuple(out)


@dataclass(frozen=True, eq=False)
class GroupLayout:
    """Lengths of every prompt group in a packed micro-batch, plus everything derived from them.

    Attributes:
        prompt_lens: ``P_g`` for each group g (each >= 1).
        response_lens: ``(R_g,1, ..., R_g,N_g)`` for each group g (each >= 1, N_g >= 1).

    Layouts compare (and hash) by identity: each keeps the device tensors built from it, and callers cache per
    layout object. Two layouts of the same lengths are ``a.lengths == b.lengths``.
    """

    prompt_lens: tuple[int, ...]
    response_lens: tuple[tuple[int, ...], ...]
    _device_cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        prompts = _as_positive_ints(self.prompt_lens, "prompt_lens")
        if len(prompts) == 0:
            raise ValueError("a GroupLayout needs at least one group")
        if isinstance(self.response_lens, (str, bytes)) or not hasattr(self.response_lens, "__len__"):
            raise TypeError("response_lens must be a sequence with one sequence of lengths per group, got "
                            f"{type(self.response_lens).__name__}")
        refuse_unordered(self.response_lens, "response_lens")
        if len(self.response_lens) != len(prompts):
            raise ValueError(f"prompt_lens has {len(prompts)} groups but response_lens has {len(self.response_lens)}")
        responses = []
        for g, lens in enumerate(self.response_lens):
            lens = _as_positive_ints(lens, f"response_lens[{g}]")
            if len(lens) == 0:
                raise ValueError(f"group {g} has no responses (N_g must be >= 1)")
            responses.append(lens)
        object.__setattr__(self, "prompt_lens", prompts)
        object.__setattr__(self, "response_lens", tuple(responses))

    # ------------------------------------------------------------------ construction
    @classmethod
    def single(cls, prompt_len: int, response_lens: Sequence[int]) -> "GroupLayout":
        """One group: a prompt of ``prompt_len`` tokens and responses of the given lengths."""
        refuse_unordered(response_lens, "response_lens[0]")
        return cls((prompt_len,), (tuple(response_lens),))

    @classmethod
    def from_lengths(cls, prompt_lens: Sequence[int], response_lens: Sequence[Sequence[int]]) -> "GroupLayout":
        refuse_unordered(prompt_lens, "prompt_lens")
        refuse_unordered(response_lens, "response_lens")
        groups = tuple(response_lens)
        for g, lens in enumerate(groups):
            refuse_unordered(lens, f"response_lens[{g}]")
        return cls(tuple(prompt_lens), tuple(tuple(r) for r in groups))

    # ------------------------------------------------------------------ sizes
    @property
    def lengths(self) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
        """(prompt_lens, response_lens): what two layouts of the same micro-batch shape share."""
        return self.prompt_lens, self.response_lens

    @property
    def num_groups(self) -> int:
        return len(self.prompt_lens)

    @property
    def group_sizes(self) -> tuple[int, ...]:
        """N_g for each group."""
        return tuple(len(r) for r in self.response_lens)

    @property
    def num_responses(self) -> int:
        return sum(self.group_sizes)

    @cached_property
    def flat_response_lens(self) -> tuple[int, ...]:
        """R of every response, in packed (= row) order."""
        return tuple(r for lens in self.response_lens for r in lens)

    @cached_property
    def total_tokens(self) -> int:
        """T = sum_g (P_g + sum_i R_g,i): tokens of the shared-prompt packing."""
        return sum(self.prompt_lens) + sum(self.flat_response_lens)

    @cached_property
    def total_response_tokens(self) -> int:
        return sum(self.flat_response_lens)

    @cached_property
    def tokens_std(self) -> int:
        """sum_g (N_g P_g + sum_i R_g,i): tokens of the N-copy packing of the same rows."""
        return sum(n * p for n, p in zip(self.group_sizes, self.prompt_lens)) + self.total_response_tokens

    @property
    def max_prompt_len(self) -> int:
        return max(self.prompt_lens)

    @property
    def max_response_len(self) -> int:
        return max(self.flat_response_lens)

    @property
    def max_segment_len(self) -> int:
        return max(self.max_prompt_len, self.max_response_len)

    # ------------------------------------------------------------------ offsets (host side)
    @cached_property
    def group_starts(self) -> tuple[int, ...]:
        """Packed token offset of each group's first prompt token."""
        starts, pos = [], 0
        for p, lens in zip(self.prompt_lens, self.response_lens):
            starts.append(pos)
            pos += p + sum(lens)
        return tuple(starts)

    @cached_property
    def response_starts(self) -> tuple[int, ...]:
        """Packed token offset of every response, in row order."""
        starts = []
        for g0, p, lens in zip(self.group_starts, self.prompt_lens, self.response_lens):
            pos = g0 + p
            for r in lens:
                starts.append(pos)
                pos += r
        return tuple(starts)

    @cached_property
    def response_group(self) -> tuple[int, ...]:
        """Group index of every response, in row order."""
        return tuple(g for g, n in enumerate(self.group_sizes) for _ in range(n))

    @cached_property
    def first_response_index(self) -> tuple[int, ...]:
        """Row index of the first response of each group."""
        out, acc = [], 0
        for n in self.group_sizes:
            out.append(acc)
            acc += n
        return tuple(out)

    def prompt_range(self, g: int) -> tuple[int, int]:
        start = self.group_starts[g]
        return start, start + self.prompt_lens[g]

    def responses_range(self, g: int) -> tuple[int, int]:
        """Packed [start, end) of all responses of group g (they are contiguous)."""
        start = self.group_starts[g] + self.prompt_lens[g]
        return start, start + sum(self.response_lens[g])

    def response_range(self, g: int, i: int) -> tuple[int, int]:
        start = self.response_starts[self.first_response_index[g] + i]
        return start, start + self.response_lens[g][i]

    def response_cu_seqlens(self, g: int) -> list[int]:
        """cu_seqlens (N_g + 1 entries, starting at 0) of group g's responses relative to their first token."""
        out = [0]
        for r in self.response_lens[g]:
            out.append(out[-1] + r)
        return out

    def last_prompt_index(self, g: int) -> int:
        """Packed index of group g's last prompt token (the shared row predicting every first response token)."""
        return self.group_starts[g] + self.prompt_lens[g] - 1

    # ------------------------------------------------------------------ kernel view
    @cached_property
    def segment_table(self) -> np.ndarray:
        """int32 array (G + S, 4) of (q_start, q_len, ctx_start, ctx_len): prompts first, then responses.

        Prompt segments (call 1) have ctx_len = 0; response segments (call 2) have their group's prompt as
        context. Kernels launch one grid over all rows of this table.
        """
        rows = [(g0, p, g0, 0) for g0, p in zip(self.group_starts, self.prompt_lens)]
        for s, (start, r) in enumerate(zip(self.response_starts, self.flat_response_lens)):
            g = self.response_group[s]
            rows.append((start, r, self.group_starts[g], self.prompt_lens[g]))
        table = np.asarray(rows, dtype=np.int64)
        if table.max(initial=0) >= 2**31:
            raise ValueError(f"packed micro-batch of {self.total_tokens} tokens exceeds int32 offsets")
        return table.astype(np.int32)

    def device_tensors(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        """Device copies of the index tensors, made once per device and cached on the layout."""
        device = torch.device(device)
        key = str(device)
        cached = self._device_cache.get(key)
        if cached is None:
            cached = {
                "segment_table": torch.from_numpy(self.segment_table.copy()).to(device),
                "position_ids": self.position_ids(device),
            }
            self._device_cache[key] = cached
        return cached

    # ------------------------------------------------------------------ positions and the N-copy view
    def position_ids(self, device: torch.device | str | None = None) -> torch.Tensor:
        """(T,) int64 logical positions: prompt 0..P_g-1, response P_g..P_g+R-1."""
        parts = []
        for p, lens in zip(self.prompt_lens, self.response_lens):
            parts.append(np.arange(p))
            for r in lens:
                parts.append(np.arange(p, p + r))
        return torch.from_numpy(np.concatenate(parts)).to(device=device)

    @cached_property
    def copy_token_index(self) -> np.ndarray:
        """int64 (T_std,): for each token of the N-copy layout (rows [prompt_g; response_g,i] in row order), the
        packed token it is a copy of. ``x_std = x_packed[copy_token_index]``."""
        parts = []
        for g, lens in enumerate(self.response_lens):
            p0, p1 = self.prompt_range(g)
            for i in range(len(lens)):
                r0, r1 = self.response_range(g, i)
                parts.append(np.arange(p0, p1))
                parts.append(np.arange(r0, r1))
        return np.concatenate(parts).astype(np.int64)

    @cached_property
    def copy_cu_seqlens(self) -> np.ndarray:
        """int64 (S + 1,): cu_seqlens of the N-copy layout (one row per response: P_g + R_g,i tokens)."""
        lens = [self.prompt_lens[g] + r for g, r in zip(self.response_group, self.flat_response_lens)]
        return np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)

    @cached_property
    def first_copy_index(self) -> np.ndarray:
        """int64 (T,): for each packed token, the N-copy token of its first occurrence (prompt tokens occur N_g
        times there, response tokens once). ``x_packed = x_std[first_copy_index]``."""
        index = np.empty(self.total_tokens, dtype=np.int64)
        copy_index = self.copy_token_index
        index[copy_index[::-1]] = np.arange(copy_index.shape[0] - 1, -1, -1)
        return index

    # ------------------------------------------------------------------ misc
    def to_dict(self) -> dict:
        return {"prompt_lens": list(self.prompt_lens), "response_lens": [list(r) for r in self.response_lens]}

    def __repr__(self) -> str:
        groups = ", ".join(f"(P={p}, R={list(r)})" for p, r in zip(self.prompt_lens, self.response_lens))
        return f"GroupLayout[{groups}]"
