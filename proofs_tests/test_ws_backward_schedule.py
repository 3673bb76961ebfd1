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


@pytest.mark.parametrize("shared_first", [False, True], ids=["own-first", "shared-first"])
@pytest.mark.parametrize("node_major", [False, True], ids=["heaviest", "node-major"])
@pytest.mark.parametrize("seed", range(4))
def test_dq_counters_receive_blocks_in_order(seed, node_major, shared_first):
    for layout in _layouts(seed, 25):
        seg = layout.segment_table
        tiles = launch_order(key_tiles(seg, BLOCK_KEYS, True), seg, node_major_tiles=node_major,
                             shared_first=shared_first)
        check_block_order(tiles)
        check_launch_order(tiles, seg, shared_first=shared_first)
        check_dq_order(tiles, seg, group=2, shared_first=shared_first)
    rng = random.Random(seed)
    for _ in range(25):  # the paper's call 2: a separate context tensor
        cu = np.cumsum([0] + [rng.randint(1, 300) for _ in range(rng.randint(1, 4))]).tolist()
        seg = segments_from_cu_seqlens(cu, rng.randint(1, 400))
        tiles = launch_order(key_tiles(seg, BLOCK_KEYS, False), seg, node_major_tiles=node_major,
                             shared_first=shared_first)
        check_block_order(tiles)
        check_launch_order(tiles, seg, shared_first=shared_first)
        check_dq_order(tiles, seg, shared_first=shared_first)


@pytest.mark.parametrize("causal", [True, False])
def test_shared_first_mismatches_are_caught(causal):
    """Ranks of one order with the other's launch order (or the own tiles first under shared-first) are refused: the
    kernel would wait forever. The mma.sync geometry (64-key blocks of 64 queries) and non-causal own keys too."""
    from dualkv.cuda.ws_schedule import Geometry

    geo = Geometry(64, 64, causal)
    layout = GroupLayout.from_lengths([300, 129], [[129, 200], [65, 1, 64]])
    seg = layout.segment_table
    own_first = launch_order(key_tiles(seg, 64, True), seg)
    shared_first = launch_order(key_tiles(seg, 64, True), seg, shared_first=True)
    check_dq_order(shared_first, seg, group=2, geo=geo, shared_first=True)
    with pytest.raises(RuntimeError, match="not 0..k-1"):
        check_dq_order(own_first, seg, group=2, geo=geo, shared_first=True)
    with pytest.raises(RuntimeError, match="not 0..k-1"):
        check_dq_order(shared_first, seg, group=2, geo=geo)
    with pytest.raises(RuntimeError, match="shared-first"):
        check_launch_order(own_first, seg, shared_first=True)
    with pytest.raises(RuntimeError, match="comes after a shared-key tile"):
        check_launch_order(shared_first, seg)


def test_node_major_order_keeps_each_segments_tiles_together_and_the_same_tiles():
    """Several groups: the heaviest-first table interleaves the groups' prompt blocks (block 0 of every prompt, then
    block 1, ...); node-major puts each prompt's blocks together, in order, and each response's, and changes nothing
    else (same tiles, own-response tiles still first)."""
    from dualkv.cuda.ws_schedule import is_own_response, node_major

    layout = GroupLayout.from_lengths([300, 300, 300], [[129, 200], [65, 1], [300]])
    seg = layout.segment_table
    heaviest = key_tiles(seg, BLOCK_KEYS, True)
    assert [t[0] for t in heaviest.tolist()[:3]] != [heaviest[0, 0]] * 3  # interleaved to begin with
    tiles = launch_order(heaviest, seg, node_major_tiles=True)
    assert sorted(map(tuple, tiles.tolist())) == sorted(map(tuple, heaviest.tolist()))
    runs = [t[0] for t in tiles.tolist()]
    starts = [r for i, r in enumerate(runs) if i == 0 or runs[i - 1] != r]
    assert len(starts) == len(set(starts)), runs
    own = [is_own_response(t, np.asarray(seg).reshape(-1, 4)) for t in tiles.tolist()]
    assert own == sorted(own, reverse=True)
    # two separate contexts (own_seg -1; segments 0-1 read keys 0..299, segment 2 keys 300..499): grouped by their
    # dependents, not merged into one run of interleaved blocks
    two_ctx = np.array([[0, 5, 0, 300], [5, 4, 0, 300], [9, 7, 300, 200]], dtype=np.int64)
    ctx_tiles = node_major(key_tiles(two_ctx, BLOCK_KEYS, False))
    runs = [(t[2], t[1]) for t in ctx_tiles.tolist() if t[0] < 0]
    assert runs == [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1)], runs
    tiles = launch_order(key_tiles(two_ctx, BLOCK_KEYS, False), two_ctx, node_major_tiles=True)
    check_block_order(tiles)
    check_launch_order(tiles, two_ctx)
    check_dq_order(tiles, two_ctx, group=2)


