"""The warp-specialised backward's CTA-pair dQ adds (``ws_dq_add("pair")``, DKV_DQ_PAIRS=1): clusters of two CTAs on
key blocks 2p, 2p + 1 of one run, the upper CTA's dQ_step copied into the lower one's smem and ONE fp32 reduce-add
per pair. CPU: the paired table (dualkv/cuda/ws_schedule.py's pair_tiles), the pair ranks the kernel uses, the walk
prefix the kernel relies on, and known-wrong variants caught; the build (no serialized wgmma, clusters only in the pair
build). GPU (sm_90): FlashAttention's bounds against the float64 oracle in both modes, both CTA orders, the paper's
two calls, bitwise stable run to run, and the pair build launched."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from dualkv import GroupLayout
from dualkv.cuda import ws_schedule
from dualkv.cuda.schedule import check_block_order, key_tiles, segments_from_cu_seqlens
from dualkv.cuda.ws_schedule import (BLOCK_KEYS, NULL_TILE, check_dq_order, check_launch_order, check_pairs,
                                     launch_order, pair_tiles, walk)

LENGTHS = (1, 63, 64, 65, 127, 128, 129, 255, 257, 300, 513, 700)


def _paired(seg, ctx_shared=True):
    return pair_tiles(launch_order(key_tiles(seg, BLOCK_KEYS, ctx_shared), seg, node_major_tiles=True))


def _layouts(seed, count):
    rng = random.Random(seed)
    for _ in range(count):
        groups = rng.randint(1, 3)
        yield GroupLayout.from_lengths([rng.choice(LENGTHS) for _ in range(groups)],
                                       [[rng.choice(LENGTHS) for _ in range(rng.randint(1, 4))]
                                        for _ in range(groups)])


@pytest.mark.parametrize("seed", range(4))
def test_pair_counters_receive_ranks_in_order(seed):
    """Every counter receives ranks 0..k-1 from the lower tiles of the pairs, in launch order; the upper tile's walk
    is a prefix of the lower one's; the table stays in block order and own-response tiles first (nulls skipped)."""
    for layout in _layouts(seed, 25):
        seg = layout.segment_table
        tiles = _paired(seg)
        assert len(tiles) % 2 == 0
        check_block_order(tiles)
        check_launch_order(tiles, seg)
        check_pairs(tiles, seg, group=2)
        check_dq_order(tiles, seg, group=2, pairs=True)
    rng = random.Random(seed)
    for _ in range(25):  # the paper's call 2: a separate context (own_seg -1 tiles) paired too
        cu = np.cumsum([0] + [rng.choice(LENGTHS) for _ in range(rng.randint(1, 4))]).tolist()
        seg = segments_from_cu_seqlens(cu, rng.choice(LENGTHS))
        tiles = _paired(seg, ctx_shared=False)
        check_block_order(tiles)
        check_dq_order(tiles, seg, pairs=True)


def test_pair_table_layout():
    """Runs start at even rows; an odd run gets a null partner; every real tile appears exactly once."""
    seg = GroupLayout.from_lengths([300], [[129, 1, 257]]).segment_table  # 3 prompt blocks, own blocks 2, 1, 3
    plain = launch_order(key_tiles(seg, BLOCK_KEYS, True), seg, node_major_tiles=True)
    tiles = pair_tiles(plain)
    real = [t for t in tiles.tolist() if not ws_schedule.is_null(t)]
    assert sorted(real) == sorted(plain.tolist())
    assert [tuple(t) for t in tiles.tolist()].count(NULL_TILE) == 3  # three odd runs: one own run and the prompt
    for j in range(0, len(tiles), 2):
        assert tiles[j][1] % 2 == 0 and not ws_schedule.is_null(tiles[j])


def test_pair_ranks_are_those_of_256_key_blocks():
    """Pair p ranks like one 256-key block: own steps p, a dependent's steps (its own pairs reaching the tile) + p."""
    seg = GroupLayout.from_lengths([600], [[700]]).segment_table
    tiles = _paired(seg)
    ranks = ws_schedule.dq_contributors(tiles, seg, 1, pairs=True)
    # the response's query tile 9 (rows 576..639) sees its own blocks 0..4 (pairs 0, 1, 2: ranks 0, 1, 2), then the
    # 600-token prompt's blocks 0..4 (pairs 0, 1, 2: ranks 3, 4, 5)
    assert ranks[(1, 9, 0)] == [0, 1, 2, 3, 4, 5]
    # the prompt's own query tile 4 (rows 256..319) sees blocks 0..2: pairs 0, 1
    assert ranks[(0, 4, 0)] == [0, 1]
    lower = [t for t in tiles.tolist()[::2]]
    assert all(t[1] % 2 == 0 for t in lower)


