"""GPU (Hopper): prefix trees through the warp-specialised backward (the DKV_TREE=1 build of csrc/bwd_sm90_ws.cu):
against the float64 tree reference with FlashAttention's criterion, bitwise deterministic run to run, the same bits
as the two-level layout's warp-specialised backward on a depth-1 tree, and the launch record shows that the tree WS
kernel ran (and the wgmma dQ / dK/dV pair did not). ``kernel_family("wgmma_v1")`` still runs that pair."""

import pytest
import torch

from dualkv import GroupLayout, PrefixTreeLayout
from dualkv.reference.tree import tree_attention as reference_tree
from dualkv.testing import cancellation_slack, compare

from test_tree_cuda import SHAPES, _depth_one_through_tree_kernels, _inputs, _run, assert_pass

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_debug")]

WS_SHAPES = {
    **{name: SHAPES[name] for name in ("awkward", "single tokens", "deep")},
    # depth 3, multi-block nodes on every level: a query tile receives blocks of three ancestors
    "chain of blocks": PrefixTreeLayout([200, 129, 65, 300, 1, 130], [-1, 0, 1, 2, 0, 4]),
    # many CTAs at once (deadlock-prone if a rank were launched after a higher one): 2K root, 8 branches of 1K,
    # each with 8 leaves of 257 tokens
    "wide and deep": PrefixTreeLayout([2048] + [1024, *[257] * 8] * 8,
                                      [-1] + [p for b in range(8) for p in [0] + [1 + 9 * b] * 8]),
}


@pytest.fixture
def launched(launched_specs):
    """conftest's launched_specs (every kernel spec the launchers load, in call order), on sm_90 only."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialised backward is built for sm_90 (H100/H200)")
    return launched_specs


def assert_ws_tree_backward_ran(specs):
    from dualkv.cuda.configs import TREE_DQ_ROOT_FIRST

    kernels = {(s.kernel, s.tree) for s in specs}
    assert ("bwd_sm90_ws", True) in kernels, kernels
    # the build of this process's tree dQ order (DUALKV_TREE_DQ_ORDER) ran
    assert {s.root_first for s in specs if s.kernel == "bwd_sm90_ws" and s.tree} == {TREE_DQ_ROOT_FIRST}, specs
    assert not {"bwd_dq_sm90", "bwd_dkdv_sm90", "bwd_dq", "bwd_dkdv"} & {k for k, _ in kernels}, kernels


def ws_rows(layout, *, heads=8, kv_heads=2, dtype=torch.bfloat16, seed=0, ref_device="cpu", head_dim=128):
    """{quantity: Comparison} of the default (auto) kernels against the float64 tree reference (computed on
    ``ref_device``), with PyTorch's reference at ``dtype`` on the GPU as the low-precision baseline."""
    q, k, v, g = _inputs(layout, heads, kv_heads, head_dim, seed)
    q, k, v = (t.to(dtype).double() for t in (q, k, v))
    ref = _run(layout, q, k, v, g, device=ref_device, dtype=torch.float64, fn=reference_tree)
    lowp = _run(layout, q, k, v, g, device="cuda", dtype=dtype, fn=reference_tree)
    got = _run(layout, q, k, v, g, device="cuda", dtype=dtype)
    rows = {"out": compare(got[0], ref[0].cpu(), dtype=dtype, ref_lowp=lowp[0])}
    rows["lse"] = compare(got[1].float().cpu(), ref[1].cpu(), dtype=torch.float32)
    floor = cancellation_slack(q, k, v, g)
    for i, name in enumerate(("dq", "dk", "dv")):
        rows[name] = compare(got[2][i], ref[2][i].cpu(), dtype=dtype, ref_lowp=lowp[2][i], is_grad=True,
                             fp32_floor=floor if name != "dv" else 0.0)
    return rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", list(WS_SHAPES))
def test_tree_ws_backward_meets_the_rule(shape, dtype, launched):
    layout = WS_SHAPES[shape]
    ref_device = "cuda" if layout.total_tokens > 4096 else "cpu"  # float64 reference of the big tree on the GPU
    assert_pass(ws_rows(layout, dtype=dtype, ref_device=ref_device), f"{shape} {dtype} (WS tree backward)")
    assert_ws_tree_backward_ran(launched)