@pytest.mark.parametrize("name,reader,choices", [
    ("DUALKV_KEY_TILE_ORDER", "_key_tile_order_from_env", ("node", "heaviest")),
    ("DUALKV_TREE_DQ_ORDER", "_tree_dq_order_from_env", ("root", "nearest")),
    ("DUALKV_TWO_LEVEL_DQ_ORDER", "_two_level_dq_order_from_env", ("shared", "own")),
    ("DUALKV_MMA_CTA_ORDER", "_mma_cta_order_from_env", ("tile", "head"))])
def test_order_settings(monkeypatch, name, reader, choices):
    """Unset or empty: the default (first) choice; every choice is taken; anything else raises, naming the setting."""
    from dualkv.cuda import configs

    read = getattr(configs, reader)
    for value, want in (("", choices[0]), *((c, c) for c in choices)):
        monkeypatch.setenv(name, value)
        assert read() == want
    monkeypatch.setenv(name, "random")
    with pytest.raises(ValueError, match=f"{name} must be one of"):
        read()


def test_schedule_macros_cannot_be_set_through_extra_defines(monkeypatch):
    """DKV_TREE_ROOT_FIRST and the other dQ-order macros must match the launcher's schedule: a debug override of one
    is refused by name before anything compiles (a mismatch would hang the kernel until its wait limit)."""
    from dualkv.cuda import build
    from dualkv.cuda.configs import ws_bwd_spec

    monkeypatch.setenv("DUALKV_EXTRA_DEFINES", "DKV_DBG_NOSEM=1,DKV_TREE_ROOT_FIRST=1")
    with pytest.raises(ValueError, match="DKV_TREE_ROOT_FIRST"):
        build.compile_spec(ws_bwd_spec(128, torch.bfloat16, tree=True), use_cache=False)


def test_benchmark_records_carry_the_order_settings():
    from dualkv.bench.harness import environment

    env = environment(torch.device("cpu"))
    assert env["tree_dq_order"] in ("nearest", "root") and env["key_tile_order"] in ("heaviest", "node")
    assert "extra_defines" in env


def test_plans_take_the_shared_first_order_when_chosen(monkeypatch):
    from dualkv.cuda import launch

    layout = GroupLayout.from_lengths([300, 300], [[129, 200], [65, 1]])
    monkeypatch.setattr(launch, "TWO_LEVEL_SHARED_FIRST", True)
    plan = launch.make_plan(layout.segment_table, head_dim=128, group_size=2, window_left=-1,
                            device=torch.device("cpu"), ctx_shared=True, fwd_kernel="fwd")
    seg = layout.segment_table
    check_dq_order(plan.key_tiles.numpy(), seg, group=2, shared_first=True)
    with pytest.raises(RuntimeError, match="not 0..k-1"):
        check_dq_order(plan.key_tiles.numpy(), seg, group=2)
    assert launch._root_first(False) and launch._root_first(True) == launch.TREE_DQ_ROOT_FIRST


