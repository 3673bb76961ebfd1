"""GPU: head dim 96 on Hopper runs the wgmma forward and the warp-specialised backward (kernel_family("wgmma_v1"):
the first wgmma backward pair, bwd_dq_sm90 + bwd_dkdv_sm90), all on tiles of two 64-column atoms (csrc/sm90.cuh),
and meets FlashAttention's bounds against the float64 N-copy oracle, bitwise deterministic; the CPU side of the
layout is proofs_tests/test_cuda_swizzle.py."""

from dataclasses import replace

import pytest
import torch

import dualkv
from dualkv import GroupLayout
from dualkv.cuda.configs import TMA_KERNELS, WGMMA_V1_KERNELS, kernel_family
from dualkv.testing import assert_rows_pass, compare
from dualkv.verify.cases import random_cases
from dualkv.verify.checks import AttentionCase, shared_prefix_check, two_call_check

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_debug")]

AWKWARD = (1, 63, 64, 65, 127, 129, 1000)
CASES = [replace(c, head_dim=96) for c in random_cases(12, 7, prompt_lens=AWKWARD, response_lens=AWKWARD[:6],
                                                       group_sizes=(1, 2, 3, 5, 9))]


@pytest.fixture
def hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernels are built for sm_90 (H100/H200)")


def assert_hopper_kernels_ran(specs, backward: bool = True, family: str = "auto", window: bool = False):
    """The Hopper kernels ran at d = 96 on 128-column tiles: the warp-specialised forward (the first wgmma forward
    under kernel_family("wgmma_v1")); the warp-specialised backward (the default without a sliding window) or, with a
    window or under kernel_family("wgmma_v1"), the first wgmma backward pair; no mma.sync kernel."""
    kernels = {s.kernel for s in specs if s.head_dim == 96}
    pair = family == "wgmma_v1" or window
    expected = {"fwd_sm90" if family == "wgmma_v1" else "fwd_sm90_ws"}
    expected |= ({"bwd_dq_sm90", "bwd_dkdv_sm90"} if pair else {"bwd_sm90_ws"}) if backward else set()
    assert expected <= kernels and not {"fwd", "bwd_dq", "bwd_dkdv"} & kernels, kernels
    assert all(s.tile_head_dim == 128 for s in specs if s.kernel in WGMMA_V1_KERNELS + TMA_KERNELS), specs


@pytest.mark.parametrize("family", ["auto", "wgmma_v1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_head_dim_96_on_wgmma_kernels(hopper, launched_specs, case, dtype, family):
    with kernel_family(family):
        assert_rows_pass(shared_prefix_check(case, dtype=dtype, device="cuda"))
    assert_hopper_kernels_ran(launched_specs, family=family, window=case.window != (-1, -1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_head_dim_96_paper_api(hopper, launched_specs, dtype):
    """The two-call API (call 1 causal over the prompts, call 2 the responses against prompt + own keys)."""
    for case in (AttentionCase((129,), ((1, 63, 64, 65, 127),), 8, 2, 96),   # the API takes one group per call
                 AttentionCase((700,), ((300, 2),), 8, 2, 96)):
        assert_rows_pass(two_call_check(case, dtype=dtype, device="cuda"))
    assert_hopper_kernels_ran(launched_specs)


def test_head_dim_96_non_causal_context(hopper, launched_specs):
    """context_attention(causal=False) at d = 96 (the DKV_CAUSAL=0 build) against float64 attention, with PyTorch's
    SDPA at bf16 as the low-precision baseline (FlashAttention's rule, dualkv.testing.compare)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(300, h, 96, device="cuda", generator=g, dtype=torch.bfloat16) for h in (8, 2, 2))
    out = dualkv.context_attention(q, k, v, causal=False)
    # (heads, tokens, d) with the kv heads repeated over their query-head groups
    qh, kh, vh = (t.repeat_interleave(8 // t.shape[1], 1).transpose(0, 1) for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qh.double(), kh.double(), vh.double())
    lowp = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh)
    row = compare(out.transpose(0, 1), ref, dtype=torch.bfloat16, ref_lowp=lowp)
    assert row.passed, row
    assert_hopper_kernels_ran(launched_specs, backward=False)


def _grads(layout, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = dualkv.shared_prefix_attention(q, k, v, layout, return_lse=True)
    return (out.detach(), lse.detach(), *torch.autograd.grad(out, (q, k, v), dout))


def test_head_dim_96_is_bitwise_deterministic(hopper, launched_specs):
    layout = GroupLayout.from_lengths([2000, 129], [[700, 65, 1, 300], [64]])
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(layout.total_tokens, h, 96, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h in (16, 4, 4))
    dout = torch.randn_like(q)
    runs = [_grads(layout, q, k, v, dout) for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
    assert_hopper_kernels_ran(launched_specs)


def test_head_dim_96_wgmma_and_mma_agree(hopper):
    """Both families at a long shape (bf16-close, not bitwise: another summation order)."""
    layout = GroupLayout.from_lengths([3000], [[1, 700, 129, 2048]])
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(layout.total_tokens, h, 96, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h in (16, 4, 4))
    dout = torch.randn_like(q)
    got = _grads(layout, q, k, v, dout)
    with kernel_family("mma"):
        mma = _grads(layout, q, k, v, dout)
    assert (got[0].float() - mma[0].float()).abs().max().item() < 2e-2
    assert (got[1] - mma[1]).abs().max().item() < 1e-3
    for a, b in zip(got[2:], mma[2:]):
        assert (a.float() - b.float()).abs().max().item() <= 2e-2 * max(b.float().abs().max().item(), 1.0)
