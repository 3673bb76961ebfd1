"""Group-preserving dynamic micro-batches, with a group counted as the P+ΣR tokens it packs to.

veRL's dynamic batch size (``use_dynamic_bsz``) cuts a mini-batch into micro-batches of at most
``max_token_len_per_gpu * sp`` tokens, counting each row as P+R — a group of N rows as N(P+R) — and balancing the
rows' workloads, which scatters a group's rows over micro-batches. With dualkv the unit is a prompt group (a run of
rows with one uid) and its cost is P+ΣR tokens, so far more rows fit one budget. This is veRL's
``force_group_size`` made to work for groups of any size:

* units are whole groups; a group whose P+ΣR exceeds the budget is cut into consecutive sub-groups that fit
  (each still packs its prompt once), and if a rank has fewer units than the micro-batch count agreed across DP
  ranks, the largest units are halved;
* units are spread over micro-batches with veRL's Karmarkar–Karp partition on their workloads; the count starts
  at ceil(tokens / budget), is made equal on every DP rank (FSDP needs the same number of forward/backward
  passes everywhere) and grows until every micro-batch fits;
* each micro-batch keeps its rows in their original order, so a group's rows stay adjacent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

__all__ = ["Unit", "group_units", "split_units_to", "unit_workload", "plan_micro_batches"]


@dataclass(frozen=True)
class Unit:
    """Consecutive rows [start, stop) of one group, packed as one prompt of ``prompt_len`` + their responses."""

    start: int
    stop: int
    prompt_len: int
    response_lens: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return self.prompt_len + sum(self.response_lens)

    @property
    def rows(self) -> range:
        return range(self.start, self.stop)


def unit_workload(unit: Unit) -> int:
    """Relative cost of a unit: veRL's per-token constant (``calculate_workload``: 24576 per token, a 7B model) times
    its P+ΣR tokens, plus twice its causal (query, key) pairs under shared-prompt attention."""
    p = unit.prompt_len
    pairs = p * (p + 1) // 2 + sum(r * p + r * (r + 1) // 2 for r in unit.response_lens)
    return 24576 * unit.tokens + 2 * pairs


def _runs(group_ids: Sequence) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for row, gid in enumerate(group_ids):
        if runs and group_ids[runs[-1][0]] == gid:
            runs[-1] = (runs[-1][0], row + 1)
        else:
            runs.append((row, row + 1))
    return runs


def group_units(group_ids: Sequence, prompt_lens: Sequence[int], response_lens: Sequence[int],
                max_tokens: int) -> list[Unit]:
    """Runs of equal group id as units, each cut into consecutive pieces of at most ``max_tokens`` P+ΣR tokens."""
    if not len(group_ids) == len(prompt_lens) == len(response_lens):
        raise ValueError(f"group_ids, prompt_lens, response_lens have {len(group_ids)}, {len(prompt_lens)}, "
                         f"{len(response_lens)} entries")
    units: list[Unit] = []
    for start, stop in _runs(group_ids):
        p = int(prompt_lens[start])
        piece: list[int] = []
        piece_start = start
        for row in range(start, stop):
            r = int(response_lens[row])
            if p + r > max_tokens:
                raise ValueError(f"row {row} alone has {p + r} tokens (P={p}, R={r}), more than max_token_len "
                                 f"{max_tokens}; raise ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu")
            if piece and p + sum(piece) + r > max_tokens:
                units.append(Unit(piece_start, row, p, tuple(piece)))
                piece, piece_start = [], row
            piece.append(r)
        units.append(Unit(piece_start, stop, p, tuple(piece)))
    return units


def split_units_to(units: list[Unit], count: int) -> list[Unit]:
    """Halve the units with the most rows until there are at least ``count`` (a unit of one row is not split)."""
    units = list(units)
    while len(units) < count:
        biggest = max(range(len(units)), key=lambda i: (units[i].stop - units[i].start, -i))
        u = units[biggest]
        n = u.stop - u.start
        if n < 2:
            raise ValueError(f"{count} micro-batches were requested but this rank has only {len(units)} rows")
        half = n // 2
        units[biggest:biggest + 1] = [Unit(u.start, u.start + half, u.prompt_len, u.response_lens[:half]),
                                      Unit(u.start + half, u.stop, u.prompt_len, u.response_lens[half:])]
    return units


def plan_micro_batches(group_ids: Sequence, prompt_lens: Sequence[int], response_lens: Sequence[int],
                       max_tokens: int, *, partition: Callable[[list[int], int], list[list[int]]],
                       agree_count: Callable[[int], int] = lambda k: k,
                       agree_ok: Callable[[bool], bool] = lambda ok: ok,
                       min_count: int | None = None) -> list[list[int]]:
    """Row indices of each micro-batch (rows ascending within each).

    Args:
        group_ids, prompt_lens, response_lens: per row (rows of a group adjacent).
        max_tokens: the P+ΣR budget of one micro-batch.
        partition: ``partition(workloads, k) -> k lists of item indices`` (veRL's Karmarkar–Karp, unequal sizes).
        agree_count: makes the micro-batch count equal across DP ranks (max); identity on one rank.
        agree_ok: all-ranks AND of "every micro-batch fits".
        min_count: at least this many micro-batches.
    """
    base = group_units(group_ids, prompt_lens, response_lens, max_tokens)
    total = sum(u.tokens for u in base)
    count = agree_count(max(math.ceil(total / max_tokens), min_count or 1, 1))
    while True:
        units = split_units_to(base, count)
        parts = partition([unit_workload(u) for u in units], count)
        ok = all(sum(units[i].tokens for i in part) <= max_tokens for part in parts)
        if agree_ok(ok):
            break
        count += 1
    batches = [sorted(row for i in part for row in units[i].rows) for part in parts]
    if any(not b for b in batches):
        raise ValueError("the partition returned an empty micro-batch")
    return sorted(batches, key=lambda b: b[0])
