"""GPU: the mma.sync kernels' ordered-dQ backward (``mma_backward("ordered")``, csrc/bwd_dkdv.cu DKV_DQ_ORDERED:
dQ = dS K inside the dK/dV kernel, added in a fixed order) — all gradients against the float64 oracle by
FlashAttention's rule (3x for gradients), awkward lengths, N = 1, GQA ratios, every head dim it has, causal and not,
prefix trees (its DKV_TREE=1 build), bitwise determinism, and windowed calls left on the separate dQ kernel. Outputs are
NaN-poisoned before every launch and every launch is checked (``cuda_debug``). Under ``kernel_family("mma")`` so
that a Hopper GPU runs the mma.sync kernels (what sm_80 runs) too."""

import contextlib

import pytest
import torch

import dualkv
from dualkv import GroupLayout, PrefixTreeLayout
from dualkv.cuda import launch
from dualkv.cuda.configs import ORDERED_HEAD_DIMS, kernel_family, mma_backward
from dualkv.testing import assert_rows_pass
from dualkv.verify.cases import random_cases
from dualkv.verify.checks import AttentionCase, shared_prefix_check

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_debug")]

AWKWARD = (1, 63, 65, 127, 129)


@pytest.fixture
def ordered(monkeypatch):
    """The ordered backward in force; yields the list of its launches (head dim per call), so a test can tell that
    it ran rather than the separate dQ kernel."""
    calls = []
    real = launch._run_dkdv_ordered

    def spy(grads, scalars, q, *args, **kwargs):
        calls.append(q.shape[-1])
        return real(grads, scalars, q, *args, **kwargs)

    monkeypatch.setattr(launch, "_run_dkdv_ordered", spy)
    with contextlib.ExitStack() as stack:
        stack.enter_context(kernel_family("mma"))
        stack.enter_context(mma_backward("ordered"))
        yield calls


def _sweep():
    return random_cases(16, 13, prompt_lens=AWKWARD + (1000,), response_lens=AWKWARD, group_sizes=(1, 2, 3, 5),
                        head_dims=ORDERED_HEAD_DIMS, window_share=0.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", _sweep(), ids=lambda c: c.name)
def test_shared_prefix_gradients(case, dtype, ordered):
    assert_rows_pass(shared_prefix_check(case, dtype=dtype, device="cuda"))
    assert ordered and set(ordered) == {case.head_dim}


@pytest.mark.parametrize("head_dim", ORDERED_HEAD_DIMS)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (8, 1), (32, 8)])
def test_head_dims_and_gqa_ratios(head_dim, heads, kv_heads, ordered):
    case = AttentionCase((300, 65), ((129, 1, 63), (127,)), heads, kv_heads, head_dim)
    assert_rows_pass(shared_prefix_check(case, dtype=torch.bfloat16, device="cuda"))
    assert ordered


@pytest.mark.parametrize("lengths", [(1, (1,)), (63, (65,)), (129, (127,)), (1000, (1,)), (65, (1000,))],
                         ids=lambda l: f"P{l[0]}:R{l[1][0]}")
def test_one_response(lengths, ordered):
    """N = 1: the prompt's key tiles have one dependent."""
    case = AttentionCase((lengths[0],), (lengths[1],), 8, 2, 128)
    assert_rows_pass(shared_prefix_check(case, dtype=torch.bfloat16, device="cuda"))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
@pytest.mark.parametrize("case", ["training", "prompt_rows", "fewer_rows", "mixed", "no_context"])
def test_paper_api(case, causal, ordered):
    """Call 2 on a separate context tensor (several context lengths, context-free segments), causal or not."""
    from test_cuda_paper_api import _check_call2

    _check_call2(case, 64, torch.bfloat16, causal=causal)
    assert ordered