def test_plans_take_the_key_tile_order_chosen(monkeypatch):
    from dualkv.cuda import launch

    layout = GroupLayout.from_lengths([300, 300], [[129, 200], [65, 1]])
    monkeypatch.setattr(launch, "TWO_LEVEL_SHARED_FIRST", False)  # the own-first tables checked below
    monkeypatch.setattr(launch, "KEY_TILES_NODE_MAJOR", False)
    heaviest = launch.make_plan(layout.segment_table, head_dim=128, group_size=2, window_left=-1,
                               device=torch.device("cpu"), ctx_shared=True, fwd_kernel="fwd")
    monkeypatch.setattr(launch, "KEY_TILES_NODE_MAJOR", True)
    plan = launch.make_plan(layout.segment_table, head_dim=128, group_size=2, window_left=-1,
                            device=torch.device("cpu"), ctx_shared=True, fwd_kernel="fwd")
    seg = layout.segment_table
    assert not np.array_equal(plan.key_tiles.numpy(), heaviest.key_tiles.numpy())
    assert np.array_equal(plan.key_tiles.numpy(), launch_order(key_tiles(seg, BLOCK_KEYS, True), seg,
                                                               node_major_tiles=True))
    check_dq_order(plan.key_tiles.numpy(), seg, group=2)


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
    from dualkv.cuda.launch import TWO_LEVEL_SHARED_FIRST, make_plan

    seg = GroupLayout.from_lengths([200, 70], [[129, 5], [64, 1, 300]]).segment_table
    plan = make_plan(seg, head_dim=128, group_size=2, window_left=-1, device=torch.device("cpu"), ctx_shared=True,
                     fwd_kernel="fwd")  # a named kernel: no GPU needed to pick one
    tiles = plan.key_tiles.numpy()
    check_launch_order(tiles, seg, shared_first=TWO_LEVEL_SHARED_FIRST)  # this process's order (the default: shared)
    check_dq_order(tiles, seg, group=2, shared_first=TWO_LEVEL_SHARED_FIRST)


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


def test_head_major_cta_order_is_the_two_level_default_and_compiles_like_tile_major(monkeypatch):
    """The head-major CTA order (DKV_HEAD_MAJOR=1: each KV head's table launched in turn) is what a two-level
    backward's spec builds by default and a tree's never does; it only remaps blockIdx.x, so it compiles with no
    serialized wgmma and no more spills than the tile-major build, into a different cubin. Only the spec may set it."""
    from dualkv.cuda import configs
    from dualkv.cuda.build import compile_spec, resource_usage
    from dualkv.cuda.configs import ws_bwd_spec

    monkeypatch.delenv("DUALKV_EXTRA_DEFINES", raising=False)
    monkeypatch.delenv("DUALKV_WS_CTA_ORDER", raising=False)
    assert configs._ws_cta_order_from_env() == "head"  # the default
    monkeypatch.setattr(configs, "WS_HEAD_MAJOR", True)  # as imported without $DUALKV_WS_CTA_ORDER
    spec = ws_bwd_spec(128, torch.bfloat16)
    assert spec.head_major and ("DKV_HEAD_MAJOR", "1") in spec.defines()
    assert not ws_bwd_spec(128, torch.bfloat16, tree=True).head_major
    tile_major = ws_bwd_spec(128, torch.bfloat16, head_major=False)
    assert "DKV_HEAD_MAJOR" not in dict(tile_major.defines())
    head, tile = (compile_spec(s, use_cache=False, verbose=True) for s in (spec, tile_major))
    got, want = resource_usage(head.log), resource_usage(tile.log)
    assert head.cubin != tile.cubin
    # (a few bytes of slack: on three Q/dO stages ptxas spills 24 bytes of per-step values in the head-major build
    # against 20 in the tile-major one, and reloads 36 against 16; test_cuda_build caps the WS backward's spills at 128)
    assert not got["wgmma_serialized"], (got, want)
    assert got["spill_stores"] <= want["spill_stores"] + 4 and got["spill_loads"] <= want["spill_loads"] + 24, (got, want)
    monkeypatch.setenv("DUALKV_EXTRA_DEFINES", "DKV_HEAD_MAJOR=0")
    with pytest.raises(ValueError, match="DUALKV_WS_CTA_ORDER"):
        compile_spec(spec, use_cache=False)


