"""Call 1 + call 2 equal the N-copy layout's attention in float64 (outputs, LSE and every gradient, with prompt
gradients summed over the N copies — Eq. 7), checked against PyTorch's own SDPA on the N-copy rows."""

import pytest
import torch

from dualkv.testing import assert_rows_pass
from dualkv.verify.cases import HEAD_DIMS, attention_cases, random_cases
from dualkv.verify.checks import AttentionCase, shared_prefix_check, two_call_check

AWKWARD = (1, 2, 63, 64, 65, 127, 129)


def _assert_rows(rows):
    assert_rows_pass(rows, max_error=1e-10 if rows[0].dtype == "fp64" else None)


RANDOM_CASES = random_cases(16, 0, prompt_lens=AWKWARD, response_lens=AWKWARD, head_dims=(32, 64, 96, 128),
                            windows=(0, 5, 40, 200), window_share=1 / 3)


@pytest.mark.parametrize("seed", range(len(RANDOM_CASES)))
def test_random_awkward_shapes(seed):
    case = RANDOM_CASES[seed]
    _assert_rows(shared_prefix_check(case, seed=seed))
    if len(case.prompt_lens) == 1:
        _assert_rows(two_call_check(case, seed=seed))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_every_head_dim(head_dim):
    case = AttentionCase((65,), ((1, 63),), 4, 2, head_dim)
    _assert_rows(two_call_check(case))


@pytest.mark.parametrize("gqa", [1, 2, 4, 8])
def test_gqa_ratios(gqa):
    case = AttentionCase((33, 7), ((5, 2), (1, 9, 4)), 2 * gqa, 2, 64)
    _assert_rows(shared_prefix_check(case))


@pytest.mark.parametrize("window", [(0, 0), (3, 0), (64, 0), (129, 0), (1000, 0)])
def test_windows_shorter_and_longer_than_prompt(window):
    case = AttentionCase((65,), ((70, 1, 3),), 4, 1, 64, window=window)
    _assert_rows(shared_prefix_check(case))
    _assert_rows(two_call_check(case))


@pytest.mark.parametrize("case", attention_cases(), ids=lambda c: c.name)
def test_verify_matrix(case):
    _assert_rows(shared_prefix_check(case))


def test_float32_and_lower_precision_on_cpu():
    case = AttentionCase((65,), ((63, 2),), 4, 2, 64)
    _assert_rows(shared_prefix_check(case, dtype=torch.float32))
    # bf16 through the reference, judged by FlashAttention's criterion against PyTorch at bf16.
    rows = shared_prefix_check(case, dtype=torch.bfloat16)
    assert all(r.passed for r in rows if r.quantity != "lse"), rows


def test_non_contiguous_inputs():
    from dualkv.reference import shared_prefix_attention, n_copy_attention
    from dualkv import GroupLayout

    layout = GroupLayout.from_lengths([9], [[4, 1]])
    qkv = torch.randn(layout.total_tokens, 3, 4, 8, dtype=torch.float64)
    q, k, v = qkv[:, 0], qkv[:, 1, :2], qkv[:, 2, 2:]
    assert not q.is_contiguous()
    torch.testing.assert_close(shared_prefix_attention(q, k, v, layout), n_copy_attention(q, k, v, layout),
                               rtol=1e-12, atol=1e-12)


def test_memory_sane_large_prompt_forward():
    """A long prompt runs chunked: P = 8192 with 4 responses in fp32 never builds a (T x T) score matrix."""
    from dualkv import GroupLayout
    from dualkv.reference import shared_prefix_attention
    from dualkv.reference import core

    layout = GroupLayout.single(8192, [256, 100, 33, 1])
    q = torch.randn(layout.total_tokens, 2, 32)
    k = torch.randn(layout.total_tokens, 1, 32)
    seen = []
    original = core._chunk_attention

    def spy(q_, k_, v_, mask, scale):
        seen.append(mask.numel() * q_.shape[1])
        return original(q_, k_, v_, mask, scale)

    core._chunk_attention = spy
    try:
        with torch.no_grad():
            out = shared_prefix_attention(q, k, k, layout)
    finally:
        core._chunk_attention = original
    assert torch.isfinite(out).all()
    assert max(seen) <= core.SCORE_BUDGET + 16 * layout.total_tokens * 2


def test_cancellation_floor_covers_fp32_reordering_of_dp_minus_d():
    """With a window of 0 (O = V) dS = dP - D is exactly 0 when dP and D are summed in one order, and not in
    another; cancellation_slack bounds the difference (carried to dQ), so a fp32-accumulating kernel is not
    failed for a rounding PyTorch avoids by luck."""
    from dualkv.testing import cancellation_slack

    g = torch.Generator().manual_seed(0)
    for d in (64, 128, 256):
        q, k, v, d_out = (torch.randn(512, 1, d, generator=g).half().float() for _ in range(4))
        dp = (d_out * v).sum(-1)                                       # one order
        delta = (d_out * v).flip(-1).cumsum(-1)[..., -1]               # another
        d_q = (dp - delta).abs().max().item() * d ** -0.5 * k.abs().max().item()
        floor = cancellation_slack(q, k, v, d_out)
        assert 0 < d_q <= floor, (d, d_q, floor)
    assert cancellation_slack(q, k, v, 2 * d_out) == 2 * floor


