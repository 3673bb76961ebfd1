"""Group-preserving dynamic micro-batches, with a group counted as the P+ΣR tokens it packs to.

veRL's dynamic batch size (``use_dynamic_bsz``) cuts a mini-batch into micro-batches of at most
``max_token_len_per_gpu * sp`` tokens, counting each row as P+R — a group of N rows as N(P+R) — and balancing the
rows' workloads, which scatters a group's rows over micro-batches. With dualkv the unit is a prompt group (a run of
rows with one uid) and its cost is P+ΣR tokens, so far more rows fit one budget. This is veRL's
``force_group_size`` made to work for groups of any size:

* units are whole groups — all rows of a group id, wherever they sit in the mini-batch; a group whose P+ΣR
  exceeds the budget is cut into sub-groups that fit (each still packs its prompt once), and if a rank has fewer
  units than the micro-batch count agreed across DP ranks, the largest units are halved;
* units are spread over micro-batches with veRL's Karmarkar–Karp partition on their workloads; the count starts
  at ceil(tokens / budget), is made equal on every DP rank (FSDP needs the same number of forward/backward
  passes everywhere) and grows until every micro-batch fits;
* a micro-batch lists its rows unit after unit, so a group's rows are adjacent (veRL maps the outputs back to the
  original row order with the returned indices, as for its own dynamic batches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

__all__ = ["Unit", "collect_groups", "group_units", "split_units_to", "unit_workload", "plan_micro_batches"]


@dataclass(frozen=True)
class Unit:
    """Rows of one group, packed as one prompt of ``prompt_len`` tokens followed by their responses."""

    rows: tuple[int, ...]
    prompt_len: int
    response_lens: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return self.prompt_len + sum(self.response_lens)


def collect_groups(group_ids: Sequence[Hashable]) -> list[list[int]]:
    """Row indices of each distinct group id, groups in order of first appearance."""
    groups: dict[Hashable, list[int]] = {}
    for row, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(row)
    return list(groups.values())


def unit_workload(unit: Unit) -> int:
    """Relative cost of a unit: veRL's per-token constant (``calculate_workload``: 24576 per token, a 7B model) times
    its P+ΣR tokens, plus twice its causal (query, key) pairs under shared-prompt attention."""
    p = unit.prompt_len
    pairs = p * (p + 1) // 2 + sum(r * p + r * (r + 1) // 2 for r in unit.response_lens)
    return 24576 * unit.tokens + 2 * pairs


def group_units(group_ids: Sequence[Hashable], prompt_lens: Sequence[int], response_lens: Sequence[int],
                max_tokens: int) -> list[Unit]:
    """Each group's rows as a unit, cut into pieces of at most ``max_tokens`` P+ΣR tokens (rows in order)."""
    if not len(group_ids) == len(prompt_lens) == len(response_lens):
        raise ValueError(f"group_ids, prompt_lens, response_lens have {len(group_ids)}, {len(prompt_lens)}, "
                         f"{len(response_lens)} entries")
    if len(group_ids) == 0:
        raise ValueError("no rows to plan micro-batches for (this rank's batch is empty)")
    units: list[Unit] = []
    for rows in collect_groups(group_ids):
        p = int(prompt_lens[rows[0]])
        piece: list[int] = []
        for row in rows:
            r = int(response_lens[row])
            if p + r > max_tokens:
                raise ValueError(f"row {row} alone has {p + r} tokens (P={p}, R={r}), more than max_token_len "
                                 f"{max_tokens}; raise ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu")
            if piece and p + sum(int(response_lens[i]) for i in piece) + r > max_tokens:
                units.append(Unit(tuple(piece), p, tuple(int(response_lens[i]) for i in piece)))
                piece = []
            piece.append(row)
        units.append(Unit(tuple(piece), p, tuple(int(response_lens[i]) for i in piece)))
    return units


def split_units_to(units: list[Unit], count: int) -> list[Unit]:
    """Halve the units with the most rows until there are at least ``count`` (a unit of one row is not split)."""
    units = list(units)
    while len(units) < count:
        biggest = max(range(len(units)), key=lambda i: (len(units[i].rows), -i))
        u = units[biggest]
        if len(u.rows) < 2:
            raise ValueError(f"{count} micro-batches were requested but this rank has only {len(units)} rows")
        half = len(u.rows) // 2
        units[biggest:biggest + 1] = [Unit(u.rows[:half], u.prompt_len, u.response_lens[:half]),
                                      Unit(u.rows[half:], u.prompt_len, u.response_lens[half:])]
    return units


def plan_micro_batches(group_ids: Sequence, prompt_lens: Sequence[int], response_lens: Sequence[int],
                       max_tokens: int, *, partition: Callable[[list[int], int], list[list[int]]],
                       agree_count: Callable[[int], int] = lambda k: k,
                       agree_ok: Callable[[bool], bool] = lambda ok: ok,
                       min_count: int | None = None) -> list[list[int]]:
    """Row indices of each micro-batch, a group's rows adjacent (units in the partition's order).

    Args:
        group_ids, prompt_lens, response_lens: per row.
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
    batches = [[row for i in sorted(part) for row in units[i].rows] for part in parts]
    if any(not b for b in batches):
        raise ValueError("the partition returned an empty micro-batch")
    return sorted(batches, key=min)
