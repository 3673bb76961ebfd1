"""The warp-specialised Hopper backward's walk, launch order and deterministic dQ order (dualkv/cuda/ws_schedule.py,
the Python statement of csrc/bwd_sm90_ws.cu), checked on the CPU: every dQ counter receives ranks 0..k-1 in launch
order (or the kernel would deadlock), and replaying the walk in float64 reproduces the reference gradients exactly."""

import random

import numpy as np
import pytest
import torch

from dualkv import GroupLayout
from dualkv.cuda.schedule import check_block_order, key_tiles, segments_from_cu_seqlens
from dualkv.cuda.ws_schedule import (BLOCK_KEYS, check_dq_order, check_launch_order, launch_order, numeric_backward,
                                     walk, walk_length)


def _layouts(seed, count):
    rng = random.Random(seed)
    for _ in range(count):
        g = rng.randint(1, 3)
        yield GroupLayout.from_lengths([rng.choice([1, 63, 64, 65, 127, 128, 129, 300]) for _ in range(g)],
                                       [[rng.choice([1, 2, 63, 64, 65, 129, 200]) for _ in range(rng.randint(1, 4))]
                                        for _ in range(g)])


@pytest.mark.parametrize("seed", range(4))
def test_dq_counters_receive_blocks_in_order(seed):
    for layout in _layouts(seed, 25):
        seg = layout.segment_table
        tiles = launch_order(key_tiles(seg, BLOCK_KEYS, True), seg)
        check_block_order(tiles)
        check_launch_order(tiles, seg)
        check_dq_order(tiles, seg, group=2)
    rng = random.Random(seed)
    for _ in range(25):  # the paper's call 2: a separate context tensor
        cu = np.cumsum([0] + [rng.randint(1, 300) for _ in range(rng.randint(1, 4))]).tolist()
        seg = segments_from_cu_seqlens(cu, rng.randint(1, 400))
        tiles = launch_order(key_tiles(seg, BLOCK_KEYS, False), seg)
        check_block_order(tiles)
        check_launch_order(tiles, seg)
        check_dq_order(tiles, seg)


@pytest.mark.parametrize("seed", range(2))
def test_consumers_loop_count_equals_the_walk(seed):
    """The consumers loop walk_steps() times and take each step's geometry from the producer's stage record: the
    closed form must count exactly the walk's steps, or the kernel hangs (too many) or drops steps (too few)."""
    for layout in _layouts(seed, 25):
        seg = layout.segment_table
        for group in (1, 4):
            for tile in key_tiles(seg, BLOCK_KEYS, True).tolist():
                assert walk_length(tile, seg, group) == len(walk(tile, seg, group)), tile


def test_out_of_order_tables_are_caught():
    seg = GroupLayout.single(300, [129, 5]).segment_table
    heaviest_first = key_tiles(seg, BLOCK_KEYS, True)
    tiles = launch_order(heaviest_first, seg)
    with pytest.raises(RuntimeError, match="block order"):
        check_block_order(tiles[::-1])
    with pytest.raises(RuntimeError, match="not 0..k-1"):
        check_dq_order(tiles[::-1], seg)
    with pytest.raises(RuntimeError, match="not 0..k-1"):  # a block missing from a run
        check_dq_order(np.delete(tiles, 0, axis=0), seg)
    # the shared prompt's tiles ahead of the responses' own tiles: the ranks would arrive out of order
    with pytest.raises(RuntimeError, match="after a shared-key tile"):
        check_launch_order(heaviest_first, seg)
    with pytest.raises(RuntimeError, match="not 0..k-1"):
        check_dq_order(heaviest_first, seg)


def test_plans_carry_the_launch_order():
    from dualkv.cuda.launch import make_plan

    seg = GroupLayout.from_lengths([200, 70], [[129, 5], [64, 1, 300]]).segment_table
    plan = make_plan(seg, head_dim=128, group_size=2, window_left=-1, device=torch.device("cpu"), ctx_shared=True,
                     fwd_kernel="fwd")  # a named kernel: no GPU needed to pick one
    tiles = plan.key_tiles.numpy()
    check_launch_order(tiles, seg)
    check_dq_order(tiles, seg, group=2)


def _reference_grads(q, k, v, dout, layout):
    from dualkv.reference import shared_prefix_attention

    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = shared_prefix_attention(q, k, v, layout)
    return torch.autograd.grad(out, (q, k, v), dout)


@pytest.mark.parametrize("layout", list(_layouts(7, 4)) + [GroupLayout.single(257, [129, 1, 64])],
                         ids=lambda l: repr(l))
def test_walk_replay_equals_reference_backward(layout):
    torch.manual_seed(0)
    t, h, hk, d = layout.total_tokens, 4, 2, 16
    q = torch.randn(t, h, d, dtype=torch.float64)
    k, v = (torch.randn(t, hk, d, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(t, h, d, dtype=torch.float64)
    seg = layout.segment_table
    dq, _, _, dk, dv = numeric_backward(q, k, v, k, v, dout, seg, launch_order(key_tiles(seg, BLOCK_KEYS, True), seg),
                                        d ** -0.5)
    ref = _reference_grads(q, k, v, dout, layout)
    for got, want in zip((dq, dk, dv), ref):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_walk_replay_paper_api_context_tiles():
    """A separate context tensor: context tiles (class 0) and each sequence's own tiles (class 1)."""
    from dualkv.reference import flash_attn_dualkv_varlen_func

    torch.manual_seed(1)
    p, lens, h, hk, d = 200, [70, 1, 129], 4, 1, 16
    cu = np.cumsum([0] + lens).tolist()
    seg = segments_from_cu_seqlens(cu, p)
    t = cu[-1]
    q = torch.randn(t, h, d, dtype=torch.float64)
    kd, vd = (torch.randn(t, hk, d, dtype=torch.float64) for _ in range(2))
    kc, vc = (torch.randn(p, hk, d, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(t, h, d, dtype=torch.float64)
    got = numeric_backward(q, kc, vc, kd, vd, dout, seg, key_tiles(seg, BLOCK_KEYS, False), d ** -0.5)
    leaves = [x.clone().requires_grad_() for x in (q, kc, vc, kd, vd)]
    cu_t = torch.tensor(cu, dtype=torch.int32)
    out = flash_attn_dualkv_varlen_func(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], cu_t, cu_t,
                                        max(lens), p, max(lens))
    ref = torch.autograd.grad(out, leaves, dout)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
