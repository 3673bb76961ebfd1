"""The plans' two key-tile orders: ``key_tiles`` in the warp-specialised backward's launch order (its dQ ranks need
it) and ``dkdv_key_tiles``, the same tiles heaviest first, for the dK/dV kernels whose dQ needs no order. On a
prefix tree the nearest-first launch order (``DUALKV_TREE_DQ_ORDER=nearest``; the default before the root-first
order) puts every root tile last although a root's keys are seen by every descendant, so the heaviest CTAs would
start last; a greedy model of the GPU's block scheduler (132 SMs, one CTA each) shows what that
costs on a grid that dispatches a tile's KV heads together, and that the dK/dV kernels' (tiles, KV heads) grid keeps
most of the cost whatever the table's order (the heads would have to be folded into blockIdx.x)."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
import torch

from dualkv import GroupLayout, PrefixTreeLayout
from dualkv.analysis.trees import multi_turn_workload
from dualkv.cuda.configs import DKDV_TILES
from dualkv.cuda.launch import make_plan
from dualkv.cuda.schedule import check_block_order
from dualkv.cuda.tree_schedule import preorder_permutation, tree_rows

CPU = torch.device("cpu")
BLOCK_KEYS = DKDV_TILES[128].block_keys


def _rows(tiles: torch.Tensor) -> list[tuple[int, ...]]:
    return [tuple(r) for r in tiles.numpy().tolist()]


def _tree_work(layout: PrefixTreeLayout, tiles: np.ndarray) -> list[int]:
    """Query rows a key tile's walk visits: its dependents' (descendants') rows plus its own causal rows."""
    lens = np.asarray(layout.node_lens)
    cum = np.concatenate([[0], np.cumsum(lens)])
    return [int(cum[end] - cum[begin] + lens[node] - blk * BLOCK_KEYS) for node, blk, begin, end in tiles.tolist()]


def _makespan(works: list[int], sms: int = 132) -> float:
    """Greedy list scheduling in table order (a CTA starts on the first SM to free up): the last SM's finish."""
    free = [0.0] * sms
    for w in works:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


@pytest.mark.parametrize("lengths", [([200, 70], [[129, 5], [64, 1, 300]]), ([1000], [[2048] * 4])])
def test_group_plans_carry_both_orders_of_the_same_tiles(lengths):
    seg = GroupLayout.from_lengths(*lengths).segment_table
    plan = make_plan(seg, head_dim=128, group_size=2, window_left=-1, device=CPU, ctx_shared=True, fwd_kernel="fwd")
    ws, heavy = _rows(plan.key_tiles), _rows(plan.dkdv_key_tiles)
    assert sorted(ws) == sorted(heavy)
    check_block_order(plan.dkdv_key_tiles.numpy())
    q_len = np.asarray(seg).reshape(-1, 4)[:, 1]
    # rows each tile visits: its own causal rows and its dependents'
    work = [int(q_len[own] - blk * BLOCK_KEYS + q_len[begin:end].sum()) for own, blk, begin, end in heavy]
    assert work == sorted(work, reverse=True)


def test_tree_plans_run_the_root_tiles_first_for_the_dkdv_kernels(monkeypatch):
    """Under the nearest-first tree dQ order (DUALKV_TREE_DQ_ORDER=nearest), whose launch order puts the root last."""
    from dualkv.cuda import launch

    monkeypatch.setattr(launch, "TREE_DQ_ROOT_FIRST", False)
    layout, _ = preorder_permutation(multi_turn_workload())
    plan = launch.make_tree_plan(layout, head_dim=128, group_size=4, device=CPU, fwd_kernel="fwd")
    ws, heavy = plan.key_tiles.numpy(), plan.dkdv_key_tiles.numpy()
    assert sorted(_rows(plan.key_tiles)) == sorted(_rows(plan.dkdv_key_tiles))
    check_block_order(heavy)
    depth = np.asarray(layout.depths)
    assert depth[ws[-1, 0]] == 0 and depth[heavy[0, 0]] == 0   # the root: last in one, first in the other
    work_ws, work_heavy = _tree_work(layout, ws), _tree_work(layout, heavy)
    assert work_heavy == sorted(work_heavy, reverse=True)
    ideal = sum(work_ws) * 8 / 132
    # CTAs in dispatch order (blockIdx.x fastest), 8 KV heads: a head-fastest grid (the ws kernel's) ...
    late, early = (_makespan([x for x in w for _ in range(8)]) / ideal for w in (work_ws, work_heavy))
    assert late > 1.25 and early < 1.15 and late / early > 1.15, (late, early)
    # ... and the dK/dV kernels' grid (tiles, KV heads): each head's whole table in turn, where the order gains little
    late, early = (_makespan(w * 8) / ideal for w in (work_ws, work_heavy))
    assert early <= late, (late, early)
    assert tree_rows(plan.segments.numpy(), layout.num_nodes).shape[0] == layout.num_nodes


def test_root_first_tree_plans_start_with_the_root_in_both_orders(monkeypatch):
    """The default root-first order launches the root's tiles first in the warp-specialised order too, so the model's
    makespan of the head-fastest grid is close to the heaviest-first table's."""
    from dualkv.cuda import launch

    monkeypatch.setattr(launch, "TREE_DQ_ROOT_FIRST", True)
    layout, _ = preorder_permutation(multi_turn_workload())
    plan = launch.make_tree_plan(layout, head_dim=128, group_size=4, device=CPU, fwd_kernel="fwd")
    ws, heavy = plan.key_tiles.numpy(), plan.dkdv_key_tiles.numpy()
    depth = np.asarray(layout.depths)
    assert depth[ws[0, 0]] == 0 and depth[heavy[0, 0]] == 0
    assert np.all(np.diff(depth[ws[:, 0]]) >= 0)  # shallower nodes first
    work_ws, work_heavy = _tree_work(layout, ws), _tree_work(layout, heavy)
    ideal = sum(work_ws) * 8 / 132
    root_first, heaviest = (_makespan([x for x in w for _ in range(8)]) / ideal for w in (work_ws, work_heavy))
    assert root_first < 1.25 and root_first <= 1.1 * heaviest, (root_first, heaviest)


def test_kernel_ready_copies_what_the_kernels_cannot_read():
    """A view at a misaligned offset and a (T, 1, d) tensor whose size-1 head axis has stride 1 both count as
    contiguous to torch (``contiguous()`` returns them unchanged); kernel_ready must hand the kernels a fresh,
    aligned copy of each, and pass aligned tensors through untouched."""
    from dualkv.cuda.launch import kernel_ready

    flat = torch.randn(1 + 6 * 2 * 64, dtype=torch.bfloat16)
    misaligned = flat[1:].view(6, 2, 64)
    one_head = torch.randn(6, 64, 1, dtype=torch.bfloat16).transpose(1, 2)
    assert misaligned.is_contiguous() and one_head.is_contiguous()
    for t in (misaligned, one_head):
        ready = kernel_ready(t)
        assert ready.data_ptr() != t.data_ptr() and torch.equal(ready, t)
        assert ready.data_ptr() % 16 == 0 and ready.stride() == (t.shape[1] * 64, 64, 1)
    aligned = torch.randn(6, 2, 64, dtype=torch.bfloat16)
    assert kernel_ready(aligned) is aligned