def test_head_major_cta_order_is_refused_outside_the_ws_backward():
    from dualkv.cuda.configs import SM90_DKDV_TILES, KernelSpec

    with pytest.raises(ValueError, match="head-major CTA order"):
        KernelSpec("bwd_dkdv_sm90", 128, "bf16", SM90_DKDV_TILES[128], 1, False, "sm_90a", head_major=True)


def test_ws_cta_order_environment_is_checked(monkeypatch):
    from dualkv.cuda import configs

    monkeypatch.setenv("DUALKV_WS_CTA_ORDER", "tile")
    assert configs._ws_cta_order_from_env() == "tile"
    monkeypatch.setenv("DUALKV_WS_CTA_ORDER", "heads")
    with pytest.raises(ValueError, match="DUALKV_WS_CTA_ORDER must be one of"):
        configs._ws_cta_order_from_env()


def test_the_transposed_k_head_dims_match_the_kernel():
    """KernelSpec.smem_bytes counts a transposed K tile at WS_TRANSPOSED_K_HEAD_DIMS; the kernel allocates one where
    DKV_DQ_FROM_KT holds. The two must name the same head dims."""
    import re

    from dualkv.cuda.build import CSRC
    from dualkv.cuda.configs import SM90_WS_BWD_TILES, WS_TRANSPOSED_K_HEAD_DIMS, ws_bwd_spec

    rule = re.search(r"#define DKV_DQ_FROM_KT \(DKV_HEAD_DIM == (\d+)\)", (CSRC / "bwd_sm90_ws.cu").read_text())
    assert rule and WS_TRANSPOSED_K_HEAD_DIMS == (int(rule.group(1)),)
    # the kernel's regions laid out by hand (K, V, [K^T], Q and dO stages, dS, fp32 dQ, LSE/D, step records,
    # mbarriers, 1 KB alignment slack): 133,208 bytes at d = 64 (K^T: 16 KB), 232,056 at d = 128 (three Q/dO stages:
    # 64 + 96 + 32 + 32 KB, 1,536 of LSE/D, 48 of records, 72 of mbarriers, 1,024 of slack), 190,552 at d = 96
    # (128-column tiles, dQ rows of 96 fp32 columns); the wide build (64 keys, P^T / dS^T / dS tiles of 8 KB, dQ_step
    # in the Q/dO stage, a dQ barrier pair per stage): 223,896 at d = 192 (three stages), 223,336 at d = 256 (two),
    # under the 232,448 an sm_90 CTA may take
    assert {d: ws_bwd_spec(d, torch.bfloat16).smem_bytes for d in SM90_WS_BWD_TILES} == {
        64: 133_208, 96: 190_552, 128: 232_056, 192: 223_896, 256: 223_336}
    assert max(ws_bwd_spec(d, torch.bfloat16).smem_bytes for d in SM90_WS_BWD_TILES) <= 232_448