@pytest.mark.parametrize("head_dim", [64, 96, 192, 256])
@pytest.mark.parametrize("shape", ["awkward", "chain of blocks", "wide and deep"])
def test_tree_ws_backward_other_head_dims(shape, head_dim, launched):
    """The head-dim-64 build (dQ's B from a transposed copy of K), the head-dim-96 one (128-column tiles) and the wide
    ones (192, 256: 64-key tiles, so the tree table's ancestor blocks and the ranks count 64-key blocks) on trees."""
    layout = WS_SHAPES[shape]
    ref_device = "cuda" if layout.total_tokens > 4096 else "cpu"
    assert_pass(ws_rows(layout, head_dim=head_dim, ref_device=ref_device), f"{shape} d={head_dim} (WS tree backward)")
    assert_ws_tree_backward_ran(launched)
    assert any(s.kernel == "bwd_sm90_ws" and s.head_dim == head_dim for s in launched), launched


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 1), (32, 8)])
def test_tree_ws_backward_gqa(heads, kv_heads, launched):
    assert_pass(ws_rows(WS_SHAPES["chain of blocks"], heads=heads, kv_heads=kv_heads), f"GQA {heads}/{kv_heads}")
    assert_ws_tree_backward_ran(launched)


def test_from_sequences_multi_turn(launched):
    gen = torch.Generator().manual_seed(3)
    turns = [torch.randint(0, 50, (n,), generator=gen) for n in (300, 129, 65)]
    history = torch.cat(turns)
    seqs = [torch.cat([history[:300 + 129 * (i % 2)], torch.randint(0, 50, (int(n),), generator=gen)])
            for i, n in enumerate((1, 63, 127, 200, 129))]
    layout, _ = PrefixTreeLayout.from_sequences(seqs)
    assert layout.max_depth == 2  # not a GroupLayout packing: the tree kernels run
    assert_pass(ws_rows(layout), "from_sequences")
    assert_ws_tree_backward_ran(launched)


@pytest.mark.parametrize("head_dim", [128, 256])
def test_tree_ws_backward_is_bitwise_deterministic(head_dim, launched):
    layout = WS_SHAPES["wide and deep"]
    q, k, v, g = _inputs(layout, 8, 2, head_dim)
    first = _run(layout, q, k, v, g, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        again = _run(layout, q, k, v, g, device="cuda", dtype=torch.bfloat16)
        for name, a, b in zip(("dq", "dk", "dv"), first[2], again[2]):
            assert torch.equal(a, b), f"{name} differs between runs"
    assert_ws_tree_backward_ran(launched)


def test_depth_one_tree_ws_backward_equals_the_group_layout_bits(launched):
    """A depth-1 tree's tree ranks are the two-level ranks and its key tiles walk the same queries in the same order,
    so the tree build of the WS backward must give the two-level build's bits (dQ adds in the same order) when the
    tree and two-level dQ orders agree (root-first and shared-first, the defaults; nearest-first and own-first); when
    they differ, the dK/dV bits, and dQ up to rounding."""
    from dualkv.cuda.configs import TREE_DQ_ROOT_FIRST, TWO_LEVEL_SHARED_FIRST

    group = GroupLayout.from_lengths([129, 1, 300], [[63, 65, 1], [127], [129, 2, 64, 200]])
    q, k, v, g = _inputs(group, 8, 2, 128)
    via_tree, via_group = _depth_one_through_tree_kernels(group, q, k, v, g, "auto")
    for name, a, b in zip(("dq", "dk", "dv"), via_tree[2], via_group[2]):
        if name == "dq" and TREE_DQ_ROOT_FIRST != TWO_LEVEL_SHARED_FIRST:  # the prompt's blocks added at another point
            err = (a.float() - b.float()).abs().max().item()
            assert err <= 1e-2 * b.float().abs().max().item(), f"dq: tree build differs by {err} (other dQ order)"
            continue
        assert torch.equal(a, b), f"{name}: tree WS build differs from the two-level WS build"
    assert {(s.kernel, s.tree) for s in launched} >= {("bwd_sm90_ws", True), ("bwd_sm90_ws", False)}


def test_wgmma_v1_family_keeps_the_two_kernel_tree_backward(launched):
    from dualkv.cuda.configs import kernel_family

    layout = WS_SHAPES["chain of blocks"]
    q, k, v, g = _inputs(layout, 8, 2, 128)
    with kernel_family("wgmma_v1"):
        v1 = _run(layout, q, k, v, g, device="cuda", dtype=torch.bfloat16)
    assert {"bwd_dq_sm90", "bwd_dkdv_sm90"} <= {s.kernel for s in launched}
    assert "bwd_sm90_ws" not in {s.kernel for s in launched}
    launched.clear()
    ws = _run(layout, q, k, v, g, device="cuda", dtype=torch.bfloat16)
    assert_ws_tree_backward_ran(launched)
    for name, a, b in zip(("dq", "dk", "dv"), ws[2], v1[2]):  # two kernels, one result (up to rounding)
        err = (a.float() - b.float()).abs().max().item()
        assert err <= 2e-2 * b.float().abs().max().item(), f"{name}: WS and wgmma_v1 differ by {err}"
