"""A CPU model of the warp-specialised backward's schedule (csrc/bwd_sm90_ws.cu, stated in
dualkv/cuda/ws_schedule.py), for choosing a tree launch order and dQ order before spending GPU time on it.

Two questions, one model each (both count time in steps: one CTA step = one 64-query x 128-key tile of one query
head; one CTA per SM; CTAs start in launch order: kv head innermost, as the kernel's 1-D grid in the tile-major
CTA order — what trees run — or, for the two-level orders "node-head" (own-first, each KV head's whole table in turn)
and "shared-split" (shared-first, every KV head's shared-key tiles, then every head's own-response tiles; the default
since 7227113), the head-major order of :func:`dualkv.cuda.ws_schedule.cta_order`):

* **L2 reuse** (:func:`l2_misses`): CTAs run without waiting; every step touches its (query head, query tile)'s dQ
  accumulator tile and Q/dO tiles (64 KB together: 64 x 128 fp32 + two 64 x 128 bf16); an LRU cache of
  ``l2_tiles`` such objects (the H100's 50 MB L2 / 64 KB by default) stands in for the L2. Misses per step ~ DRAM
  traffic per step. A node's CTAs sweep the same query tiles: they reuse them only if they run together, in near
  lockstep. The figures move a lot with the modelled capacity (the CLI reports two), so they rank orders only
  where both capacities agree.
* **dQ waits** (:func:`with_dq_waits`): a step's dQ add happens when its counter reads the step's rank (an instant
  add); a CTA waits otherwise, holding its SM. Makespan against the ideal (total steps / SMs) measures the time SMs
  sit waiting or idle (a long CTA launched last leaves a tail). ``deadlock`` is reported, never hidden.

It is a model (no latencies, no bandwidth limits, a fully associative LRU): it ranks orders, it does not predict
milliseconds. Measured on an H100 (experiments/results/checks/tree-ws-dq-variants-h100-20261126T2335Z.json):
removing the dQ hand-off saves ~39% of workload a's backward; adds without ordering are slower still (contention),
so traffic, not waiting, is the cost there; on workload c the waits are the whole cost.

    python experiments/ws_order_model.py --workloads a,c,two-level,4x8K --out experiments/results/models/ws-order-model.json
    python experiments/ws_order_model.py --workloads 28x4K,8x8K,16x1K --l2-tiles 763 \
        --out experiments/results/models/ws-order-model-split-cpu-20261129.json
    python experiments/ws_order_model.py --workloads 16x1K,16x512-R4K,8x256-R4K --l2-tiles 763 \
        --split-dependents 2,4,8 --out experiments/results/models/ws-order-model-deps-cpu-20261129.json
    python experiments/ws_order_model.py --workloads 4x1K,8x1K,16x1K,8x512 --l2-tiles 763 --ws-split \
        --out experiments/results/models/ws-order-model-wssplit-cpu-20261129.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from collections import OrderedDict, defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dualkv import GroupLayout, PrefixTreeLayout  # noqa: E402
from dualkv.analysis.trees import branching_workload, multi_turn_workload, system_prompt_workload  # noqa: E402
from dualkv.cuda import ws_schedule  # noqa: E402
from dualkv.cuda.schedule import key_tiles  # noqa: E402
from dualkv.cuda.tree_schedule import tree_key_tiles, tree_rows, tree_segments  # noqa: E402

WORKLOADS = {"16x512-R4K": lambda: GroupLayout.single(512, [4096] * 16),
             "4x1K": lambda: GroupLayout.single(1024, [2048] * 4),
             "8x1K": lambda: GroupLayout.single(1024, [2048] * 8),
             "8x512": lambda: GroupLayout.single(512, [2048] * 8),
             "8x256-R4K": lambda: GroupLayout.single(256, [4096] * 8),
             "a": system_prompt_workload, "b": branching_workload, "c": multi_turn_workload,
             "two-level": lambda: GroupLayout.single(32768, [2048] * 16),
             "4x8K": lambda: GroupLayout.from_lengths([8192] * 4, [[2048] * 8] * 4),
             "28x4K": lambda: GroupLayout.single(4096, [2048] * 28),
             "8x8K": lambda: GroupLayout.single(8192, [2048] * 8),
             "16x1K": lambda: GroupLayout.single(1024, [2048] * 16)}
SMS, KV_HEADS, GROUP = 132, 8, 4
L2_TILES = int(50e6 // 65536)  # H100 L2 / (dQ fp32 tile + Q and dO bf16 tiles)


def schedules(layout) -> dict:
    """order name -> (segment rows (S, 4), key tiles in launch order, TreeRanks or None): a tree's default
    (nearest-first), nearest-first node-major and root-first orders; a GroupLayout's heaviest-first and node-major
    two-level orders."""
    if isinstance(layout, PrefixTreeLayout):
        rows = tree_rows(tree_segments(layout), layout.num_nodes)
        heaviest = tree_key_tiles(layout, ws_schedule.BLOCK_KEYS)
        out = {}
        for name, root_first, node_major in (("nearest", False, False), ("nearest-node", False, True),
                                             ("root", True, True)):
            ranks = ws_schedule.TreeRanks.of(layout, root_first)
            out[name] = (rows, ws_schedule.launch_order(heaviest, None, ranks, node_major), ranks)
        return out
    rows = np.asarray(layout.segment_table, dtype=np.int64).reshape(-1, 4)
    tiles = key_tiles(rows, ws_schedule.BLOCK_KEYS, True, True)
    out = {name: (rows, ws_schedule.launch_order(tiles, rows, node_major_tiles=node), None)
           for name, node in (("heaviest", False), ("node", True))}
    # head-major CTA orders (the two-level default since 2c4891d): the own-first table, each KV head's in turn; the
    # shared-first table split (every KV head's shared-key tiles, then every head's own-response tiles)
    own = ws_schedule.launch_order(tiles, rows, node_major_tiles=True)
    shared = ws_schedule.launch_order(tiles, rows, node_major_tiles=True, shared_first=True)
    out["node-head"] = (rows, own, HeadMajor(len(own)))
    out["shared-split"] = (rows, shared, HeadMajor(ws_schedule.head_major_split(shared, rows, True), True))
    return out


class HeadMajor:
    """A two-level schedule's head-major CTA order (:func:`dualkv.cuda.ws_schedule.cta_order`), passed where a tree's
    ranks go: ``first_tiles`` of the split and whether the dQ order is shared-first."""

    def __init__(self, first_tiles: int, shared_first: bool = False):
        self.first_tiles, self.shared_first = first_tiles, shared_first


def split_dependents(tiles: np.ndarray, first_tiles: int, parts: int) -> tuple[np.ndarray, "HeadMajor"]:
    """The split shared-key tiles as modelled before they were built (as :mod:`dualkv.cuda.ws_split`, which cuts the
    dependents by query rows and keeps each tile's parts adjacent): each of the first ``first_tiles`` rows (a
    shared-first table's shared-key tiles) has its dependent segments cut into ``parts`` contiguous ranges, one CTA
    each. The first keeps the own (causal) steps; the others are dependent-only rows (own_seg -1, so the walk has no
    own phase). Every counter still receives block b once, from the CTA whose range holds its segment, so the
    shared-first ranks are unchanged; the kernels also sum the parts' dK / dV in a fixed order, which the model does
    not time. Returns the new table (split rows first) and its head-major split."""
    head, rest = [], []
    for own, blk, begin, end in np.asarray(tiles[:first_tiles]).tolist():
        cuts = np.linspace(begin, end, min(parts, max(end - begin, 1)) + 1).round().astype(int)
        head.append([own, blk, int(cuts[0]), int(cuts[1])])
        rest += [[-1, blk, int(a), int(b)] for a, b in zip(cuts[1:-1], cuts[2:])]
    table = np.asarray(head + rest + np.asarray(tiles[first_tiles:]).tolist(), dtype=np.int64).reshape(-1, 4)
    return table, HeadMajor(len(head) + len(rest), True)


def ws_split_table(rows: np.ndarray, tiles: np.ndarray) -> tuple[np.ndarray, "HeadMajor", int]:
    """The split the kernels run (:mod:`dualkv.cuda.ws_split`, ``DUALKV_WS_SPLIT=auto`` at :data:`SMS` SMs and
    :data:`KV_HEADS` KV heads) of a shared-first table: (table, its head-major split, parts)."""
    from dualkv.cuda import ws_split

    shared = ws_split.shared_rows(tiles, rows)
    split = ws_split.split_shared_tiles(tiles, rows, shared, ws_split.split_parts(tiles, shared, KV_HEADS, SMS))
    return split.tiles, HeadMajor(split.first_tiles, True), split.parts


def _ctas(tiles: np.ndarray, kv_heads: int, ranks: "ws_schedule.TreeRanks | HeadMajor | None" = None
          ) -> list[tuple[int, int]]:
    """(table row, KV head) of each CTA in launch order: head-major for a :class:`HeadMajor`, else tile-major."""
    if isinstance(ranks, HeadMajor):
        return [(int(t), int(h)) for h, t in ws_schedule.cta_order(len(tiles), kv_heads, ranks.first_tiles)]
    return [(t, h) for t in range(len(tiles)) for h in range(kv_heads)]


def _rank(tile: tuple[int, int, int, int], st: ws_schedule.Step,
          ranks: "ws_schedule.TreeRanks | HeadMajor | None") -> int:
    """The dQ rank of a step: a two-level order's (shared-first or own-first) or a tree's."""
    if isinstance(ranks, HeadMajor):
        return ws_schedule.rank(tile, st, None, ranks.shared_first)
    return ws_schedule.rank(tile, st, ranks)


def l2_misses(rows, tiles, ranks=None, *, sms: int = SMS, kv_heads: int = KV_HEADS, group: int = GROUP,
              l2_tiles: int = L2_TILES) -> dict:
    """The L2 model (module docstring): steps, makespan, ideal, misses and misses per step."""
    walks = [ws_schedule.walk(tuple(t), rows, group) for t in tiles.tolist()]
    free = [(0, s) for s in range(sms)]
    touches = []
    for t, h in _ctas(tiles, kv_heads, ranks):
        start, sm = heapq.heappop(free)
        touches += [(start + i, h * group + st.head, st.seg, st.qt) for i, st in enumerate(walks[t])]
        heapq.heappush(free, (start + len(walks[t]), sm))
    touches.sort()
    cache: OrderedDict = OrderedDict()
    misses = 0
    for _, head, seg, qt in touches:
        key = (head, seg, qt)
        if key in cache:
            cache.move_to_end(key)
            continue
        misses += 1
        cache[key] = None
        if len(cache) > l2_tiles:
            cache.popitem(last=False)
    steps = len(touches)
    return {"steps": steps, "makespan": max(f for f, _ in free), "ideal": steps / sms, "misses": misses,
            "misses_per_step": misses / max(steps, 1)}


def with_dq_waits(rows, tiles, ranks, *, sms: int = SMS, kv_heads: int = KV_HEADS, group: int = GROUP) -> dict:
    """The dQ-wait model (module docstring): makespan, ideal, summed waiting steps, and whether it deadlocks."""
    walks = [ws_schedule.walk(tuple(t), rows, group) for t in tiles.tolist()]
    step_ranks = [[_rank(tuple(t), st, ranks) for st in w] for t, w in zip(tiles.tolist(), walks)]
    ctas = _ctas(tiles, kv_heads, ranks)
    counter: dict = defaultdict(int)
    parked: dict = defaultdict(list)
    events: list = []
    seq = free = 0
    launched, done_at, waited = 0, 0, 0

    def launch(now: int) -> None:
        nonlocal launched, free, seq
        while free and launched < len(ctas):
            free -= 1
            heapq.heappush(events, (now + 1, seq, launched, 0))
            seq += 1
            launched += 1

    free = sms
    launch(0)
    while events:
        now, _, c, i = heapq.heappop(events)
        tile, kv = ctas[c]
        st, r = walks[tile][i], step_ranks[tile][i]
        key = (kv * group + st.head, st.seg, st.qt)
        if counter[key] != r:
            parked[(key, r)].append((c, i, now))
            continue
        counter[key] += 1
        for c2, i2, since in parked.pop((key, r + 1), []):
            waited += now - since
            heapq.heappush(events, (now, seq, c2, i2))
            seq += 1
        if i + 1 < len(walks[tile]):
            heapq.heappush(events, (now + 1, seq, c, i + 1))
            seq += 1
        else:
            free += 1
            done_at = max(done_at, now)
            launch(now)
    steps = sum(len(walks[t]) for t, _ in ctas)
    deadlock = bool(parked) or launched < len(ctas)
    return {"makespan": done_at, "ideal": steps / sms, "waiting_steps": waited, "deadlock": deadlock}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="a,c,two-level,4x8K")
    p.add_argument("--l2-tiles", type=lambda t: [int(x) for x in t.split(",")], default=[L2_TILES, 2 * L2_TILES],
                   help="modelled L2 capacities in 64 KB objects (default: the H100's 50 MB, and twice that)")
    p.add_argument("--out", default=None, help="JSON file (default: print only)")
    p.add_argument("--split-dependents", type=lambda t: [int(x) for x in t.split(",")], default=[],
                   help="also model the shared-split order with each shared-key tile's dependents cut into this many "
                        "CTAs (two-level workloads; :func:`split_dependents`), e.g. 2,4,8")
    p.add_argument("--ws-split", action="store_true",
                   help="also model the split the kernels run (dualkv.cuda.ws_split, auto; :func:`ws_split_table`)")
    args = p.parse_args(argv)
    rows_out = []
    for name in args.workloads.split(","):
        layout = WORKLOADS[name]()
        for order, (rows, tiles, ranks) in schedules(layout).items():
            t0 = time.perf_counter()
            row = {"workload": name, "order": order,
                   **{f"waits_{k}": v for k, v in with_dq_waits(rows, tiles, ranks).items()}}
            for cap in args.l2_tiles:  # the L2 figures move with the modelled capacity: report several
                row[f"l2_{cap}"] = l2_misses(rows, tiles, ranks, l2_tiles=cap)
            row["model_seconds"] = time.perf_counter() - t0
            rows_out.append(row)
            misses = "  ".join(f"{row[f'l2_{cap}']['misses_per_step']:.3f}" for cap in args.l2_tiles)
            print(f"{name:<10} {order:<12} misses/step at {args.l2_tiles} objects: {misses}  makespan with waits "
                  f"{row['waits_makespan']} vs ideal {row['waits_ideal']:.0f}  deadlock {row['waits_deadlock']}",
                  flush=True)
            if order == "shared-split":
                for parts in args.split_dependents:
                    table, split = split_dependents(tiles, ranks.first_tiles, parts)
                    got = with_dq_waits(rows, table, split)
                    rows_out.append({"workload": name, "order": f"shared-split-deps{parts}",
                                     **{f"waits_{k}": v for k, v in got.items()}})
                    print(f"{name:<10} {'  dependents / ' + str(parts):<12} makespan with waits {got['makespan']} vs "
                          f"ideal {got['ideal']:.0f}  deadlock {got['deadlock']}", flush=True)
                if args.ws_split:
                    table, split, parts = ws_split_table(rows, tiles)
                    got = with_dq_waits(rows, table, split)
                    rows_out.append({"workload": name, "order": "shared-split-ws_split", "parts": parts,
                                     **{f"waits_{k}": v for k, v in got.items()}})
                    print(f"{name:<10} {'  ws_split x' + str(parts):<12} makespan with waits {got['makespan']} vs "
                          f"ideal {got['ideal']:.0f}  deadlock {got['deadlock']}", flush=True)
    if args.out:
        record = {"benchmark": "ws_order_model (a CPU model, not a measurement)",
                  "config": {"sms": SMS, "kv_heads": KV_HEADS, "group": GROUP, "l2_tiles": args.l2_tiles},
                  "rows": rows_out}
        Path(args.out).write_text(json.dumps(record, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
