"""GPU: the backwards whose dQ adds in a fixed order with split shared-key tiles (dualkv/cuda/ws_split.py): the
warp-specialised one (Hopper) at every head dim it serves, and the mma.sync ordered dQ mode (any GPU), meet
FlashAttention's criterion against the float64 oracle with the tiles cut into 2 and 3 parts; dQ keeps the unsplit
kernel's bits, dK / dV stay bitwise reproducible run to run, and the split really ran."""

import pytest
import torch

import dualkv
from dualkv import GroupLayout
from dualkv.testing import assert_rows_pass
from dualkv.verify.checks import AttentionCase, shared_prefix_check, two_call_check

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_debug")]

PROMPTS, RESPONSES = (300, 129), ((65, 1, 200, 63, 129), (64, 127, 2))


@pytest.fixture
def split_runs(monkeypatch):
    """Hopper only; records the (parts, partial rows) each warp-specialised backward launch got."""
    from dualkv.cuda import launch
    from dualkv.cuda.runtime import arch_of

    if arch_of(0) != "sm_90":
        pytest.skip("the warp-specialised backward is Hopper-only")
    seen, real = [], launch._run_backward_ws
    monkeypatch.setattr(launch, "_run_backward_ws", lambda *a, **k: seen.append(a[19]) or real(*a, **k))
    return seen


def _grads(layout, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(dualkv.shared_prefix_attention(q, k, v, layout), (q, k, v), dout)


@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_split_backward_meets_the_criterion(head_dim, split_runs, monkeypatch):
    from dualkv.cuda import launch

    case = AttentionCase(PROMPTS, RESPONSES, 8, 2, head_dim, window=(-1, -1))
    for parts in ("3", "2"):
        monkeypatch.setattr(launch, "WS_SPLIT", parts)
        split_runs.clear()
        assert_rows_pass(shared_prefix_check(case, dtype=torch.bfloat16, device="cuda"))
        # every prompt has >= 3 responses: each of its key tiles became `parts` CTAs
        assert split_runs and all(s[0] == int(parts) and s[1] > 0 for s in split_runs), split_runs


def test_split_backward_of_the_paper_api(split_runs, monkeypatch):
    """Call 2's separate context: its tiles split into context-only rows."""
    from dualkv.cuda import launch

    monkeypatch.setattr(launch, "WS_SPLIT", "3")
    case = AttentionCase((257,), ((1, 63, 129, 300),), 8, 2, 128, window=(-1, -1))
    assert_rows_pass(two_call_check(case, dtype=torch.bfloat16, device="cuda"))
    assert any(s[0] == 3 for s in split_runs), split_runs


@pytest.mark.parametrize("head_dim", [128, 256])
def test_split_keeps_dq_bits_and_is_reproducible(head_dim, split_runs, monkeypatch):
    """dQ: the same contributions added in the same order, so the unsplit kernel's bits. dK / dV: summed in part
    order whichever CTA finishes last, so the same bits every run (and FlashAttention-level agreement with the
    unsplit sum, which rounds in another order)."""
    from dualkv.cuda import launch

    gen = torch.Generator(device="cuda").manual_seed(3)
    tokens = GroupLayout.from_lengths(PROMPTS, RESPONSES).total_tokens
    q = torch.randn(tokens, 8, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(tokens, 2, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    dout = torch.randn_like(q)
    runs = {}
    for parts in ("off", "3", "3", "3", "2"):
        monkeypatch.setattr(launch, "WS_SPLIT", parts)
        runs.setdefault(parts, []).append(_grads(GroupLayout.from_lengths(PROMPTS, RESPONSES), q, k, v, dout))
    assert [s[0] for s in split_runs] == [1, 3, 3, 3, 2], split_runs
    off = runs["off"][0]
    for got in runs["3"][1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs["3"][0], got)), "split dK / dV differ between runs"
    for got in (runs["3"][0], runs["2"][0]):
        assert torch.equal(got[0], off[0]), "dQ changed with the split"
        for a, b in zip(got[1:], off[1:]):
            assert (a.float() - b.float()).abs().max() <= 1e-2 * b.float().abs().max()


@pytest.fixture
def mma_ordered_runs(monkeypatch):
    """The mma.sync family with its ordered dQ mode (what an A100 runs by default here); records the (parts, partial
    rows) each launch of that mode got."""
    from dualkv.cuda import launch
    from dualkv.cuda.configs import kernel_family, mma_backward

    seen, real = [], launch._run_dkdv_ordered
    monkeypatch.setattr(launch, "_run_dkdv_ordered", lambda *a, **k: seen.append(a[11]) or real(*a, **k))
    with kernel_family("mma"), mma_backward("ordered"):
        yield seen


@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_mma_ordered_split_meets_the_criterion(head_dim, mma_ordered_runs, monkeypatch):
    """The mma.sync ordered dQ mode runs the same split table (split_parts.cuh in bwd_dkdv.cu)."""
    from dualkv.cuda import launch

    case = AttentionCase(PROMPTS, RESPONSES, 8, 2, head_dim, window=(-1, -1))
    for parts in ("3", "2"):
        monkeypatch.setattr(launch, "WS_SPLIT", parts)
        mma_ordered_runs.clear()
        assert_rows_pass(shared_prefix_check(case, dtype=torch.bfloat16, device="cuda"))
        assert mma_ordered_runs and all(s[0] == int(parts) and s[1] > 0 for s in mma_ordered_runs), mma_ordered_runs


def test_mma_ordered_split_keeps_dq_bits_and_is_reproducible(mma_ordered_runs, monkeypatch):
    from dualkv.cuda import launch

    gen = torch.Generator(device="cuda").manual_seed(4)
    tokens = GroupLayout.from_lengths(PROMPTS, RESPONSES).total_tokens
    q = torch.randn(tokens, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(tokens, 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    dout = torch.randn_like(q)
    runs = {}
    for parts in ("off", "3", "3", "3"):
        monkeypatch.setattr(launch, "WS_SPLIT", parts)
        runs.setdefault(parts, []).append(_grads(GroupLayout.from_lengths(PROMPTS, RESPONSES), q, k, v, dout))
    assert [s[0] for s in mma_ordered_runs] == [1, 3, 3, 3], mma_ordered_runs
    for got in runs["3"][1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs["3"][0], got)), "split dK / dV differ between runs"
    assert torch.equal(runs["3"][0][0], runs["off"][0][0]), "dQ changed with the split"
    for a, b in zip(runs["3"][0][1:], runs["off"][0][1:]):
        assert (a.float() - b.float()).abs().max() <= 1e-2 * b.float().abs().max()
