"""The mma.sync dK/dV kernel's ordered dQ mode (csrc/bwd_dkdv.cu, DKV_DQ_ORDERED), checked on the CPU at the
kernel's own geometry (:func:`dualkv.cuda.ws_schedule.mma_geometry`: its 64-query steps and 128-key blocks, causal
or not): every dQ counter receives ranks 0..k-1 in launch order on random segment tables and prefix forests (or the
kernel would deadlock), known-wrong launch orders and ranks are caught, replaying the walk in float64 reproduces the
reference gradients, the switch is off by default and refuses what the mode does not support."""

import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from dualkv import GroupLayout
from dualkv.cuda import ws_schedule
from dualkv.cuda.call2 import map_call2
from dualkv.cuda.configs import (DKDV_TILES, ORDERED_HEAD_DIMS, KernelSpec, dkdv_spec, dq_ordered_for, kernel_family,
                                 mma_backward)
from dualkv.cuda.schedule import check_block_order, key_tiles, segments_from_cu_seqlens
from dualkv.cuda.ws_schedule import (Geometry, check_dq_order, check_launch_order, launch_order, mma_geometry,
                                     numeric_backward)
from test_ws_backward_schedule import _reference_grads
from test_ws_backward_tree import _deep_tree, _float64_case, _forests, _schedule

LENGTHS = (1, 63, 64, 65, 127, 128, 129, 300)
GEOMETRIES = sorted({mma_geometry(d) for d in ORDERED_HEAD_DIMS}, key=repr)


def _group_layouts(rng: random.Random, count: int):
    """Random two-level layouts: one to three groups, N = 1 included, awkward lengths."""
    for _ in range(count):
        g = rng.randint(1, 3)
        yield GroupLayout.from_lengths([rng.choice(LENGTHS) for _ in range(g)],
                                       [[rng.choice(LENGTHS[:-1]) for _ in range(rng.randint(1, 4))]
                                        for _ in range(g)])


def _call2_table(rng: random.Random) -> np.ndarray:
    """The paper's call 2 on a separate context: one shared context, or (query rows != decoded rows) several
    context lengths and context-free segments (dualkv.cuda.call2)."""
    lens = [rng.choice(LENGTHS) for _ in range(rng.randint(1, 4))]
    p = rng.choice((0, 1, 65, 200, 300))
    if rng.random() < 0.5:
        return segments_from_cu_seqlens(np.cumsum([0] + lens).tolist(), p)
    rows = [rng.randint(0, p + r) for r in lens]
    return map_call2(np.cumsum([0] + rows).tolist(), np.cumsum([0] + lens).tolist(), p).segments


def _ordered_tiles(seg: np.ndarray, geo: Geometry, ctx_shared: bool, shared_first: bool = False) -> np.ndarray:
    tiles = launch_order(key_tiles(seg, geo.block_keys, ctx_shared, geo.causal), seg, shared_first=shared_first)
    check_block_order(tiles)
    check_launch_order(tiles, seg, shared_first=shared_first)
    return tiles


def test_geometry_is_the_kernels():
    """The ranks are stated at the tile the ordered kernel is built with (DKV_BLOCK_M queries per step, warps x 16
    keys per block)."""
    for d in ORDERED_HEAD_DIMS:
        spec = dkdv_spec(d, torch.bfloat16, False, "sm_80", dq_ordered=True)
        defines = dict(spec.defines())
        geo = mma_geometry(d)
        assert (spec.kernel, defines["DKV_DQ_ORDERED"], defines["DKV_DQ_ATOMIC"]) == ("bwd_dkdv", "1", "0")
        assert int(defines["DKV_BLOCK_M"]) == geo.step == DKDV_TILES[d].block_m
        assert int(defines["DKV_WARPS"]) // int(defines["DKV_DSPLIT"]) * 16 == geo.block_keys
        assert mma_geometry(d, causal=False) == replace(geo, causal=False)
    assert "DKV_DQ_ORDERED" not in dict(dkdv_spec(64, torch.bfloat16, False, "sm_80").defines())


