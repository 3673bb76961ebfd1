"""Group-preserving sequence balancing across data-parallel ranks, for both veRL trainers.

veRL reorders each step's batch so the DP ranks get similar work (``_balance_batch``), partitioning *rows* by
length — which scatters the N responses of a prompt over ranks and breaks the shared-prompt packing. With dualkv
the partition is over *groups* (rows sharing a uid), weighted by what a group costs when packed once:

* every rank gets exactly B / dp rows (veRL's dispatch cuts the reordered batch into equal chunks);
* when all groups have the same size and their number divides by dp, veRL's Karmarkar–Karp partition with equal
  group counts is used; otherwise (padded batches, short or filtered groups) groups are placed largest first on
  the least-loaded rank that still has room, and a group that fits nowhere whole is split over the ranks with
  room (each part still packs its prompt once; the log-probs stay exact);
* on each rank, groups keep their original order and a group's rows stay adjacent (and in their original order).

Rows of one uid that are not adjacent in the input are gathered together.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

from .micro_batches import Unit, collect_groups, unit_workload

__all__ = ["group_balanced_partitions", "partition_problems", "split_groups"]


def _workload(rows: list[int], prompt_lens: Sequence[int], response_lens: Sequence[int]) -> int:
    return unit_workload(Unit(tuple(rows), int(prompt_lens[rows[0]]), tuple(int(response_lens[r]) for r in rows)))


def group_balanced_partitions(group_ids: Sequence[Hashable], prompt_lens: Sequence[int],
                              response_lens: Sequence[int], k_partitions: int,
                              equal_partition: Callable[[list[int], int], list[list[int]]] | None = None
                              ) -> list[list[int]]:
    """k lists of row indices, equal in length, keeping each group's rows together wherever the sizes allow.

    Args:
        group_ids, prompt_lens, response_lens: per row.
        k_partitions: the DP size; the row count must divide by it.
        equal_partition: ``f(workloads, k) -> k equal-count lists of item indices`` (veRL's Karmarkar–Karp with
            ``equal_size=True``), used when every group has the same size and the group count divides by k.
    """
    n_rows = len(group_ids)
    if not n_rows == len(prompt_lens) == len(response_lens):
        raise ValueError(f"group_ids, prompt_lens, response_lens have {n_rows}, {len(prompt_lens)}, "
                         f"{len(response_lens)} entries")
    if k_partitions < 1 or n_rows % k_partitions:
        raise ValueError(f"{n_rows} rows cannot be split into {k_partitions} equal DP partitions")
    groups = collect_groups(group_ids)
    loads = [_workload(g, prompt_lens, response_lens) for g in groups]
    sizes = {len(g) for g in groups}
    if equal_partition is not None and len(sizes) == 1 and len(groups) % k_partitions == 0:
        parts = equal_partition(loads, k_partitions)
        return [[row for gi in sorted(part) for row in groups[gi]] for part in parts]
    capacity = n_rows // k_partitions
    room = [capacity] * k_partitions
    load = [0] * k_partitions
    placed: list[list[tuple[int, list[int]]]] = [[] for _ in range(k_partitions)]
    for gi in sorted(range(len(groups)), key=lambda i: (-loads[i], i)):
        rows = groups[gi]
        fits = [p for p in range(k_partitions) if room[p] >= len(rows)]
        if fits:
            p = min(fits, key=lambda q: (load[q], q))
            placed[p].append((gi, rows))
            room[p] -= len(rows)
            load[p] += loads[gi]
            continue
        rest = list(rows)
        for p in sorted(range(k_partitions), key=lambda q: (-room[q], load[q], q)):
            if not rest:
                break
            take, rest = rest[:room[p]], rest[room[p]:]
            if take:
                placed[p].append((gi, take))
                room[p] -= len(take)
                load[p] += _workload(take, prompt_lens, response_lens)
    return [[row for _, rows in sorted(part) for row in rows] for part in placed]


def partition_problems(group_ids: Sequence[Hashable], partitions: Sequence[Sequence[int]]) -> list[str]:
    """What makes a DP partition unusable for dualkv: rows lost or duplicated, unequal sizes, a group's rows not
    adjacent on a rank. Empty list: usable."""
    problems = []
    flat = [r for part in partitions for r in part]
    if sorted(flat) != list(range(len(group_ids))):
        problems.append("the partitions do not hold every row exactly once")
    if len({len(p) for p in partitions}) > 1:
        problems.append(f"partition sizes differ: {[len(p) for p in partitions]}")
    for p, part in enumerate(partitions):
        seen: list[Hashable] = []
        for row in part:
            gid = group_ids[row]
            if seen and seen[-1] != gid and gid in seen:
                problems.append(f"rank {p}: rows of group {gid!r} are not adjacent")
            if not seen or seen[-1] != gid:
                seen.append(gid)
    return problems


def split_groups(group_ids: Sequence[Hashable], partitions: Sequence[Sequence[int]]) -> list[Hashable]:
    """Groups whose rows ended up on more than one rank (each part still packs exactly; it only shares less)."""
    where: dict[Hashable, set[int]] = {}
    for p, part in enumerate(partitions):
        for row in part:
            where.setdefault(group_ids[row], set()).add(p)
    return [gid for gid, ranks in where.items() if len(ranks) > 1]