def test_known_wrong_pairings_are_caught(monkeypatch):
    seg = GroupLayout.from_lengths([700], [[300, 129]]).segment_table
    tiles = _paired(seg)
    swapped = tiles.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # upper block below the lower one: the lower's walk is the shorter
    with pytest.raises(RuntimeError, match="not blocks b, b \\+ 1|null"):
        check_pairs(swapped, seg)
    with pytest.raises(RuntimeError, match="even number"):
        check_pairs(tiles[:-1], seg)
    shifted = np.concatenate([[NULL_TILE, NULL_TILE], tiles[1:], [NULL_TILE]]).astype(np.int32)
    with pytest.raises(RuntimeError):  # every pair off by one row: a null lower tile / blocks of two runs
        check_pairs(shifted, seg)
    unpaired = launch_order(key_tiles(seg, BLOCK_KEYS, True), seg, node_major_tiles=True)
    with pytest.raises(RuntimeError, match="not 0..k-1|not blocks|even number|null"):
        check_dq_order(unpaired, seg, pairs=True)  # pair ranks on an unpaired table
    with pytest.raises(RuntimeError, match="not 0..k-1"):  # per-block ranks with pairs: a counter skips ranks
        monkeypatch.setattr(ws_schedule, "rank", lambda tile, st, tree=None, shared_first=False, pairs=False:
                            tile[1] + (0 if st.own else st.reach))
        check_dq_order(tiles, seg, pairs=True)


def test_pair_table_needs_adjacent_runs():
    seg = GroupLayout.from_lengths([300, 300], [[129], [65]]).segment_table
    heaviest = launch_order(key_tiles(seg, BLOCK_KEYS, True), seg)  # interleaves the two prompts' blocks
    with pytest.raises(RuntimeError, match="adjacent|block order"):
        pair_tiles(heaviest)


def test_upper_walk_is_a_prefix_of_the_lower_walk():
    seg = GroupLayout.from_lengths([513], [[1, 700]]).segment_table
    tiles = _paired(seg)
    for j in range(0, len(tiles), 2):
        lo, hi = tiles[j].tolist(), tiles[j + 1].tolist()
        lo_walk, hi_walk = walk(lo, seg, 2), walk(hi, seg, 2)
        assert lo_walk[:len(hi_walk)] == hi_walk
        if not ws_schedule.is_null(hi) and hi[0] >= 0:  # the lower walks two more query tiles (per head)
            assert len(lo_walk) - len(hi_walk) in (0, 2 * 2, 1 * 2)


def test_plans_are_paired_only_when_asked():
    from dualkv.cuda import launch

    seg = GroupLayout.from_lengths([300], [[129, 5]]).segment_table
    kwargs = dict(head_dim=128, group_size=2, window_left=-1, device=torch.device("cpu"), ctx_shared=True,
                  fwd_kernel="fwd")
    plain = launch.make_plan(seg, **kwargs)  # a CPU device: never paired by default
    assert plain.key_tiles.shape[1] == 4
    paired = launch.make_plan(seg, ws_pairs=True, **kwargs)
    assert paired.key_tiles.shape[1] == 8
    check_dq_order(paired.key_tiles.reshape(-1, 4).numpy(), seg, group=2, pairs=True)


def test_pair_build_compiles_with_clusters_and_no_serialized_wgmma(monkeypatch):
    from dualkv.cuda.build import compile_spec, resource_usage
    from dualkv.cuda.configs import SM90_WS_BWD_TILES, KernelSpec, ws_bwd_spec

    monkeypatch.delenv("DUALKV_EXTRA_DEFINES", raising=False)
    for head_dim in (64, 96, 128):
        spec = ws_bwd_spec(head_dim, torch.bfloat16, dq_pairs=True)
        assert ("DKV_DQ_PAIRS", "1") in spec.defines()
        # the peer buffer (64 rows of head_dim fp32), two mbarriers and the ticket; within the 227 KB a CTA may have
        assert spec.smem_bytes == ws_bwd_spec(head_dim, torch.bfloat16).smem_bytes + 64 * head_dim * 4 + 32
        assert spec.smem_bytes <= 227 * 1024
        usage = resource_usage(compile_spec(spec, use_cache=False, verbose=True).log)
        assert not usage["wgmma_serialized"], usage
    with pytest.raises(ValueError, match="CTA-pair"):
        ws_bwd_spec(128, torch.bfloat16, tree=True, dq_pairs=True)
    with pytest.raises(ValueError, match="CTA-pair"):
        KernelSpec("bwd_sm90_ws", 128, "bf16", replace(SM90_WS_BWD_TILES[128], dq_buffers=2), 1, False, "sm_90a",
                   dq_pairs=True)