@pytest.mark.parametrize("shared_first", [True, False], ids=["shared-first", "own-first"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("geo", GEOMETRIES, ids=repr)
def test_shared_prefix_counters_receive_ranks_in_order(seed, geo, shared_first):
    rng = random.Random(seed)
    for layout in _group_layouts(rng, 20):
        seg = layout.segment_table
        tiles = _ordered_tiles(seg, geo, ctx_shared=True, shared_first=shared_first)
        for group in (1, 2):
            check_dq_order(tiles, seg, group, geo=geo, shared_first=shared_first)


@pytest.mark.parametrize("shared_first", [True, False], ids=["shared-first", "own-first"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
@pytest.mark.parametrize("geo", GEOMETRIES, ids=repr)
def test_paper_api_counters_receive_ranks_in_order(seed, causal, geo, shared_first):
    """Call 2 (a separate context tensor; several context lengths; causal or not) and non-causal call 1."""
    geo = replace(geo, causal=causal)
    rng = random.Random(100 + seed)
    for _ in range(20):
        seg = _call2_table(rng)
        check_dq_order(_ordered_tiles(seg, geo, False, shared_first), seg, 2, geo=geo, shared_first=shared_first)
        prompts = segments_from_cu_seqlens(np.cumsum([0] + [rng.choice(LENGTHS) for _ in range(3)]).tolist(), 0)
        check_dq_order(_ordered_tiles(prompts, geo, True, shared_first), prompts, 1, geo=geo,
                       shared_first=shared_first)


def test_plans_carry_an_order_the_ordered_kernel_accepts():
    """The launcher hands the ordered kernel the plan's key tiles as they are (in this process's dQ order)."""
    from dualkv.cuda.launch import TWO_LEVEL_SHARED_FIRST, make_plan

    for d in ORDERED_HEAD_DIMS:
        for seg, ctx_shared in ((GroupLayout.from_lengths([200, 70], [[129, 5], [64, 1, 300]]).segment_table, True),
                                (segments_from_cu_seqlens([0, 65, 66, 300], 257), False)):
            plan = make_plan(seg, head_dim=d, group_size=2, window_left=-1, device=torch.device("cpu"),
                             ctx_shared=ctx_shared, fwd_kernel="fwd")
            check_dq_order(plan.key_tiles.numpy(), seg, 2, geo=mma_geometry(d), shared_first=TWO_LEVEL_SHARED_FIRST)


@pytest.mark.parametrize("seed", range(2))
def test_other_geometries(seed):
    """The statements are the kernel's at any step / key block (the WS constants are only the default)."""
    rng = random.Random(seed)
    for geo in (Geometry(32, 128), Geometry(64, 64), Geometry(16, 64, causal=False), Geometry(64, 256)):
        for shared in (True, False):
            for layout in _group_layouts(rng, 8):
                if geo.causal:
                    seg = layout.segment_table
                    check_dq_order(_ordered_tiles(seg, geo, True, shared), seg, 2, geo=geo, shared_first=shared)
            seg = _call2_table(rng)
            check_dq_order(_ordered_tiles(seg, geo, False, shared), seg, 1, geo=geo, shared_first=shared)
    with pytest.raises(ValueError, match="multiple of step"):
        Geometry(64, 96)


def test_wrong_launch_orders_are_caught():
    geo = mma_geometry(128)
    seg = GroupLayout.from_lengths([300, 70], [[129, 5], [64, 1]]).segment_table
    heaviest_first = key_tiles(seg, geo.block_keys, True)
    tiles = launch_order(heaviest_first, seg)
    check_dq_order(tiles, seg, 2, geo=geo)
    with pytest.raises(RuntimeError, match="after a shared-key tile"):
        check_launch_order(heaviest_first, seg)
    for wrong in (heaviest_first, tiles[::-1], np.delete(tiles, 0, axis=0)):
        with pytest.raises(RuntimeError, match="not 0..k-1"):
            check_dq_order(wrong, seg, 2, geo=geo)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
def test_wrong_ranks_are_caught(monkeypatch, causal):
    """Ranks that leave out the dependent's own blocks, count them at the WS kernel's 128-key blocks when the kernel
    has 64-key blocks, or count them causally in a non-causal kernel: every one would deadlock, and is caught."""
    seg = segments_from_cu_seqlens([0, 65, 66, 300, 429], 257)
    geo = Geometry(64, 64, causal)
    tiles = _ordered_tiles(seg, geo, ctx_shared=False)
    check_dq_order(tiles, seg, 1, geo=geo)
    real = ws_schedule.own_reach
    wrong_reaches = [lambda qt, g=ws_schedule.WS, q_len=0: 0,
                     lambda qt, g=ws_schedule.WS, q_len=0: real(qt, replace(g, block_keys=128), q_len)]
    if not causal:
        wrong_reaches.append(lambda qt, g=ws_schedule.WS, q_len=0: real(qt, replace(g, causal=True), q_len))
    for wrong in wrong_reaches:
        monkeypatch.setattr(ws_schedule, "own_reach", wrong)
        with pytest.raises(RuntimeError, match="not 0..k-1"):
            check_dq_order(tiles, seg, 1, geo=geo)


@pytest.mark.parametrize("layout", [GroupLayout.single(257, [129, 1, 64]), GroupLayout.single(1, [1]),
                                    GroupLayout.from_lengths([63, 300, 65], [[127], [1, 65, 129], [200, 2]])],
                         ids=repr)
def test_replay_equals_reference_backward(layout):
    """float64 replay of the ordered walk at the kernel's geometry (every step's five products, masks, dQ in table
    order) against autograd through the reference."""
    torch.manual_seed(0)
    t, h, hk, d = layout.total_tokens, 4, 2, 16
    q = torch.randn(t, h, d, dtype=torch.float64)
    k, v = (torch.randn(t, hk, d, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(t, h, d, dtype=torch.float64)
    seg = layout.segment_table
    geo = mma_geometry(128)
    dq, _, _, dk, dv = numeric_backward(q, k, v, k, v, dout, seg, _ordered_tiles(seg, geo, True), d ** -0.5, geo=geo)
    for got, want in zip((dq, dk, dv), _reference_grads(q, k, v, dout, layout)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
@pytest.mark.parametrize("geo", [None, Geometry(32, 64)], ids=["mma", "step32_block64"])
def test_replay_paper_api_equals_reference_backward(causal, geo):
    """A separate context tensor (context tiles first-class dependents), causal or not; at the kernel's geometry and
    at another one."""
    from dualkv.reference import flash_attn_dualkv_varlen_func

    torch.manual_seed(1)
    p, lens, h, hk, d = 200, [70, 1, 129, 65], 4, 1, 16
    cu = np.cumsum([0] + lens).tolist()
    seg = segments_from_cu_seqlens(cu, p)
    t = cu[-1]
    q = torch.randn(t, h, d, dtype=torch.float64)
    kd, vd = (torch.randn(t, hk, d, dtype=torch.float64) for _ in range(2))
    kc, vc = (torch.randn(p, hk, d, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(t, h, d, dtype=torch.float64)
    geo = mma_geometry(64, causal) if geo is None else replace(geo, causal=causal)
    got = numeric_backward(q, kc, vc, kd, vd, dout, seg, _ordered_tiles(seg, geo, False), d ** -0.5, geo=geo)
    leaves = [x.clone().requires_grad_() for x in (q, kc, vc, kd, vd)]
    cu_t = torch.tensor(cu, dtype=torch.int32)
    out = flash_attn_dualkv_varlen_func(*leaves, cu_t, cu_t, max(lens), p, max(lens), causal=causal)
    for a, b in zip(got, torch.autograd.grad(out, leaves, dout)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_auto_takes_the_ordered_mode_for_deterministic_calls_at_64_to_128():
    """"auto" (the default) runs the ordered dQ for causal deterministic calls without a window at head dims 64-128
    where the mma.sync dK/dV kernel serves them anyway (faster than the split backward there, slower at 32);
    deterministic=False calls take the atomic dQ; the wgmma kernels keep Hopper's calls."""
    from dualkv.cuda.configs import AUTO_ORDERED_HEAD_DIMS, dq_atomic_for

    def ordered_dims(arch, deterministic=True, window=False, causal=True):
        return tuple(d for d in (*ORDERED_HEAD_DIMS, 192, 256)
                     if dq_ordered_for(d, arch, window=window, deterministic=deterministic, causal=causal))

    with kernel_family("auto"), mma_backward("auto"):  # the defaults, whatever DUALKV_KERNELS / DUALKV_MMA_BWD say
        assert ordered_dims("sm_80") == AUTO_ORDERED_HEAD_DIMS == (64, 96, 128)   # not 32 (slower there)
        assert ordered_dims("sm_80", deterministic=False) == ()
        assert dq_atomic_for(128, False, "sm_80") and not dq_atomic_for(128, True, "sm_80")
        assert ordered_dims("sm_80", window=True) == ()                           # no windowed ordered build
        assert ordered_dims("sm_80", causal=False) == ()                          # not timed: the split backward
        assert ordered_dims("sm_90") == ()                                        # the wgmma kernels serve 64-128
        with kernel_family("mma"):
            assert ordered_dims("sm_90") == (64, 96, 128)                         # the Ampere stand-in
        for mode, dims in (("split", ()), ("atomic", ()), ("ordered", ORDERED_HEAD_DIMS)):
            with mma_backward(mode):
                assert (ordered_dims("sm_80") == ordered_dims("sm_80", deterministic=False)
                        == ordered_dims("sm_80", causal=False) == dims), mode


def test_switch_picks_the_mma_kernel_only():
    def ordered(head_dim, arch, window=False):  # a causal deterministic call
        return dq_ordered_for(head_dim, arch, window=window, deterministic=True, causal=True)

    with mma_backward("split"):
        assert not ordered(128, "sm_80")
    with mma_backward("ordered"):
        assert ordered(128, "sm_80")
        assert ordered(32, "sm_90")                                  # no wgmma dK/dV kernel at d = 32
        assert not ordered(128, "sm_90")                             # the wgmma kernels serve it
        with kernel_family("mma"):
            assert ordered(128, "sm_90")
        assert not ordered(128, "sm_80", window=True)                # windows keep the dQ kernel
        assert not ordered(192, "sm_80")
        with mma_backward("split"):
            assert not ordered(128, "sm_80")
        assert ordered(128, "sm_80")                                 # restored after the block


def test_atomic_dq_is_for_non_deterministic_calls_only():
    """"auto" (the default) sends deterministic=False calls to the atomic dQ at head dims 64-128 where the mma.sync
    dK/dV kernel serves them anyway; "atomic" at every atomic head dim, also in place of Hopper's wgmma pair; "split"
    and "ordered" never; deterministic calls never."""
    from dualkv.cuda.configs import ATOMIC_HEAD_DIMS, AUTO_ATOMIC_HEAD_DIMS, dq_atomic_for

    def atomic_dims(arch, deterministic=False):
        return tuple(d for d in (*ATOMIC_HEAD_DIMS, 192, 256) if dq_atomic_for(d, deterministic, arch))

    with kernel_family("auto"), mma_backward("auto"):  # the defaults, whatever DUALKV_KERNELS / DUALKV_MMA_BWD say
        assert atomic_dims("sm_80") == AUTO_ATOMIC_HEAD_DIMS == (64, 96, 128)   # not 32 (slower there)
        assert atomic_dims("sm_90") == ()                                     # the wgmma kernels serve 64-128; 32: slower
        assert atomic_dims("sm_80", deterministic=True) == ()
        with kernel_family("mma"):
            assert atomic_dims("sm_90") == (64, 96, 128)                      # the Ampere stand-in
        with mma_backward("atomic"):
            assert atomic_dims("sm_80") == atomic_dims("sm_90") == ATOMIC_HEAD_DIMS   # no atomic kernel above 128
            assert atomic_dims("sm_80", deterministic=True) == ()            # deterministic: the split backward
            assert not dq_ordered_for(128, "sm_80", window=False, deterministic=True, causal=True)
        for mode in ("split", "ordered"):                                     # ordered: it serves every call
            with mma_backward(mode):
                assert atomic_dims("sm_80") == atomic_dims("sm_90") == ()
        assert atomic_dims("sm_80") == (64, 96, 128)                          # restored after the blocks


def test_bad_switch_values_are_refused_by_name(monkeypatch):
    from dualkv.cuda import configs

    with pytest.raises(ValueError, match="mma backward must be one of"):
        mma_backward("fast")
    monkeypatch.setattr(configs, "_mma_backward", ["fast"])           # what DUALKV_MMA_BWD=fast leaves at import
    with pytest.raises(ValueError, match="DUALKV_MMA_BWD must be one of"):
        dq_ordered_for(128, "sm_80", window=False, deterministic=True, causal=True)
    with pytest.raises(ValueError, match="DUALKV_MMA_BWD must be one of"):
        configs.dq_atomic_for(128, deterministic=False, arch="sm_80")


def test_unsupported_ordered_specs_are_refused():
    base = dkdv_spec(128, torch.bfloat16, False, "sm_80", dq_ordered=True)
    with pytest.raises(ValueError, match="no sliding window"):
        replace(base, window=True)
    assert dict(replace(base, tree=True).defines())["DKV_TREE"] == "1"
    with pytest.raises(ValueError, match="tree build is causal, with key blocks of 128"):
        replace(base, tree=True, tile=DKDV_TILES[192])
    with pytest.raises(ValueError, match="prefix-tree specializations exist"):
        dkdv_spec(128, torch.bfloat16, False, "sm_80", tree=True)  # the split backward's dK/dV kernel has none
    with pytest.raises(ValueError, match="atomic or ordered"):
        replace(base, dq_atomic=True)
    with pytest.raises(ValueError, match="ordered dQ mode exists for the dK/dV kernel"):
        KernelSpec("bwd_dkdv", 192, "bf16", DKDV_TILES[192], 1, False, "sm_80", dq_ordered=True)
    with pytest.raises(ValueError, match="whole query steps"):
        replace(base, tile=replace(DKDV_TILES[128], block_m=48))
    assert dict(replace(base, split_tiles=True).defines())["DKV_SPLIT_TILES"] == "1"
    for wrong in (dict(tree=True), dict(dq_ordered=False)):  # split tables exist for the two-level ordered mode only
        with pytest.raises(ValueError, match="split shared-key tiles have a build"):
            replace(base, split_tiles=True, **wrong)


def test_split_tables_need_the_split_build():
    """The ordered dK/dV kernel sums split tiles only in its split build (DKV_SPLIT_TILES): handing a split table's
    buffers to the other build would leave every part's dK / dV unsummed, so split_args refuses it by name."""
    from dualkv.cuda import split_args

    plain = dkdv_spec(64, torch.bfloat16, False, "sm_80", dq_ordered=True, root_first=True)
    with pytest.raises(ValueError, match="split-tiles build"):
        split_args.part_buffers(plain, (2, 4), 2, "cpu")
    args, buffers = split_args.part_buffers(replace(plain, split_tiles=True), (2, 4), 2, "cpu")
    assert int(args[2]) == 2 and int(args[3]) == 4 and len(buffers) == 2
    assert split_args.part_buffers(plain, (1, 0), 2, "cpu") == (split_args.NO_SPLIT, ())


def test_split_tiles_macro_is_the_specs_alone(monkeypatch):
    """DKV_SPLIT_TILES must match the launcher's table (a split table on a build without the sum leaves the parts
    unsummed), so, like the dQ-order macros, DUALKV_EXTRA_DEFINES may not set it."""
    from dualkv.cuda.build import compile_spec

    monkeypatch.setenv("DUALKV_EXTRA_DEFINES", "DKV_SPLIT_TILES=0")
    with pytest.raises(ValueError, match="DKV_SPLIT_TILES"):
        compile_spec(dkdv_spec(64, torch.bfloat16, False, "sm_80", dq_ordered=True, root_first=True, split_tiles=True),
                     use_cache=False)


def test_the_split_epilogue_is_the_split_builds_only():
    """bwd_dkdv.cu compiles the split sum only into DKV_SPLIT_TILES builds (in the others it added to ptxas's spills in
    the main loop, experiments/results/checks/s28variants-*), and re-reads the thread index for its row copies in the
    ordered builds alone (common.cuh keeps the other kernels' spelling, and only bwd_dkdv.cu sets the switch); every
    split-tiles build is in the compiled set."""
    from dualkv.cuda.build import CSRC
    from dualkv.cuda.configs import TWO_LEVEL_SHARED_FIRST, all_specs

    kernel, common = (CSRC / "bwd_dkdv.cu").read_text(), (CSRC / "common.cuh").read_text()
    assert "if (kSplitTiles) {  // a split key tile (split_parts.cuh)" in kernel
    assert "if (kDqOrdered) {  // a split key tile" not in kernel
    assert "#if defined(DKV_DQ_ORDERED) && DKV_DQ_ORDERED && !defined(DKV_ROWS_TID_AGAIN)" in kernel
    assert "#else\n        const int r0 = threadIdx.x / kSlots, c = threadIdx.x % kSlots;\n#endif" in common
    assert "#define DKV_ROWS_TID_AGAIN 0" in common
    setters = [path.name for path in CSRC.glob("*.cu*") if "#define DKV_ROWS_TID_AGAIN 1" in path.read_text()]
    assert setters == ["bwd_dkdv.cu"], setters
    split_specs = [spec for spec in all_specs("sm_80") if spec.split_tiles]
    assert {spec.head_dim for spec in split_specs} == (set(ORDERED_HEAD_DIMS) if TWO_LEVEL_SHARED_FIRST else set())
    assert all(spec.dq_ordered and spec.causal and spec.root_first and not spec.tree for spec in split_specs)


def test_counters_index_every_query_tile_once():
    """The launcher's counter table: tile t of segment s at qtile_offset[s] + t, all inside n_qtiles."""
    from dualkv.cuda.launch import _dq_counters

    seg = GroupLayout.from_lengths([1, 300], [[63, 65], [129, 1, 64]]).segment_table
    sems, offset, n_qtiles = _dq_counters(torch.from_numpy(seg), int(seg[:, 1].sum()), 3, 64)
    tiles = [(s, t) for s in range(seg.shape[0]) for t in range(-(-int(seg[s, 1]) // 64))]
    index = [int(offset[s]) + t for s, t in tiles]
    assert sorted(index) == list(range(len(tiles))) and len(tiles) <= n_qtiles
    assert sems.shape == (3, n_qtiles) and sems.dtype == torch.int32 and not sems.any()


@pytest.mark.parametrize("seed", range(4))
def test_tree_counters_receive_ranks_in_order(seed):
    """Prefix forests (the DKV_TREE=1 build): the ancestor-chain ranks at the kernel's geometry, in the tree plan's
    launch order (deeper nodes first); shallow-first is caught."""
    for d in (64, 128):
        geo = mma_geometry(d)
        for layout in _forests(seed, 15):
            rows, tiles, ranks = _schedule(layout)
            check_dq_order(tiles, rows, 2, tree=ranks, geo=geo)
    rows, tiles, ranks = _schedule(_deep_tree())
    shallow_first = tiles[np.argsort(ranks.depth[tiles[:, 0]], kind="stable")]
    with pytest.raises(RuntimeError, match="not 0..k-1"):
        check_dq_order(shallow_first, rows, tree=ranks, geo=mma_geometry(128))
    with pytest.raises(ValueError, match="causal kernels only"):
        check_dq_order(tiles, rows, tree=ranks, geo=mma_geometry(128, causal=False))


def test_tree_replay_equals_the_tree_reference():
    from dualkv import PrefixTreeLayout
    from dualkv.reference.tree import tree_attention

    geo = mma_geometry(128)
    two_roots = PrefixTreeLayout([129, 63, 65, 1, 127, 129, 64, 1, 65], [-1, 0, 1, 1, 0, 4, 4, -1, 7])
    for layout in (_deep_tree(), two_roots):
        q, k, v, dout = _float64_case(layout)
        scale = q.shape[-1] ** -0.5
        ts = [t.clone().requires_grad_() for t in (q, k, v)]
        want = torch.autograd.grad((tree_attention(*ts, layout, softmax_scale=scale) * dout).sum(), ts)
        rows, tiles, _ = _schedule(layout)
        dq, _, _, dk, dv = numeric_backward(q, k, v, k, v, dout, rows, tiles, scale, tree=layout, geo=geo)
        for got, ref in zip((dq, dk, dv), want):
            torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)


def test_tree_plans_give_the_ordered_kernel_its_counters():
    """The launcher's tree counters: one per (head, token), no offsets."""
    from dualkv.cuda.launch import _dq_counters

    sems, offset, n_qtiles = _dq_counters(torch.zeros(40, dtype=torch.int32), 300, 4, 64, tree=True)
    assert offset is None and n_qtiles == 300 and sems.shape == (4, 300) and not sems.any()


def _kernel_walk(tile, seg: np.ndarray, group: int, geo: Geometry) -> list[tuple[int, int, int]]:
    """(segment, query tile, head) of every step of csrc/keywalk.cuh's rank-ordered Walk (first / next / enter /
    next_src), transcribed statement by statement: source 0 is the own segment when there is one."""
    own_seg, blk, dep_begin, dep_end = tile
    n_src = (1 if own_seg >= 0 else 0) + dep_end - dep_begin
    key0 = blk * geo.block_keys
    seg_of = lambda src: (own_seg if src == 0 else dep_begin + src - 1) if own_seg >= 0 else dep_begin + src  # noqa
    is_own = lambda src: own_seg >= 0 and src == 0  # noqa: E731

    def rng(src):
        q_len = int(seg[seg_of(src), 1])
        return ((key0 if geo.causal else 0) if is_own(src) else 0), q_len - 1

    def next_src(src):
        if own_seg >= 0 and src == 0:
            return -1
        if src + 1 < n_src:
            return src + 1
        return 0 if own_seg >= 0 else -1

    def enter(src):
        while src >= 0:
            lo, hi = rng(src)
            if lo <= hi:
                return [0, src, lo + (hi - lo) // geo.step * geo.step if is_own(src) else lo, hi, True]
            src = next_src(src)
        return [0, 0, 0, 0, False]

    c, steps = enter(1 if own_seg >= 0 and n_src > 1 else 0), []
    while c[4]:
        steps.append((seg_of(c[1]), c[2] // geo.step, c[0]))
        c[0] += 1
        if c[0] < group:
            continue
        c[0] = 0
        if is_own(c[1]):
            c[2] -= geo.step
            c[4] = c[2] >= (key0 if geo.causal else 0)
        else:
            c[2] += geo.step
            if c[2] > c[3]:
                c = enter(next_src(c[1]))
    return steps


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
def test_kernel_walk_is_the_ranked_walk(causal):
    """The kernel's cursor logic (transcribed) visits exactly ws_schedule.walk's steps in its order, so the ranks
    checked above are the ones the kernel's steps carry."""
    rng = random.Random(7)
    geo = replace(mma_geometry(128), causal=causal)
    tables = [(_call2_table(rng), False) for _ in range(15)]
    if causal:
        tables += [(layout.segment_table, True) for layout in _group_layouts(rng, 15)]
    for seg, ctx_shared in tables:
        for tile in key_tiles(seg, geo.block_keys, ctx_shared, causal).tolist():
            for group in (1, 3):
                want = [(s.seg, s.qt, s.head) for s in ws_schedule.walk(tile, seg, group, geo)]
                assert _kernel_walk(tile, seg, group, geo) == want, (tile, seg.tolist())


class _StandInKernel:
    """A loaded kernel that records its launches instead of running (the CPU has no GPU)."""

    def __init__(self, spec, log):
        self.spec, self.log = spec, log

    def launch(self, grid, args):
        self.log.append((self.spec, grid, args))


@pytest.fixture
def stand_in_launches(monkeypatch) -> list:
    """run_backward on the CPU with stand-in kernels (sm_80): the (spec, grid, args) of every launch, in order."""
    from dualkv.cuda import launch

    log = []
    monkeypatch.setattr(launch, "device_index", lambda t: 0)
    monkeypatch.setattr(launch, "arch_of", lambda device: "sm_80")
    monkeypatch.setattr(launch, "get_kernel", lambda spec, device: _StandInKernel(spec, log))
    monkeypatch.setattr(launch, "run_prep", lambda dout, out, lse, d_lse: (lse.clone(), lse.clone()))
    return log


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "split"])
def test_backward_routes_each_key_tile_order(monkeypatch, stand_in_launches, ordered):
    """run_backward's wiring with stand-in kernels: the ordered dK/dV kernel gets the plan's launch order (its dQ
    ranks need it), a 1-D grid of tiles x K/V heads, zeroed counters and the dq cast; the split pair keeps the
    heaviest-first table for its dK/dV kernel. A table in the wrong slot would be seen here."""
    from dualkv.cuda import launch

    log = stand_in_launches
    layout = GroupLayout.from_lengths([200, 70], [[129, 5], [64, 1, 300]])
    plan = launch.make_plan(layout.segment_table, head_dim=64, group_size=2, window_left=-1,
                            device=torch.device("cpu"), ctx_shared=True, fwd_kernel="fwd")
    assert not torch.equal(plan.key_tiles, plan.dkdv_key_tiles)
    t = layout.total_tokens
    q, dout, out = (torch.zeros(t, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    k = torch.zeros(t, 2, 64, dtype=torch.bfloat16)
    lse = torch.zeros(4, t)
    with mma_backward("ordered" if ordered else "split"):
        launch.run_backward(dout, q, k, k, k, k, out, lse, plan.segments, plan.dq_tiles, plan.key_tiles,
                            plan.dq_pack, True, scale=0.125, window_left=-1, dkdv_key_tiles_t=plan.dkdv_key_tiles)
    dkdv = [(spec, grid, args) for spec, grid, args in log if spec.kernel == "bwd_dkdv"]
    assert len(dkdv) == 1
    spec, grid, args = dkdv[0]
    n_tiles = plan.key_tiles.shape[0]
    # (..., kv_heads, first_tiles, segments, key tiles, 4 scalars, 4 split arguments: nothing split in this plan)
    segments, tiles, first_tiles, kv_heads = args[-10], args[-9], args[-11], args[-12]
    assert [int(a) for a in args[-4:]] == [0, 0, 1, 0]
    assert spec.dq_ordered == ordered and segments == plan.segments.data_ptr()
    assert not spec.split_tiles and "DKV_SPLIT_TILES" not in dict(spec.defines())  # the build without the split epilogue
    if ordered:
        assert grid == (n_tiles * 2, 1, 1) and kv_heads == 2               # a 1-D grid of tiles x K/V heads
        assert first_tiles == (n_tiles if launch.MMA_HEAD_MAJOR else -1)  # the plan gave no split: the whole table
        assert tiles == plan.key_tiles.data_ptr()
        assert [s.kernel for s, _, _ in log] == ["bwd_dkdv", "bwd_dq_frag_cast"]
    else:
        assert grid == (n_tiles, 2, 1) and tiles == plan.dkdv_key_tiles.data_ptr()
        assert [s.kernel for s, _, _ in log] == ["bwd_dq", "bwd_dkdv"]


def test_ordered_cta_split_argument(monkeypatch):
    """The ordered kernel's first_tiles: -1 (a row's KV heads adjacent) without the head-major setting or on a tree;
    else the plan's split, or the whole table when none is given; a split outside the table raises (the kernel would
    read past it)."""
    from dualkv.cuda import launch

    tiles = torch.zeros(7, 4, dtype=torch.int32)
    monkeypatch.setattr(launch, "MMA_HEAD_MAJOR", False)
    assert launch._mma_cta_split(tiles, False, 3) == -1
    monkeypatch.setattr(launch, "MMA_HEAD_MAJOR", True)
    assert launch._mma_cta_split(tiles, False, 3) == 3
    assert launch._mma_cta_split(tiles, False, None) == 7
    assert launch._mma_cta_split(tiles, True, 3) == -1
    for bad in (-1, 8):
        with pytest.raises(ValueError, match="ws_first_tiles must lie in"):
            launch._mma_cta_split(tiles, False, bad)


def test_run_backward_hands_the_plans_split_to_the_ordered_kernel(monkeypatch, stand_in_launches):
    """With the head-major setting, the ordered kernel's first_tiles argument is the plan's split (the shared-first
    plan's count of shared-key tiles), handed through run_backward."""
    from dualkv.cuda import launch

    log = stand_in_launches
    monkeypatch.setattr(launch, "TWO_LEVEL_SHARED_FIRST", True)
    monkeypatch.setattr(launch, "MMA_HEAD_MAJOR", True)
    layout = GroupLayout.from_lengths([200, 70], [[129, 5], [64, 1, 300]])
    plan = launch.make_plan(layout.segment_table, head_dim=64, group_size=2, window_left=-1,
                            device=torch.device("cpu"), ctx_shared=True, fwd_kernel="fwd")
    assert 0 < plan.ws_first_tiles < plan.key_tiles.shape[0]
    t = layout.total_tokens
    q, dout, out = (torch.zeros(t, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    k = torch.zeros(t, 2, 64, dtype=torch.bfloat16)
    with mma_backward("ordered"):
        launch.run_backward(dout, q, k, k, k, k, out, torch.zeros(4, t), plan.segments, plan.dq_tiles,
                            plan.key_tiles, plan.dq_pack, True, scale=0.125, window_left=-1,
                            ws_first_tiles=plan.ws_first_tiles)
    (args,) = [a for spec, _, a in log if spec.kernel == "bwd_dkdv"]
    assert args[-11] == plan.ws_first_tiles and args[-12] == 2  # first_tiles after kv_heads (then 8 more arguments)


@pytest.mark.parametrize("head_major", [True, False], ids=["head", "tile"])
def test_run_backward_hands_a_split_table_to_the_ordered_kernel(monkeypatch, stand_in_launches, head_major):
    """A plan with split shared-key tiles (ws_split): the ordered kernel runs the split table on a grid of its rows x
    K/V heads, its head-major split moved by the rows added (tile order: -1), and gets slots and counters for the
    partial rows and the number of parts as its last four arguments."""
    from dualkv.cuda import launch, split_args

    log = stand_in_launches
    monkeypatch.setattr(launch, "TWO_LEVEL_SHARED_FIRST", True)
    monkeypatch.setattr(launch, "MMA_HEAD_MAJOR", head_major)
    monkeypatch.setattr(launch, "WS_SPLIT", "auto")
    layout = GroupLayout.from_lengths([200, 70], [[129, 5], [64, 3, 300]])  # every prompt has >= 2 responses
    plan = launch.make_plan(layout.segment_table, head_dim=64, group_size=2, window_left=-1,
                            device=torch.device("cpu"), ctx_shared=True, fwd_kernel="fwd", kv_heads=2, sms=132)
    assert plan.split_parts == 2
    rows, added = plan.split_key_tiles.shape[0], plan.split_key_tiles.shape[0] - plan.key_tiles.shape[0]
    t = layout.total_tokens
    q, dout, out = (torch.zeros(t, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    k = torch.zeros(t, 2, 64, dtype=torch.bfloat16)
    with mma_backward("ordered"):
        launch.run_backward(dout, q, k, k, k, k, out, torch.zeros(4, t), plan.segments, plan.dq_tiles,
                            plan.key_tiles, plan.dq_pack, True, scale=0.125, window_left=-1,
                            ws_first_tiles=plan.ws_first_tiles, split_key_tiles_t=plan.split_key_tiles,
                            split_parts=plan.split_parts)
    ((spec, grid, args),) = [entry for entry in log if entry[0].kernel == "bwd_dkdv"]
    assert grid == (rows * 2, 1, 1) and args[-9] == plan.split_key_tiles.data_ptr()
    assert args[-11] == (plan.ws_first_tiles + added if head_major else -1)
    assert args[-4] != 0 and args[-3] != 0 and int(args[-2]) == 2 and int(args[-1]) == plan.ws_first_tiles * 2
    assert split_args.part_slot_floats(spec) > 0
    assert spec.split_tiles and dict(spec.defines())["DKV_SPLIT_TILES"] == "1"  # the build with the split sum
