"""GPU: the fused forward kernel against the float64 N-copy oracle (FlashAttention's criterion), outputs poisoned
with NaN before every launch and every launch synchronised and error-checked."""

import pytest
import torch

import dualkv
from dualkv import GroupLayout
from dualkv.testing import assert_rows_pass
from dualkv.verify.cases import random_cases
from dualkv.verify.checks import AttentionCase, shared_prefix_check, two_call_check

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_debug")]

AWKWARD = (1, 63, 64, 65, 127, 129, 1000, 4097)
HEAD_DIMS = (32, 64, 96, 128, 192, 256, 512)


def _sweep():
    small = random_cases(20, 0, prompt_lens=AWKWARD[:6], response_lens=AWKWARD[:6], group_sizes=(1, 2, 3, 5, 16))
    big = random_cases(4, 100, prompt_lens=AWKWARD, response_lens=AWKWARD[:6], group_sizes=(1, 2, 8))
    return small + big


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", _sweep(), ids=lambda c: c.name)
def test_shared_prefix_forward(case, dtype):
    assert_rows_pass(shared_prefix_check(case, dtype=dtype, device="cuda", with_grad=False))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_paper_api_every_head_dim(head_dim, dtype):
    case = AttentionCase((129,), ((1, 63, 64, 65, 127),), 8, 2, head_dim)
    assert_rows_pass(two_call_check(case, dtype=dtype, device="cuda", with_grad=False))


@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("case", _sweep()[::3], ids=lambda c: c.name)
def test_mma_forward_on_hopper_too(case, head_dim):
    """On sm_90 the public functions run the wgmma forward for d = 64 / 96 / 128; the mma.sync forward stays correct
    there too (it is what sm_80 runs and what `kernel_family("mma")` selects)."""
    from dataclasses import replace

    from dualkv.cuda.configs import kernel_family

    with kernel_family("mma"):
        assert_rows_pass(shared_prefix_check(replace(case, head_dim=head_dim), dtype=torch.bfloat16, device="cuda",
                                             with_grad=False))


def test_wgmma_and_mma_forwards_agree():
    """Both forwards against each other at a long shape (same rounding order is not expected; bf16-close is)."""
    from dualkv.cuda.configs import forward_kernel_for, kernel_family
    from dualkv.cuda.runtime import arch_of

    if forward_kernel_for(128, arch_of(0)) not in ("fwd_sm90", "fwd_sm90_ws"):
        pytest.skip("no wgmma forward on this GPU")
    layout = GroupLayout.from_lengths([3000], [[1, 700, 129, 2048]])
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(layout.total_tokens, h, 128, device="cuda", generator=g, dtype=torch.bfloat16)
               for h in (16, 4, 4))
    out, lse = dualkv.shared_prefix_attention(q, k, v, layout, return_lse=True)
    with kernel_family("mma"):
        out_mma, lse_mma = dualkv.shared_prefix_attention(q, k, v, layout, return_lse=True)
    assert (out.float() - out_mma.float()).abs().max().item() < 2e-2
    assert (lse - lse_mma).abs().max().item() < 1e-3


def test_many_responses_and_long_prompt():
    case = AttentionCase((4097,), tuple([tuple([1, 63, 65, 127, 129, 64, 2, 1000] * 8)]), 8, 1, 128)  # N = 64
    assert_rows_pass(shared_prefix_check(case, dtype=torch.bfloat16, device="cuda", with_grad=False))


@pytest.mark.parametrize("window", [0, 1, 63, 64, 65, 4000])
def test_windows_cross_the_prompt_boundary(window):
    case = AttentionCase((1000,), ((129, 1, 64),), 4, 4, 64, window=(window, 0))
    assert_rows_pass(shared_prefix_check(case, dtype=torch.bfloat16, device="cuda", with_grad=False))


def test_strided_views_and_several_prompts():
    layout = GroupLayout.from_lengths([100, 37], [[5, 70], [1]])
    qkv = torch.randn(layout.total_tokens, 12, 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv[:, :8], qkv[:, 8:10], qkv[:, 10:]          # non-contiguous head-strided views
    ref = dualkv.reference.shared_prefix_attention(q.double(), k.double(), v.double(), layout)
    out = dualkv.shared_prefix_attention(q, k, v, layout)
    assert (out.double() - ref).abs().max() < 2e-2
    # call 1 over two packed prompts with cu_seqlens
    p = torch.randn(137, 4, 64, device="cuda", dtype=torch.float16)
    cu = torch.tensor([0, 100, 137], dtype=torch.int32, device="cuda")
    ref1 = dualkv.reference.context_attention(p.double(), p.double(), p.double(), cu, 100)
    assert (dualkv.context_attention(p, p, p, cu, 100).double() - ref1).abs().max() < 5e-3


def test_bitwise_deterministic_forward():
    layout = GroupLayout.single(700, [300, 65, 1])
    q = torch.randn(layout.total_tokens, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(layout.total_tokens, 2, 128, device="cuda", dtype=torch.bfloat16)
    a = dualkv.shared_prefix_attention(q, k, k, layout, return_lse=True)
    b = dualkv.shared_prefix_attention(q, k, k, layout, return_lse=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_refusals_on_gpu():
    layout = GroupLayout.single(10, [5])
    x = torch.randn(15, 2, 44, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head_dim 44 is not supported"):
        dualkv.shared_prefix_attention(x, x, x, layout)
    y = torch.randn(15, 2, 512, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="sliding windows"):
        dualkv.shared_prefix_attention(y, y, y, layout, window_size=(4, 0))
    z = torch.randn(15, 2, 32, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="no sliding window with causal=False"):
        dualkv.context_attention(z, z, z, causal=False, window_size=(3, 3))
