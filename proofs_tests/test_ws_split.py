"""The warp-specialised backward's split shared-key tiles (dualkv/cuda/ws_split.py), checked on the CPU: the split
table keeps every dQ counter's ranks 0..k-1 in CTA launch order, covers each (key block, dependent) pair exactly once,
replays (float64) to the reference gradients, and the plan and launcher carry it; known-wrong splits are caught."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dualkv import GroupLayout
from dualkv.cuda import launch, split_args, ws_schedule, ws_split
from dualkv.cuda.schedule import check_block_order, key_tiles, segments_from_cu_seqlens
from dualkv.cuda.ws_schedule import BLOCK_KEYS, check_dq_order, check_launch_order, cta_order, numeric_backward


def _shared_first(seg, ctx_shared: bool = True):
    """A two-level shared-first launch table and its head-major split."""
    tiles = ws_schedule.launch_order(key_tiles(seg, BLOCK_KEYS, ctx_shared), seg, node_major_tiles=True,
                                     shared_first=True)
    return tiles, ws_schedule.head_major_split(tiles, seg, True)


def _layouts(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        g = rng.randint(1, 3)
        yield GroupLayout.from_lengths([rng.choice([1, 63, 65, 127, 128, 129, 300]) for _ in range(g)],
                                       [[rng.choice([1, 2, 63, 64, 65, 129, 200]) for _ in range(rng.randint(2, 6))]
                                        for _ in range(g)])


@pytest.mark.parametrize("shape, parts", [((1024, 16, 8), 2), ((512, 16, 8), 4), ((256, 8, 8), 8),
                                          ((32768, 16, 8), 1), ((512, 3, 8), 3), ((4096, 16, 8), 1)])
def test_split_parts_fill_the_gpu_once(shape, parts):
    """sms // (shared rows x KV heads), capped at MAX_PARTS and the fewest dependents: (P, N, KV heads) on 132 SMs."""
    prompt, n, kv_heads = shape
    seg = GroupLayout.single(prompt, [2048] * n).segment_table
    tiles, first = _shared_first(seg)
    assert ws_split.split_parts(tiles, first, kv_heads, 132) == parts


def test_split_parts_of_several_groups_and_of_no_dependents():
    seg = GroupLayout.from_lengths([512] * 4, [[4096] * 8] * 4).segment_table  # 16 shared rows x 8 heads fill 132
    assert ws_split.split_parts(*_shared_first(seg), 8, 132) == 1
    seg = GroupLayout.from_lengths([512, 300], [[64] * 8, [64]]).segment_table  # one prompt has a single response
    assert ws_split.split_parts(*_shared_first(seg), 2, 132) == 1
    cu = segments_from_cu_seqlens([0, 100, 300], 0)  # plain causal sequences: no dependents at all
    assert ws_split.split_parts(*_shared_first(cu), 2, 132) == 1


@pytest.mark.parametrize("seed", range(3))
def test_split_tables_keep_the_dq_order_in_cta_order(seed):
    """Every dQ counter still receives ranks 0..k-1 in launch order, in the head-major CTA order of the split table,
    for every number of parts its dependents allow."""
    for layout in _layouts(seed, 12):
        seg = layout.segment_table
        tiles, first = _shared_first(seg)
        fewest = int((tiles[:first, 3] - tiles[:first, 2]).min())
        for parts in range(2, min(fewest, 5) + 1):
            split = ws_split.split_shared_tiles(tiles, seg, first, parts)
            check_block_order(split.tiles)
            check_launch_order(split.tiles, seg, shared_first=True)
            ctas = cta_order(len(split.tiles), 2, split.first_tiles)
            check_dq_order(split.tiles, seg, group=2, shared_first=True, ctas=ctas)
            # the contributions are the unsplit table's, one each: same ranks per counter
            before = ws_schedule.dq_contributors(tiles, seg, 2, shared_first=True)
            after = ws_schedule.dq_contributors(split.tiles, seg, 2, shared_first=True)
            assert before == after


def test_split_cuts_dependents_by_query_rows():
    seg = GroupLayout.single(300, [2000, 10, 10, 10, 1000, 1000]).segment_table
    tiles, first = _shared_first(seg)
    split = ws_split.split_shared_tiles(tiles, seg, first, 3)
    run = split.tiles[:3].tolist()
    # the prompt is segment 0, its responses 1..6: 2000 | 10 + 10 + 10 + 1000 | 1000 rows
    assert [r[2:] for r in run] == [[1, 2], [2, 6], [6, 7]]
    assert run[0][0] == 0 and run[1][0] == run[2][0] == -1
    assert split.partial_rows == split.first_tiles == 3 * first


@pytest.mark.parametrize("layout", [GroupLayout.single(257, [129, 1, 64, 200]),
                                    GroupLayout.from_lengths([130, 65], [[63, 129, 2], [1, 64]])],
                         ids=["one group", "two groups"])