def _dq_row_model(head_dim: int, token: int, consumer_order: bool = True) -> list[int]:
    """Where bwd_sm90_ws.cu's consumers put dQ column ``col`` of a row (``token`` = the row's token), as the float
    offset in a row of ``head_dim`` floats (16-byte chunk col / 4 moved to (col / 4) ^ (token & 7)), and where
    bwd_dq_cast.cu reads it back (output chunk c of 8 elements: fp32 chunks 2c and 2c + 1, each ^ (token & 7))."""
    if consumer_order:
        return [((col // 4) ^ (token & 7)) * 4 + col % 4 for col in range(head_dim)]
    return [(((2 * c + j) ^ (token & 7)) * 4 + k) for c in range(head_dim // 8) for j in range(2) for k in range(4)]


@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_dq_rows_permute_within_the_row(head_dim):
    """The dQ rows hold exactly the head dim's columns (96 at head dim 96, not its tiles' 128): the chunk permutation
    stays inside the row, is one-to-one, and the cast's reads undo the consumers' writes; the kernel and the cast
    spell the permutation as this model does. A row whose width is not whole groups of 8 chunks would leave it."""
    from dualkv.cuda.build import CSRC

    for token in range(16):
        written = _dq_row_model(head_dim, token)
        assert sorted(written) == list(range(head_dim))
        assert _dq_row_model(head_dim, token, consumer_order=False) == written  # read column n where n was written
    assert max(_dq_row_model(80, 5)) >= 80  # 20 chunks: token 5 sends chunk 16 to 21, past the row
    kernel, cast = (CSRC / "bwd_sm90_ws.cu").read_text(), (CSRC / "bwd_dq_cast.cu").read_text()
    assert "return chunk ^ (token & 7);" in kernel and "constexpr int kDqRowBytes = kHeadDim * 4;" in kernel
    assert "(dq_chunk(col / 4, tok7 + row) * 4 + col % 4) * 4" in kernel
    assert "src + 4 * ((2 * c) ^ (t & 7))" in cast and "src + 4 * ((2 * c + 1) ^ (t & 7))" in cast


#: csrc/keywalk.cuh's cta_head_tile, the statements _kernel_cta_head_tile restates (whitespace-normalised).
KERNEL_CTA_HEAD_TILE = (
    "if (!head_major) return make_int2(bid % kv_heads, bid / kv_heads);",
    "const int first_ctas = first_tiles * kv_heads;",
    "if (bid < first_ctas) return make_int2(bid / first_tiles, bid % first_tiles);",
    "const int rest = gridDim.x / kv_heads - first_tiles;",
    "return make_int2((bid - first_ctas) / rest, first_tiles + (bid - first_ctas) % rest);",
)


def _kernel_cta_head_tile(bid: int, n_tiles: int, kv_heads: int, first_tiles: int,
                          head_major: bool) -> tuple[int, int]:
    """csrc/keywalk.cuh's cta_head_tile (KERNEL_CTA_HEAD_TILE), line for line: (KV head, table row); gridDim.x is
    n_tiles * kv_heads at both launch sites."""
    if not head_major:
        return bid % kv_heads, bid // kv_heads
    first_ctas = first_tiles * kv_heads
    if bid < first_ctas:
        return bid // first_tiles, bid % first_tiles
    rest = n_tiles - first_tiles
    return (bid - first_ctas) // rest, first_tiles + (bid - first_ctas) % rest


def test_the_kernels_cta_mapping_is_the_restated_one():
    """The statements _kernel_cta_head_tile restates are the kernel's, in order (so the mirror below tests the code
    that runs)."""
    from pathlib import Path

    import dualkv.cuda

    src = (Path(dualkv.cuda.__file__).parent / "csrc" / "keywalk.cuh").read_text()
    body = src[src.index("cta_head_tile(int kv_heads, int first_tiles, bool head_major, int bid) {"):]
    body = " ".join(body[:body.index("\n}\n")].split())
    at = [body.find(" ".join(line.split())) for line in KERNEL_CTA_HEAD_TILE]
    assert -1 not in at and at == sorted(at), at
    # the overload without bid reads blockIdx.x; the epilogues' second look reads %ctaid.x itself
    assert "return cta_head_tile(kv_heads, first_tiles, head_major, blockIdx.x);" in src
    assert 'asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(bid));' in src


@pytest.mark.parametrize("head_major", [True, False])
def test_cta_order_is_the_kernels_mapping(head_major):
    from dualkv.cuda.ws_schedule import check_cta_order, cta_order

    for n in (1, 2, 5, 17):
        for kv in (1, 3, 8):
            for first in sorted({0, 1, n // 2, n - 1, n}):
                got = cta_order(n, kv, first, head_major)
                want = [_kernel_cta_head_tile(b, n, kv, first, head_major) for b in range(n * kv)]
                assert got.tolist() == [list(x) for x in want], (n, kv, first)
                check_cta_order(got, n, kv)
            if head_major:  # the whole table per head: the head-major order before the split existed
                assert cta_order(n, kv).tolist() == [[b // n, b % n] for b in range(n * kv)]
    with pytest.raises(ValueError, match="first_tiles"):
        cta_order(4, 2, 5)


@pytest.mark.parametrize("shared_first", [False, True], ids=["own-first", "shared-first"])
@pytest.mark.parametrize("seed", range(2))
def test_every_cta_split_keeps_the_dq_order(seed, shared_first):
    """Whatever the split, every dQ counter receives ranks 0..k-1 in CTA launch order (no CTA waits on a later one)."""
    from dualkv.cuda.ws_schedule import check_cta_order, cta_order, head_major_split

    for layout in _layouts(seed, 12):
        seg = layout.segment_table
        tiles = launch_order(key_tiles(seg, BLOCK_KEYS, True), seg, node_major_tiles=True, shared_first=shared_first)
        n = len(tiles)
        for first in sorted({0, 1, n // 2, head_major_split(tiles, seg, shared_first), n}):
            order = cta_order(n, 3, first)
            check_cta_order(order, n, 3)
            check_dq_order(tiles, seg, group=2, shared_first=shared_first, ctas=order)


def test_wrong_cta_orders_are_caught():
    """Known-wrong orders: two tiles of one KV head swapped (its dQ counters would get rank 1 before rank 0: the
    kernel would wait forever), a CTA dropped, a CTA repeated."""
    from dualkv.cuda.ws_schedule import check_cta_order, cta_order

    seg = GroupLayout.single(300, [129, 5]).segment_table
    tiles = launch_order(key_tiles(seg, BLOCK_KEYS, True), seg)
    order = cta_order(len(tiles), 2)
    prompt = [i for i, t in enumerate(tiles.tolist()) if t[0] == 0]  # the prompt's blocks 0, 1, 2 (KV head 0's CTAs)
    swapped = order.copy()
    swapped[[prompt[0], prompt[1]]] = swapped[[prompt[1], prompt[0]]]
    with pytest.raises(RuntimeError, match="out of table order"):
        check_cta_order(swapped, len(tiles), 2)
    check_dq_order(tiles, seg, group=2, ctas=order)
    with pytest.raises(RuntimeError, match="not 0..k-1"):
        check_dq_order(tiles, seg, group=2, ctas=swapped)
    with pytest.raises(RuntimeError, match="once"):
        check_cta_order(order[1:], len(tiles), 2)
    with pytest.raises(RuntimeError, match="once"):
        check_cta_order(np.concatenate([order[:1], order[:-1]]), len(tiles), 2)


@pytest.mark.parametrize("shared_first", [False, True], ids=["own-first", "shared-first"])
def test_plans_split_the_head_major_order_after_the_shared_tiles(shared_first, monkeypatch):
    """Shared-first plans launch every KV head's shared-key (heavy) tiles before any own-response (light) tile, so the
    light tiles fill the last wave; own-first plans keep each KV head's whole table together (the split would put
    every head's light own tiles first)."""
    from dualkv.cuda import launch
    from dualkv.cuda.ws_schedule import cta_order, is_own_response

    layout = GroupLayout.from_lengths([300, 700], [[129, 200], [65, 1, 300]])
    monkeypatch.setattr(launch, "TWO_LEVEL_SHARED_FIRST", shared_first)
    plan = launch.make_plan(layout.segment_table, head_dim=128, group_size=2, window_left=-1,
                            device=torch.device("cpu"), ctx_shared=True, fwd_kernel="fwd")
    tiles, seg = plan.key_tiles.numpy(), layout.segment_table
    own = np.array([is_own_response(t, seg) for t in tiles.tolist()])
    if not shared_first:
        assert plan.ws_first_tiles == len(tiles)
        return
    assert plan.ws_first_tiles == int((~own).sum()) and not own[:plan.ws_first_tiles].any()
    launched_own = own[cta_order(len(tiles), 4, plan.ws_first_tiles)[:, 1]]
    first_own = int(np.argmax(launched_own))
    assert launched_own[first_own:].all() and not launched_own[:first_own].any()
