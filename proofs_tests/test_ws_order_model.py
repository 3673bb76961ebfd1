"""experiments/ws_order_model.py (the CPU model behind the root-first tree dQ order) on small trees: both tree
orders finish without deadlock at their own ranks, a launch order that contradicts the ranks is reported as a
deadlock (not hidden), and on a multi-turn tree the root-first order shortens the makespan with waits."""

import sys
from pathlib import Path

import numpy as np

from dualkv import PrefixTreeLayout
from dualkv.cuda import ws_schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from ws_order_model import l2_misses, schedules, with_dq_waits  # noqa: E402

# 3 turns of 512 shared by 8 branches of 512: the multi-turn workload, scaled down
TURNS = PrefixTreeLayout([512, 512, 512] + [512] * 8, [-1, 0, 1] + [2] * 8)


def test_both_orders_finish_and_root_first_wins_on_a_multi_turn_tree():
    orders = schedules(TURNS)
    assert set(orders) == {"nearest", "nearest-node", "root"}
    got = {name: with_dq_waits(rows, tiles, ranks, sms=16, kv_heads=2) for name, (rows, tiles, ranks) in orders.items()}
    assert not got["nearest"]["deadlock"] and not got["root"]["deadlock"]
    assert got["root"]["makespan"] < got["nearest"]["makespan"], got


def test_a_launch_order_against_the_ranks_is_reported_as_a_deadlock():
    rows, root_launch, _ = schedules(TURNS)["root"]
    nearest_ranks = ws_schedule.TreeRanks.of(TURNS)
    # with few SMs the first CTAs (the root's) wait for ranks only CTAs launched after them can add, on every SM
    assert with_dq_waits(rows, root_launch, nearest_ranks, sms=4, kv_heads=1)["deadlock"]
    assert not with_dq_waits(rows, root_launch, ws_schedule.TreeRanks.of(TURNS, True), sms=4, kv_heads=1)["deadlock"]


def test_the_model_counts_every_step_once():
    rows, tiles, _ = schedules(TURNS)["nearest"]
    steps = sum(len(ws_schedule.walk(tuple(t), rows, 4)) for t in tiles.tolist()) * 2
    got = l2_misses(rows, tiles, sms=16, kv_heads=2)
    assert got["steps"] == steps and got["ideal"] == steps / 16
    assert got["makespan"] >= np.ceil(steps / 16)


def test_the_split_order_and_split_dependents_finish_and_shorten_a_short_prompt_batch():
    """Two-level, short prompt and long responses (scaled down): the shared-split head-major order finishes without
    deadlock and beats the own-first head-major one; cutting each shared-key tile's dependents into CTAs keeps the
    dQ order (no deadlock) and shortens the makespan further; the cut table covers every (block, dependent) once."""
    from dualkv import GroupLayout
    from ws_order_model import split_dependents

    layout = GroupLayout.single(256, [1024] * 8)
    orders = schedules(layout)
    got = {name: with_dq_waits(rows, tiles, ranks, sms=16, kv_heads=2)
           for name, (rows, tiles, ranks) in orders.items() if name in ("node-head", "shared-split")}
    assert not any(g["deadlock"] for g in got.values())
    assert got["shared-split"]["makespan"] < got["node-head"]["makespan"], got
    rows, tiles, split = orders["shared-split"]
    table, cut = split_dependents(tiles, split.first_tiles, 4)
    pairs = sorted((blk, dep) for _, blk, b, e in table[:cut.first_tiles].tolist() for dep in range(b, e))
    assert pairs == sorted((blk, dep) for _, blk, b, e in tiles[:split.first_tiles].tolist() for dep in range(b, e))
    with_cut = with_dq_waits(rows, table, cut, sms=16, kv_heads=2)
    assert not with_cut["deadlock"] and with_cut["makespan"] < got["shared-split"]["makespan"], with_cut


def test_the_kernels_split_table_finishes_and_shortens_a_short_prompt_batch():
    """The split the kernels run (ws_split at the model's SMS / KV_HEADS, auto) on a short-prompt batch: no deadlock,
    a shorter makespan than the unsplit shared-split order (the kernels measured 19-48% faster at such shapes)."""
    from dualkv import GroupLayout
    from ws_order_model import ws_split_table

    rows, tiles, ranks = schedules(GroupLayout.single(1024, [2048] * 4))["shared-split"]
    table, split, parts = ws_split_table(rows, tiles)
    assert parts == 2 and len(table) == len(tiles) + split.first_tiles // 2
    before, after = with_dq_waits(rows, tiles, ranks), with_dq_waits(rows, table, split)
    assert not after["deadlock"] and after["makespan"] < before["makespan"], (before, after)