def test_non_causal_context_attention(ordered):
    from dualkv import reference
    from dualkv.testing import compare

    g = torch.Generator().manual_seed(1)
    x = torch.randn(470, 4, 128, generator=g, dtype=torch.float64).to(torch.bfloat16)
    d_out = torch.randn(470, 4, 128, generator=g, dtype=torch.float64).to(torch.bfloat16)
    cu = torch.tensor([0, 300, 301, 470], dtype=torch.int32)
    leaves = [x.cuda().requires_grad_() for _ in range(3)]
    out = dualkv.context_attention(*leaves, cu.cuda(), 300, causal=False)
    got = torch.autograd.grad(out, leaves, d_out.cuda())
    ref_leaves = [x.double().requires_grad_() for _ in range(3)]
    ref = torch.autograd.grad(reference.context_attention(*ref_leaves, cu, 300, causal=False), ref_leaves,
                              d_out.double())
    low_leaves = [x.cuda().requires_grad_() for _ in range(3)]
    low = torch.autograd.grad(reference.context_attention(*low_leaves, cu.cuda(), 300, causal=False), low_leaves,
                              d_out.cuda())
    for a, b, c in zip(got, ref, low):
        assert compare(a, b, dtype=torch.bfloat16, ref_lowp=c, is_grad=True).passed
    assert ordered


def _grads(layout, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(dualkv.shared_prefix_attention(q, k, v, layout), (q, k, v), dout)


def _assert_bitwise_repeatable(layout, heads: int, kv_heads: int, head_dim: int, seed: int) -> None:
    """Three backwards of the same random inputs give bitwise equal dq, dk, dv."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(layout.total_tokens, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(layout.total_tokens, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    dout = torch.randn_like(q)
    runs = [_grads(layout, q, k, v, dout) for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_bitwise_deterministic(head_dim, ordered):
    layout = GroupLayout.from_lengths([3000, 129, 1], [[700, 65, 1, 300, 2048], [64], [1]])
    _assert_bitwise_repeatable(layout, 16, 4, head_dim, seed=1)
    assert len(ordered) == 3


@pytest.mark.parametrize("head_dim", [64, 128])
def test_cta_orders_keep_the_bits(head_dim, ordered, monkeypatch):
    """The ordered kernel's CTA order (tile-major, or head-major split anywhere from none to the whole table) changes
    only when CTAs start: the same bits every time. A wrong blockIdx mapping would drop, repeat or reorder a head's
    key tiles (wrong gradients, or a dQ counter waiting forever)."""
    from cta_split_runs import assert_same_bits, grads_per_split

    def order(head_major):
        return lambda: monkeypatch.setattr(launch, "MMA_HEAD_MAJOR", head_major)

    runs, splits = grads_per_split(monkeypatch, head_dim, 4, [(order(False), "plan"), (order(True), "plan"),
                                                             (None, "none"), (None, "one"), (None, "half")])
    assert len(ordered) == 5 and len(set(splits[1:])) >= 3, (ordered, splits)
    assert_same_bits(runs)


def test_windows_keep_the_dq_kernel(ordered):
    """The mode has no sliding window: windowed calls run the separate dQ kernel, correctly."""
    case = AttentionCase((300,), ((65, 127),), 4, 4, 128, window=(50, 0))
    assert_rows_pass(shared_prefix_check(case, dtype=torch.bfloat16, device="cuda"))
    assert not ordered


@pytest.mark.parametrize("d", ORDERED_HEAD_DIMS)
@pytest.mark.parametrize("shape", ["awkward", "single tokens", "deep", "wide fan"])
def test_prefix_trees(shape, d, ordered):
    """Prefix trees run the tree build (ancestor-chain ranks, counters per query tile's first token)."""
    from test_tree_cuda import SHAPES, assert_pass, tree_rows

    assert isinstance(SHAPES[shape], PrefixTreeLayout)
    assert_pass(tree_rows(SHAPES[shape], d=d, family="mma"), f"{shape} d={d} under the ordered switch")
    assert ordered and set(ordered) == {d}


def test_prefix_tree_backward_is_bitwise_deterministic(ordered):
    from test_tree_cuda import SHAPES

    _assert_bitwise_repeatable(SHAPES["deep"], 8, 2, 128, seed=3)
    assert len(ordered) == 3


def test_matches_the_split_backward():
    """The same gradients as the default (split) mma.sync backward up to fp32 summation order."""
    layout = GroupLayout.from_lengths([1000, 65], [[129, 1, 300], [63]])
    gen = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(layout.total_tokens, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(layout.total_tokens, 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    dout = torch.randn_like(q)
    with kernel_family("mma"):
        split = _grads(layout, q, k, v, dout)
        with mma_backward("ordered"):
            ordered = _grads(layout, q, k, v, dout)
    for a, b in zip(split, ordered):
        scale = a.float().abs().max().item()
        assert (a.float() - b.float()).abs().max().item() <= 2e-2 * scale
