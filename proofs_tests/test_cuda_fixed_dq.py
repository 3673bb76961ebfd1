"""GPU: the mma.sync kernels' fixed-point dQ backward (``mma_backward("fixed")``, csrc/bwd_dkdv.cu DKV_DQ_FIXED: dQ
= dS K inside the dK/dV kernel, added as int64 fixed-point numbers at per-row units, in any order;
:mod:`dualkv.cuda.dq_fixed`) — all gradients against the float64 oracle by FlashAttention's rule, awkward lengths,
N = 1, GQA ratios, every head dim it has, windows, causal and not, the paper API, bitwise repeatability, the units
against their PyTorch reference, non-finite inputs, and a known-wrong variant (units of 1) that the checks must catch.
Outputs are NaN-poisoned before every launch and every launch is checked (``cuda_debug``). Under
``kernel_family("mma")`` so that a Hopper GPU runs the mma.sync kernels (what sm_80 runs) too."""

import contextlib
import math

import pytest
import torch

import dualkv
from dualkv import GroupLayout
from dualkv.cuda import launch
from dualkv.cuda.configs import ATOMIC_HEAD_DIMS, kernel_family, mma_backward
from dualkv.cuda.dq_fixed import kv_amax, new_units, row_units
from dualkv.testing import assert_rows_pass
from dualkv.verify.cases import random_cases
from dualkv.verify.checks import AttentionCase, shared_prefix_check

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_debug")]

AWKWARD = (1, 63, 65, 127, 129)


@pytest.fixture
def fixed(monkeypatch):
    """The fixed-point backward in force; yields the list of its launches (head dim per call), so a test can tell
    that it ran rather than another dQ mode."""
    calls = []
    real = launch._run_dkdv_fixed

    def spy(grads, scalars, q, *args, **kwargs):
        calls.append(q.shape[-1])
        return real(grads, scalars, q, *args, **kwargs)

    monkeypatch.setattr(launch, "_run_dkdv_fixed", spy)
    with contextlib.ExitStack() as stack:
        stack.enter_context(kernel_family("mma"))
        stack.enter_context(mma_backward("fixed"))
        yield calls


def _sweep():
    return random_cases(16, 41, prompt_lens=AWKWARD + (1000,), response_lens=AWKWARD, group_sizes=(1, 2, 3, 5),
                        head_dims=ATOMIC_HEAD_DIMS, window_share=0.25)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", _sweep(), ids=lambda c: c.name)
def test_shared_prefix_gradients(case, dtype, fixed):
    assert_rows_pass(shared_prefix_check(case, dtype=dtype, device="cuda"))
    assert fixed and set(fixed) == {case.head_dim}


@pytest.mark.parametrize("head_dim", ATOMIC_HEAD_DIMS)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (8, 1), (32, 8)])
def test_head_dims_and_gqa_ratios(head_dim, heads, kv_heads, fixed):
    case = AttentionCase((300, 65), ((129, 1, 63), (127,)), heads, kv_heads, head_dim)
    assert_rows_pass(shared_prefix_check(case, dtype=torch.bfloat16, device="cuda"))
    assert fixed


@pytest.mark.parametrize("lengths", [(1, (1,)), (63, (65,)), (129, (127,)), (1000, (1,)), (65, (1000,))],
                         ids=lambda l: f"P{l[0]}:R{l[1][0]}")
def test_one_response(lengths, fixed):
    """N = 1: the prompt's key tiles have one dependent."""
    case = AttentionCase((lengths[0],), (lengths[1],), 8, 2, 128)
    assert_rows_pass(shared_prefix_check(case, dtype=torch.bfloat16, device="cuda"))
    assert fixed


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
@pytest.mark.parametrize("case", ["training", "prompt_rows", "fewer_rows", "mixed", "no_context"])
def test_paper_api(case, causal, fixed):
    """Call 2 on a separate context tensor (several context lengths, context-free segments), causal or not."""
    from test_cuda_paper_api import _check_call2

    _check_call2(case, 64, torch.bfloat16, causal=causal)
    assert fixed


def _inputs(layout, heads: int, kv_heads: int, head_dim: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(layout.total_tokens, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(layout.total_tokens, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    return q, k, v, torch.randn_like(q)


def _grads(layout, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(dualkv.shared_prefix_attention(q, k, v, layout), (q, k, v), dout)


@pytest.mark.parametrize("shape", ["4096:16x512", "129:5x65", "2x1000:3x129"])
def test_bitwise_repeatable(shape, fixed):
    """Three backwards of the same inputs give bitwise equal dq, dk, dv, where many CTAs add into every dQ row in an
    order that changes run to run (16 responses on one 4K prompt: 32 key tiles per row of each response)."""
    layouts = {"4096:16x512": GroupLayout.single(4096, [512] * 16),
               "129:5x65": GroupLayout.single(129, [65, 1, 63, 127, 129]),
               "2x1000:3x129": GroupLayout.from_lengths([1000, 1000], [[129] * 3, [65, 1, 127]])}
    layout = layouts[shape]
    q, k, v, dout = _inputs(layout, 8, 2, 128, seed=3)
    runs = [_grads(layout, q, k, v, dout) for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
    assert fixed


def test_units_match_their_reference(fixed):
    """bwd_prep.cu's units equal dq_fixed.row_units bit for bit, including a zero dO row (unit 2^126) and a row of
    huge dO (a small unit); rows past the last token stay 0."""
    tokens, heads, d = 300, 4, 128
    gen = torch.Generator(device="cuda").manual_seed(5)
    dout, out = (torch.randn(tokens, heads, d, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    dout[7] = 0
    dout[11] *= 3e4
    lse = torch.randn(heads, tokens, device="cuda", generator=gen)
    k, v = (torch.randn(tokens, 2, d, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    amax = kv_amax(k, v)
    units = new_units(tokens, heads, dout.device)
    _, delta = launch.run_prep(dout, out, lse, None, units=(units, amax))
    expected = row_units(dout, delta, lse, amax)
    assert torch.equal(units[:, :tokens], expected)
    assert (units[:, tokens:] == 0).all()
    assert (units[:, 7] == 2.0 ** 126).all() and (units[:, 11] < units[:, 12]).all()


def test_non_finite_rows_become_nan(fixed):
    """A NaN in one dO row gives NaN in that dQ row (not a number the integer conversion made up), and every other
    row stays finite and equal to the clean run's where the row's inputs are unchanged."""
    layout = GroupLayout.single(300, [129, 65])
    q, k, v, dout = _inputs(layout, 4, 2, 64, seed=7)
    bad = dout.clone()
    bad[400, 1, 3] = math.nan
    dq = _grads(layout, q, k, v, bad)[0]
    assert torch.isnan(dq[400, 1]).all()
    others = torch.ones(dq.shape[:2], dtype=torch.bool, device=dq.device)
    others[400, 1] = False
    assert torch.isfinite(dq[others]).all()


def test_units_of_one_are_caught(fixed, monkeypatch):
    """Known-wrong variant: every unit 1 (dQ rounded to whole numbers before the cast) must fail the oracle check."""
    real = launch.run_prep

    def ones(dout, out, lse, d_lse=None, units=None):
        result = real(dout, out, lse, d_lse, units=units)
        if units is not None:
            units[0][:, :dout.shape[0]] = 1.0
        return result

    monkeypatch.setattr(launch, "run_prep", ones)
    case = AttentionCase((300,), ((129, 65),), 4, 2, 128)
    rows = shared_prefix_check(case, dtype=torch.bfloat16, device="cuda")
    failed = [r.quantity for r in rows if not r.passed]
    assert failed == ["dq"], failed
