"""GPU: the backward kernels — all five gradients against the float64 N-copy oracle (FlashAttention's criterion,
3x for gradients), deterministic to the bit, custom-op checks, torch.compile, and a short training run."""

import pytest
import torch

import dualkv
from dualkv import GroupLayout
from dualkv.testing import assert_rows_pass
from dualkv.verify.cases import random_cases
from dualkv.verify.checks import AttentionCase, shared_prefix_check, two_call_check

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_debug")]

AWKWARD = (1, 63, 64, 65, 127, 129, 1000)
HEAD_DIMS = (32, 64, 96, 128, 192, 256, 512)


def _sweep():
    return random_cases(21, 1, prompt_lens=AWKWARD, response_lens=AWKWARD[:6], group_sizes=(1, 2, 3, 5, 9))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", _sweep(), ids=lambda c: c.name)
def test_shared_prefix_gradients(case, dtype):
    assert_rows_pass(shared_prefix_check(case, dtype=dtype, device="cuda"))


@pytest.mark.parametrize("mode", ["auto", "split"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("case", _sweep()[::3], ids=lambda c: c.name)
def test_mma_backward_on_hopper_too(case, head_dim, mode, launched_specs):
    """On sm_90 the public functions run the wgmma kernels for d = 64 / 96 / 128; the mma.sync kernels (what sm_80 runs
    and `kernel_family("mma")` selects) stay correct there too: "auto" (its ordered dQ for these deterministic calls
    without a window, the dQ kernel with one) and the split backward (the dQ kernel beside the dK/dV kernel)."""
    import functools
    from dataclasses import replace

    from dualkv.cuda.configs import kernel_family, mma_backward

    fn = functools.partial(dualkv.shared_prefix_attention, deterministic=True)  # whatever the environment says
    with kernel_family("mma"), mma_backward(mode):
        assert_rows_pass(shared_prefix_check(replace(case, head_dim=head_dim), dtype=torch.bfloat16, device="cuda",
                                             attention_fn=fn))
    ordered = mode == "auto" and case.window == (-1, -1)
    assert any(s.kernel == "bwd_dkdv" and s.dq_ordered for s in launched_specs) == ordered, launched_specs
    assert any(s.kernel == "bwd_dq" for s in launched_specs) == (not ordered), launched_specs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("case", [c for c in _sweep() if c.window == (-1, -1)][::2], ids=lambda c: c.name)
def test_ws_backward_family(case, head_dim, dtype, launched_specs):
    """The one-kernel warp-specialised backward (the sm_90 default at d = 64 to 256 without a window) meets the
    bounds, and the launch record shows it ran; the first wgmma backward (kernel_family("wgmma_v1")) stays correct
    beside it."""
    from dataclasses import replace

    from dualkv.cuda.configs import kernel_family
    from dualkv.cuda.runtime import arch_of

    if arch_of(0) != "sm_90":
        pytest.skip("the warp-specialised backward is Hopper-only")
    assert_rows_pass(shared_prefix_check(replace(case, head_dim=head_dim), dtype=dtype, device="cuda"))
    assert any(s.kernel == "bwd_sm90_ws" and s.head_dim == head_dim for s in launched_specs), launched_specs
    with kernel_family("wgmma_v1"):
        assert_rows_pass(shared_prefix_check(replace(case, head_dim=head_dim), dtype=dtype, device="cuda"))


@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_ws_backward_is_bitwise_deterministic(head_dim):
    from dualkv.cuda.runtime import arch_of

    if arch_of(0) != "sm_90":
        pytest.skip("the warp-specialised backward is Hopper-only")
    layout = GroupLayout.from_lengths([3000, 129], [[700, 65, 1, 300, 2048], [64]])
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(layout.total_tokens, 16, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(layout.total_tokens, 4, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    dout = torch.randn_like(q)
    runs = [_grads(layout, q, k, v, dout) for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


@pytest.mark.parametrize("shared_first", [False, True], ids=["own-first", "shared-first"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_ws_backward_cta_split_keeps_the_bits(head_dim, shared_first, monkeypatch):
    """The head-major CTA order's split (Plan.ws_first_tiles: every KV head's first rows of the key-tile table launched
    before the rest) changes only when CTAs start: every split from none to the whole table gives the same bits under
    either dQ order. A wrong blockIdx mapping would drop, repeat or reorder a head's key tiles (wrong gradients, or a
    dQ counter waiting forever)."""
    from cta_split_runs import PICKS, assert_same_bits, grads_per_split

    from dualkv.cuda import configs, launch
    from dualkv.cuda.runtime import arch_of

    if arch_of(0) != "sm_90":
        pytest.skip("the warp-specialised backward is Hopper-only")
    monkeypatch.setattr(launch, "TWO_LEVEL_SHARED_FIRST", shared_first)
    monkeypatch.setattr(configs, "WS_HEAD_MAJOR", True)  # the head-major build, whatever $DUALKV_WS_CTA_ORDER says
    ran, real = [], launch._run_backward_ws
    monkeypatch.setattr(launch, "_run_backward_ws", lambda *a, **k: ran.append(a[18]) or real(*a, **k))
    runs, splits = grads_per_split(monkeypatch, head_dim, 2, [(None, pick) for pick in PICKS])
    assert len(set(splits)) >= 4, splits  # the splits differ
    assert ran == splits, (ran, splits)  # the WS backward ran once per split, with that split
    assert_same_bits(runs)


@pytest.mark.parametrize("mode", ["auto", "split", "atomic"])
@pytest.mark.parametrize("head_dim", (32, 64, 96, 128))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_atomic_dq_mode(head_dim, dtype, mode, launched_specs):
    """deterministic=False meets the same bounds: the hybrid path (fused forward, cuDNN cascade backward) where that is
    faster (Hopper, d = 64, 128, no window), else the deterministic kernels, or dQ by fp32 atomics in the mma.sync
    dK/dV kernel: under mma_backward("atomic") wherever that kernel serves (here: the windowed case, and d = 32), under
    "auto" (the default) at head dims 64-128 where the mma.sync dK/dV kernel serves anyway (sm_80, or
    DUALKV_KERNELS=mma: here at least the windowed case; on Hopper's default family nothing here)."""
    import functools

    from dualkv.cuda.configs import AUTO_ATOMIC_HEAD_DIMS, dkdv_kernel_for, mma_backward
    from dualkv.cuda.runtime import arch_of

    fn = functools.partial(dualkv.shared_prefix_attention, deterministic=False)
    with mma_backward(mode):
        case = AttentionCase((129, 70), ((1, 63, 200), (5, 64)), 8, 2, head_dim, window=(-1, -1))
        assert_rows_pass(shared_prefix_check(case, dtype=dtype, device="cuda", attention_fn=fn))
        case = AttentionCase((300,), ((65, 127),), 4, 4, head_dim, window=(50, 0))
        assert_rows_pass(shared_prefix_check(case, dtype=dtype, device="cuda", attention_fn=fn))
    auto_atomic = head_dim in AUTO_ATOMIC_HEAD_DIMS and dkdv_kernel_for(head_dim, arch_of(0)) == "bwd_dkdv"
    expected = mode == "atomic" or (mode == "auto" and auto_atomic)
    assert any(s.dq_atomic for s in launched_specs) == expected, launched_specs


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_paper_api_five_gradients(head_dim, dtype):
    assert_rows_pass(two_call_check(AttentionCase((129,), ((1, 63, 64, 65, 127),), 8, 2, head_dim), dtype=dtype, device="cuda"))


@pytest.mark.parametrize("window", [0, 63, 200])
def test_paper_api_windows(window):
    assert_rows_pass(two_call_check(AttentionCase((300,), ((65, 1, 128),), 4, 1, 128, window=(window, 0)), dtype=torch.bfloat16,
                       device="cuda"))


def test_sixty_four_responses_share_one_context_gradient():
    case = AttentionCase((1000,), (tuple([1, 63, 65, 127, 129, 64, 2, 33] * 8),), 8, 1, 128)  # N = 64, GQA 8
    assert_rows_pass(shared_prefix_check(case, dtype=torch.bfloat16, device="cuda"))


def _grads(layout, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = dualkv.shared_prefix_attention(q, k, v, layout)
    return torch.autograd.grad(out, (q, k, v), dout)


def test_gradients_are_bitwise_deterministic():
    layout = GroupLayout.from_lengths([2000, 129], [[700, 65, 1, 300], [64]])
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(layout.total_tokens, 16, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(layout.total_tokens, 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(layout.total_tokens, 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    dout = torch.randn_like(q)
    runs = [_grads(layout, q, k, v, dout) for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


def test_opcheck_custom_ops():
    from dualkv.cuda import launch
    from dualkv.cuda.api import layout_plan

    layout = GroupLayout.from_lengths([70], [[33, 5]])
    q = torch.randn(layout.total_tokens, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(layout.total_tokens, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(layout.total_tokens, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    plan = layout_plan(layout, head_dim=64, group_size=2, window_left=-1, device=q.device, kv_heads=2)
    if launch.TWO_LEVEL_SHARED_FIRST and launch.WS_SPLIT == "auto":  # the split table goes through the ops too
        assert plan.split_parts == 2 and plan.split_key_tiles is not None
    args = (q, k, v, k, v, plan.segments, plan.fwd_tiles, plan.dq_tiles, plan.key_tiles, plan.dkdv_key_tiles,
            plan.split_key_tiles, plan.fwd_kernel, plan.fwd_pack, plan.dq_pack, plan.ws_first_tiles, plan.split_parts, True,
            0.125, -1, True, True, plan.tree)
    torch.library.opcheck(torch.ops.dualkv.fwd.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_torch_compile_traces_the_op():
    layout = GroupLayout.from_lengths([90, 31], [[17, 40], [9]])
    q = torch.randn(layout.total_tokens, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(layout.total_tokens, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def f(q, k):
        return dualkv.shared_prefix_attention(q * 2, k, k, layout).float().square().sum()

    eager = torch.autograd.grad(f(q, k), (q, k))
    compiled = torch.autograd.grad(torch.compile(f)(q, k), (q, k))
    for a, b in zip(eager, compiled):
        assert (a.float() - b.float()).abs().max() < 1e-2 * a.float().abs().max()


class _AttnOnly(torch.nn.Module):
    """Embedding -> [qkv, attention, out proj, residual] x 2 -> head; the attention function is pluggable."""

    def __init__(self, vocab=64, heads=2, head_dim=32):
        super().__init__()
        width = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.embed = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Embedding(512, width)
        self.qkv = torch.nn.ModuleList([torch.nn.Linear(width, 3 * width) for _ in range(2)])
        self.proj = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(2)])
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids, pos, attend):
        x = self.embed(ids) + self.pos(pos)
        for qkv, proj in zip(self.qkv, self.proj):
            q, k, v = qkv(x).view(x.shape[0], 3, self.heads, self.head_dim).unbind(1)
            x = x + proj(attend(q, k, v).reshape(x.shape[0], -1))
        return self.head(x)


def test_training_tracks_the_n_copy_reference():
    from dualkv.reference import n_copy_attention
    from dualkv.verify.model_checks import pack_rows, random_rows

    torch.manual_seed(0)
    rows, groups = random_rows((100, 40), ((30, 5, 64, 17), (50, 1)), 64, seed=3)
    packed = pack_rows(rows, groups).to("cuda")
    layout = packed.layout

    def train(attend):
        torch.manual_seed(1)
        model = _AttnOnly().cuda().to(torch.bfloat16)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(50):
            logits = model(packed.input_ids, packed.position_ids, lambda q, k, v: attend(q, k, v, layout))
            loss = torch.nn.functional.cross_entropy(logits[packed.predictor_index].float(), packed.response_ids)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    fused = train(dualkv.shared_prefix_attention)
    ref = train(n_copy_attention)
    assert fused[-1] < 0.7 * fused[0]  # it learns
    assert max(abs(a - b) for a, b in zip(fused, ref)) < 0.05 * max(ref)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("tokens,heads", [(1, 1), (63, 3), (129, 32), (4097, 5)])
def test_prep_kernel(head_dim, tokens, heads):
    """The preprocessing kernel (lanes share a row; grid-stride): D = rowsum(dO * O) - dLSE and LSE * log2(e) for
    every (head, token), against fp32 torch; poisoned outputs must all be overwritten. A strided dO (a view of a
    wider tensor) checks the row strides."""
    from dualkv.cuda.launch import run_prep

    g = torch.Generator(device="cuda").manual_seed(tokens * 7 + head_dim)
    wide = torch.randn(tokens, heads, 2 * head_dim, generator=g, device="cuda").to(torch.bfloat16)
    dout = wide[..., :head_dim]
    out = torch.randn(tokens, heads, head_dim, generator=g, device="cuda").to(torch.bfloat16)
    lse = torch.randn(heads, tokens, generator=g, device="cuda")
    d_lse = torch.randn(heads, tokens, generator=g, device="cuda")
    for grad_lse in (None, d_lse):
        lse2, delta = run_prep(dout, out, lse, grad_lse)
        want = (dout.float() * out.float()).sum(-1).t()
        if grad_lse is not None:
            want = want - grad_lse
        torch.testing.assert_close(delta, want, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(lse2, lse * 1.4426950408889634, rtol=1e-6, atol=1e-6)
        assert torch.isfinite(delta).all() and torch.isfinite(lse2).all()