# ---------------------------------------------------------------------------------------------- property test
def _dense_n_copy(q, k, v, layout, scale, left, right):
    """Independent float64 oracle: every N-copy row [P; R_i] as one dense masked softmax over its own positions
    (FlashAttention's rule: key j visible to query i iff i - left <= j <= i + right, right capped at 0 by causality),
    GQA by repeat_interleave. Returns the (T_std, H, d) outputs and (H, T_std) LSE of the N-copy rows."""
    expand = torch.from_numpy(layout.copy_token_index)
    cu = layout.copy_cu_seqlens.tolist()
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for a, b in zip(cu, cu[1:]):
        rows = expand[a:b]
        qq, kk, vv = q[rows], k[rows].repeat_interleave(group, 1), v[rows].repeat_interleave(group, 1)
        i = torch.arange(b - a)[:, None]
        j = torch.arange(b - a)[None, :]
        visible = j <= i  # causal: whatever right is, it is capped at 0
        if left >= 0:
            visible = visible & (j >= i - left)
        s = torch.einsum("qhd,khd->hqk", qq, kk) * scale
        s = s.masked_fill(~visible, float("-inf"))
        lses.append(torch.logsumexp(s, -1))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vv))
    return torch.cat(outs, 0), torch.cat(lses, 1)


def _property_cases(n):
    import random

    rng = random.Random(1234)
    lens = (1, 63, 65, 127, 129)
    cases = []
    for _ in range(n):
        groups = rng.choice((1, 1, 2, 3))
        prompts = [rng.choice(lens) for _ in range(groups)]
        responses = [[rng.choice(lens) for _ in range(rng.choice((1, 1, 2, 3)))] for _ in range(groups)]
        kv_heads = rng.choice((1, 2))
        gqa = rng.choice((1, 2, 4, 8))
        head_dim = rng.choice((32, 64, 96, 128, 256))
        window = rng.choice(((-1, -1), (0, 0), (5, 3), (64, 0), (65, -1), (200, 7), (-1, 4)))
        deterministic = rng.choice((None, True, False))
        scale = rng.choice((None, 0.3))
        cases.append((prompts, responses, kv_heads * gqa, kv_heads, head_dim, window, deterministic, scale))
    return cases


@pytest.mark.parametrize("case", _property_cases(12), ids=lambda c: f"P{c[0]}R{c[1]}h{c[2]}/{c[3]}d{c[4]}w{c[5]}")
def test_property_every_reference_path_equals_dense_n_copy(case):
    """float64, awkward lengths (1, 63, 65, 127, 129), N = 1 and several, several groups, GQA 1-8, head dims
    32-256, windows with any (left, right) (right is capped at 0), the deterministic flag: shared_prefix_attention,
    n_copy_attention, the depth-1 tree and the tree entry all equal the dense N-copy oracle in out, LSE (dtype too)
    and dQ/dK/dV (prompt gradients summed over the copies)."""
    import warnings

    from dualkv import GroupLayout, PrefixTreeLayout
    from dualkv.reference import n_copy_attention, shared_prefix_attention, tree_attention
    from dualkv.reference import tree as ref_tree

    prompts, responses, heads, kv_heads, head_dim, window, deterministic, scale = case
    layout = GroupLayout.from_lengths(prompts, responses)
    gen = torch.Generator().manual_seed(len(prompts) * 1000 + head_dim)
    make = lambda h: torch.randn(layout.total_tokens, h, head_dim, generator=gen,  # noqa: E731
                                 dtype=torch.float64).requires_grad_()
    q, k, v = make(heads), make(kv_heads), make(kv_heads)
    expand = torch.from_numpy(layout.copy_token_index)
    back = torch.from_numpy(layout.first_copy_index)
    out_std, lse_std = _dense_n_copy(q, k, v, layout, head_dim ** -0.5 if scale is None else scale, *window)
    g_std = torch.randn(out_std.shape, generator=gen, dtype=torch.float64)
    ref_grads = torch.autograd.grad((out_std * g_std).sum(), (q, k, v))
    g_packed = torch.zeros(q.shape, dtype=torch.float64).index_add_(0, expand, g_std)
    want_out, want_lse = out_std.detach()[back], lse_std.detach()[:, back]
    tree = PrefixTreeLayout.from_group_layout(layout)
    paths = {
        "shared_prefix": lambda: shared_prefix_attention(q, k, v, layout, softmax_scale=scale, window_size=window,
                                                         return_lse=True, deterministic=deterministic),
        "n_copy": lambda: n_copy_attention(q, k, v, layout, softmax_scale=scale, window_size=window, return_lse=True),
        "tree": lambda: tree_attention(q, k, v, tree, softmax_scale=scale, window_size=window, return_lse=True,
                                       deterministic=deterministic),
        "tree_entry": lambda: ref_tree.shared_prefix_attention(q, k, v, layout, softmax_scale=scale,
                                                               window_size=window, return_lse=True,
                                                               deterministic=deterministic),
    }
    for name, fn in paths.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out, lse = fn()
        assert out.dtype == torch.float64 and lse.dtype == torch.float64, name
        assert out.shape == q.shape and lse.shape == (heads, layout.total_tokens), name
        grads = torch.autograd.grad((out * g_packed).sum(), (q, k, v))
        errors = {"out": (out - want_out).abs().max().item(), "lse": (lse - want_lse).abs().max().item()}
        errors.update({n: (g - r).abs().max().item() for n, g, r in zip(("dq", "dk", "dv"), grads, ref_grads)})
        bad = {n: e for n, e in errors.items() if not e <= 1e-10}
        assert not bad, f"{name}: {bad}"