def test_ws_dq_add_setting(monkeypatch):
    from dualkv.cuda import configs

    monkeypatch.setenv("DUALKV_WS_DQ_ADD", "pair")
    assert configs._ws_dq_add_from_env() == "pair"
    monkeypatch.setenv("DUALKV_WS_DQ_ADD", "pairs")
    with pytest.raises(ValueError, match="DUALKV_WS_DQ_ADD must be one of"):
        configs._ws_dq_add_from_env()
    before = configs.current_ws_dq_add()
    other = "cta" if before == "pair" else "pair"
    with configs.ws_dq_add(other):
        assert configs.current_ws_dq_add() == other
    assert configs.current_ws_dq_add() == before
    with pytest.raises(ValueError, match="warp-specialised dQ add"):
        configs.ws_dq_add("both")


# ---------------------------------------------------------------------------------------------------------- GPU

AWKWARD = (1, 63, 64, 65, 127, 129, 257, 1000)


@pytest.fixture
def hopper():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialised backward is built for sm_90 (H100/H200)")


def _cases():
    from dualkv.verify.cases import random_cases

    return [c for c in random_cases(14, 11, prompt_lens=AWKWARD, response_lens=AWKWARD[:7],
                                    group_sizes=(1, 2, 3, 5, 9)) if c.window == (-1, -1)]


@pytest.mark.gpu
@pytest.mark.usefixtures("cuda_debug")
@pytest.mark.parametrize("cta_order", ["head", "tile"])
@pytest.mark.parametrize("mode", ["pair", "cta"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_both_dq_adds_meet_the_bounds(hopper, launched_specs, monkeypatch, head_dim, mode, cta_order):
    from dualkv.cuda import configs
    from dualkv.testing import assert_rows_pass
    from dualkv.verify.checks import shared_prefix_check

    monkeypatch.setattr(configs, "WS_HEAD_MAJOR", cta_order == "head")
    with configs.ws_dq_add(mode):
        for case in _cases()[::2]:
            assert_rows_pass(shared_prefix_check(replace(case, head_dim=head_dim), dtype=torch.bfloat16,
                                                 device="cuda"))
    ws = [s for s in launched_specs if s.kernel == "bwd_sm90_ws"]
    assert ws and all(s.dq_pairs == (mode == "pair") and s.head_major == (cta_order == "head") for s in ws), ws


@pytest.mark.gpu
@pytest.mark.usefixtures("cuda_debug")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_pairs_on_the_paper_api(hopper, launched_specs, dtype):
    from dualkv.cuda.configs import ws_dq_add
    from dualkv.testing import assert_rows_pass
    from dualkv.verify.checks import AttentionCase, two_call_check

    with ws_dq_add("pair"):
        for case in (AttentionCase((129,), ((1, 63, 64, 65, 127),), 8, 2, 128),
                     AttentionCase((700,), ((300, 2, 257),), 8, 2, 128),
                     AttentionCase((1000,), ((1,),), 4, 4, 64)):
            assert_rows_pass(two_call_check(case, dtype=dtype, device="cuda"))
    assert any(s.kernel == "bwd_sm90_ws" and s.dq_pairs for s in launched_specs)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_pairs_are_bitwise_stable_and_close_to_the_cta_adds(hopper, head_dim):
    import dualkv
    from dualkv.cuda.configs import ws_dq_add

    layout = GroupLayout.from_lengths([3000, 129], [[700, 65, 1, 300, 2048], [64]])
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(layout.total_tokens, 16, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(layout.total_tokens, 4, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    dout = torch.randn_like(q)

    def grads():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        return torch.autograd.grad(dualkv.shared_prefix_attention(*leaves, layout), leaves, dout)

    with ws_dq_add("pair"):
        runs = [grads() for _ in range(3)]
    with ws_dq_add("cta"):
        cta = grads()
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
    assert torch.equal(runs[0][1], cta[1]) and torch.equal(runs[0][2], cta[2])  # dK, dV: the same sums
    dq_pair, dq_cta = runs[0][0].float(), cta[0].float()
    assert (dq_pair - dq_cta).abs().max() <= 0.02 * dq_cta.abs().max()  # dQ: another fp32 summation order