def test_split_walk_replays_to_the_reference_backward(layout):
    """float64 replay of the split table (ws_schedule.numeric_backward sums the rows' dK / dV; the dependent-only rows
    read and write the keys as context rows, which here are the prompt's own rows) equals the reference backward."""
    from dualkv.reference import shared_prefix_attention

    torch.manual_seed(0)
    t, h, hk, d = layout.total_tokens, 4, 2, 16
    q = torch.randn(t, h, d, dtype=torch.float64)
    k, v = (torch.randn(t, hk, d, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(t, h, d, dtype=torch.float64)
    seg = layout.segment_table
    tiles, first = _shared_first(seg)
    split = ws_split.split_shared_tiles(tiles, seg, first, 2)
    dq, dk_ctx, dv_ctx, dk_own, dv_own = numeric_backward(q, k, v, k, v, dout, seg, split.tiles, d ** -0.5)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = torch.autograd.grad(shared_prefix_attention(*leaves, layout), leaves, dout)
    for got, want in zip((dq, dk_own + dk_ctx, dv_own + dv_ctx), ref):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert dk_ctx.abs().sum() > 0  # the dependent-only rows did contribute


def test_split_of_the_paper_api_context_tiles():
    """Call 2's separate context: its tiles (own_seg -1) split the same way, every part a context row."""
    seg = segments_from_cu_seqlens([0, 70, 71, 200, 300], 200)
    tiles, first = _shared_first(seg, ctx_shared=False)
    split = ws_split.split_shared_tiles(tiles, seg, first, 2)
    assert (split.tiles[:split.partial_rows, 0] == -1).all()
    check_dq_order(split.tiles, seg, group=2, shared_first=True, ctas=cta_order(len(split.tiles), 2, split.first_tiles))


def _good_split():
    seg = GroupLayout.single(300, [64, 65, 129, 1]).segment_table
    tiles, first = _shared_first(seg)
    return seg, tiles, ws_split.split_shared_tiles(tiles, seg, first, 2)


@pytest.mark.parametrize("breakage", ["two own walks", "overlap", "gap", "other keys", "tail changed", "ragged runs"])
def test_known_wrong_splits_are_caught(breakage):
    seg, tiles, split = _good_split()
    table = split.tiles.copy()
    partial = split.partial_rows
    if breakage == "two own walks":
        table[1, 0] = table[0, 0]
    elif breakage == "overlap":
        table[1, 2] -= 1
    elif breakage == "gap":
        table[0, 3] -= 1
    elif breakage == "other keys":
        table[1, 1] += 1
    elif breakage == "tail changed":
        table[-1, 3] += 1
    else:
        partial -= 1
    bad = ws_split.WsSplit(table, split.first_tiles, split.parts, partial)
    with pytest.raises(RuntimeError, match="split"):
        ws_split.check_split(bad, tiles, seg)


def test_too_few_dependents_raise():
    seg, tiles, _ = _good_split()
    first = ws_schedule.head_major_split(tiles, seg, True)
    with pytest.raises(ValueError, match="too few"):
        ws_split.split_shared_tiles(tiles, seg, first, 5)


def test_plan_carries_the_split(monkeypatch):
    """make_plan splits where kv_heads is known (sms given: no GPU here), as WS_SPLIT says, and the launcher derives
    the kernel's (table, first_tiles, parts, partial rows) from what the ops hand it."""
    monkeypatch.setattr(launch, "TWO_LEVEL_SHARED_FIRST", True)
    seg = GroupLayout.single(300, [64, 65, 129, 1, 70]).segment_table
    args = dict(head_dim=128, group_size=2, window_left=-1, device=torch.device("cpu"), ctx_shared=True,
                fwd_kernel="fwd")
    monkeypatch.setattr(launch, "WS_SPLIT", "auto")
    assert launch.make_plan(seg, **args).split_key_tiles is None  # kv_heads unknown: no split
    plan = launch.make_plan(seg, **args, kv_heads=2, sms=132)
    assert plan.split_parts == 5 and plan.ws_first_tiles == 3  # every shared-key row split: 3 runs of 5
    keys, ws_tiles = plan.key_tiles.numpy(), plan.split_key_tiles.numpy()
    ws_split.check_split(ws_split.WsSplit(ws_tiles, plan.ws_first_tiles + len(ws_tiles) - len(keys), 5,
                                          3 * 5), keys, seg)
    table, first, parts, partial = split_args.split_args(plan.key_tiles, plan.split_key_tiles, plan.split_parts,
                                                         plan.ws_first_tiles)
    assert table is plan.split_key_tiles and (first, parts, partial) == (plan.ws_first_tiles + 12, 5, 15)
    assert split_args.split_args(plan.key_tiles, None, 1, 3) == (plan.key_tiles, 3, 1, 0)
    with pytest.raises(ValueError, match="no 6-part split"):  # 12 rows added are no whole runs of 6
        split_args.split_args(plan.key_tiles, plan.split_key_tiles, 6, plan.ws_first_tiles)
    with pytest.raises(ValueError, match="no 2-part split"):  # 12 runs of 2 would be more runs than shared rows
        split_args.split_args(plan.key_tiles, plan.split_key_tiles, 2, plan.ws_first_tiles)
    with pytest.raises(ValueError, match="head-major split"):
        split_args.split_args(plan.key_tiles, plan.split_key_tiles, 5, None)
    monkeypatch.setattr(launch, "WS_SPLIT", "3")
    assert launch.make_plan(seg, **args, kv_heads=2, sms=132).split_parts == 3
    monkeypatch.setattr(launch, "WS_SPLIT", "8")  # at most the fewest dependents of a shared-key row (5 here)
    assert launch.make_plan(seg, **args, kv_heads=2, sms=132).split_parts == 5
    monkeypatch.setattr(launch, "WS_SPLIT", "off")
    assert launch.make_plan(seg, **args, kv_heads=2, sms=132).split_key_tiles is None
    monkeypatch.setattr(launch, "WS_SPLIT", "auto")
    monkeypatch.setattr(launch, "TWO_LEVEL_SHARED_FIRST", False)  # the own-first order: shared rows are not first
    assert launch.make_plan(seg, **args, kv_heads=2, sms=132).split_key_tiles is None


def test_kernels_and_launcher_agree_on_the_part_slots():
    """Each kernel's per-CTA slot (kPartFloats) is what the launcher allocates (split_args.part_slot_floats), and both
    kernels take the four split arguments last."""
    import re

    from dualkv.cuda.build import CSRC
    from dualkv.cuda.configs import dkdv_spec, ws_bwd_spec

    ws = (CSRC / "bwd_sm90_ws.cu").read_text()
    assert "constexpr int kPartArrays = DKV_WIDE ? 1 : 2;" in ws
    assert "constexpr long long kPartFloats = (long long)kPartArrays * (kHeadDimAcc / 8) * 4 * kConsumerThreads;" in ws
    assert re.search(r"constexpr int kConsumerThreads = (\d+);", ws).group(1) == str(split_args.WS_CONSUMER_THREADS)
    assert re.search(r"float scale, float\* __restrict__ part_acc,\s+int\* __restrict__ part_sems, int parts, "
                     r"int partial_rows\)", ws)
    mma = (CSRC / "bwd_dkdv.cu").read_text()
    assert "constexpr long long kPartFloats = 2LL * kKeySlabs * (kCols / 8) * 4 * kThreads;" in mma
    assert re.search(r"constexpr int kCols = kHeadDim / kDSplit / kQWarps;", mma)
    assert re.search(r"int window_left,\s+\\\s+float\* __restrict__ part_acc, int\* __restrict__ part_sems, int parts, "
                     r"int partial_rows", (CSRC / "kernel_params.cuh").read_text())
    for head_dim, floats in ((64, 2 * 8 * 4 * 256), (96, 2 * 16 * 4 * 256), (128, 2 * 16 * 4 * 256),
                             (192, 24 * 4 * 256), (256, 32 * 4 * 256)):
        spec = ws_bwd_spec(head_dim, torch.bfloat16)
        assert split_args.part_slot_floats(spec) == floats, head_dim
        args, buffers = split_args.part_buffers(spec, (2, 4), 3, torch.device("cpu"))
        assert buffers[0].numel() == 4 * 3 * floats and buffers[1].numel() == 2 * 3, head_dim
        assert (buffers[1] == 0).all()
    for head_dim in (64, 96, 128):  # the ordered mma.sync kernel: every thread's dK and dV, head_dim / dsplit columns
        for arch in ("sm_80", "sm_90"):
            spec = dkdv_spec(head_dim, torch.bfloat16, False, arch, causal=True, dq_ordered=True)
            # 2 arrays x qwarps slabs x (head_dim / dsplit / qwarps) / 8 x 4 floats x threads
            assert split_args.part_slot_floats(spec) == 2 * (head_dim // spec.tile.dsplit) * spec.tile.warps * 32 // 2
    assert split_args.part_buffers(ws_bwd_spec(128, torch.bfloat16), (1, 0), 3, "cpu")[1] == ()


def test_split_tables_keep_the_mma_ordered_dq_order():
    """The mma.sync ordered mode runs the same split table at its own geometry, tile-major (a row's KV heads
    adjacent, its default) or head-major: every counter still receives ranks 0..k-1 in launch order."""
    from dualkv.cuda.ws_schedule import mma_geometry

    for layout in _layouts(5, 8):
        seg = layout.segment_table
        geo = mma_geometry(128)
        tiles = ws_schedule.launch_order(key_tiles(seg, geo.block_keys, True), seg, node_major_tiles=True,
                                         shared_first=True)
        first = ws_schedule.head_major_split(tiles, seg, True)
        fewest = int((tiles[:first, 3] - tiles[:first, 2]).min())
        if fewest < 2:
            continue
        split = ws_split.split_shared_tiles(tiles, seg, first, 2)
        for head_major in (False, True):
            ctas = cta_order(len(split.tiles), 2, split.first_tiles, head_major)
            check_dq_order(split.tiles, seg, group=2, geo=geo, shared_first=True, ctas=ctas)
