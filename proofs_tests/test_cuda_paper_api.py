"""GPU: the paper's full API on the CUDA kernels — any number of query rows per sequence (bottom-right aligned,
prompt rows together with response rows, fewer rows than keys), ``causal=False`` (the DKV_CAUSAL=0 kernels), head
dims that are any multiple of 8 (zero-padded to a kernel head dim) — outputs, LSE and all five gradients against
the float64 reference, by FlashAttention's criterion (the same computation by PyTorch at the same dtype), with
outputs NaN-poisoned before and every launch checked after (``cuda_debug``)."""

import pytest
import torch

import dualkv
from dualkv import reference
from dualkv.testing import cancellation_slack, compare

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_debug")]

NAMES = ("q", "k_context", "v_context", "k_decoded", "v_decoded")
CASES = {                            # P, R_i, L_i
    "training": (300, (65, 1, 129), (65, 1, 129)),
    "prompt_rows": (300, (65, 1, 129), (65 + 300, 1 + 100, 129 + 7)),
    "same_prompt_rows": (300, (65, 1, 129), (65 + 64, 1 + 64, 129 + 64)),
    "fewer_rows": (300, (65, 1, 200), (3, 1, 0)),
    "mixed": (129, (64, 2, 0, 90), (64 + 129, 1, 100, 90)),
    "no_context": (0, (65, 30), (40, 30)),
}


def _inputs(p, r, l, heads, kv_heads, head_dim, dtype, seed=0):
    """Five float64 CPU tensors rounded to ``dtype`` (so every computation sees the same values) + the rest."""
    g = torch.Generator().manual_seed(seed)
    make = lambda n, h: torch.randn(n, h, head_dim, generator=g, dtype=torch.float64).to(dtype).double()  # noqa
    tensors = dict(zip(NAMES, (make(sum(l), heads), make(p, kv_heads), make(p, kv_heads), make(sum(r), kv_heads),
                               make(sum(r), kv_heads))))
    cu = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)  # noqa: E731
    rest = dict(cu_seqlens_q=cu(l), cu_seqlens_k_decoded=cu(r), max_seqlen_q=max(l), context_seqlen=p,
                max_seqlen_k_decoded=max(r))
    d_out = torch.randn(sum(l), heads, head_dim, generator=g, dtype=torch.float64).to(dtype).double()
    return tensors, rest, d_out


def _call(fn, tensors, rest, d_out, device, dtype, **kwargs):
    leaves = {n: t.to(device=device, dtype=dtype).requires_grad_() for n, t in tensors.items()}
    cu = {n: (v.to(device) if isinstance(v, torch.Tensor) else v) for n, v in rest.items()}
    out, lse = fn(**leaves, **cu, return_lse=True, **kwargs)
    grads = torch.autograd.grad(out, list(leaves.values()), d_out.to(device=device, dtype=dtype))
    return out, lse, grads


def _check_call2(case, head_dim, dtype, heads=8, kv_heads=2, **kwargs):
    p, r, l = CASES[case]
    tensors, rest, d_out = _inputs(p, r, l, heads, kv_heads, head_dim, dtype)
    got = _call(dualkv.flash_attn_dualkv_varlen_func, tensors, rest, d_out, "cuda", dtype, **kwargs)
    ref = _call(reference.flash_attn_dualkv_varlen_func, tensors, rest, d_out, "cpu", torch.float64, **kwargs)
    low = _call(reference.flash_attn_dualkv_varlen_func, tensors, rest, d_out, "cuda", dtype, **kwargs)
    floor = cancellation_slack(tensors["q"], torch.cat([tensors["k_context"], tensors["k_decoded"]]),
                               torch.cat([tensors["v_context"], tensors["v_decoded"]]), d_out,
                               kwargs.get("softmax_scale"))
    checks = [("out", compare(got[0], ref[0], dtype=dtype, ref_lowp=low[0])),
              ("lse", compare(got[1].float(), ref[1], dtype=torch.float32))]   # fp32 LSE: relative error
    for name, g, r64, lo in zip(NAMES, got[2], ref[2], low[2]):
        checks.append((f"d{name}", compare(g, r64, dtype=dtype, ref_lowp=lo, is_grad=True,
                                           fp32_floor=0.0 if name.startswith("v") else floor)))
    bad = [f"{n}: {c.error:.3e} > {c.bound:.3e}" for n, c in checks if not c.passed]
    assert not bad, f"{case} d={head_dim} {dtype}: " + "; ".join(bad)
    assert got[0].shape == ref[0].shape and got[0].dtype == dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
@pytest.mark.parametrize("case", CASES)
def test_query_rows_and_causality(case, causal, dtype):
    _check_call2(case, 128, dtype, causal=causal)


@pytest.mark.parametrize("head_dim", [8, 40, 64, 80, 136, 200, 256, 512])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
def test_head_dims(head_dim, causal):
    _check_call2("prompt_rows" if head_dim != 512 else "training", head_dim, torch.bfloat16, causal=causal)


@pytest.mark.parametrize("window", [0, 63, 200])
def test_windows_with_prompt_rows(window):
    _check_call2("prompt_rows", 64, torch.bfloat16, window_size=(window, 0))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
def test_atomic_dq_and_mma_kernels(causal, launched_specs):
    """deterministic=False (default "auto" and mma_backward("atomic")) and the mma.sync family, both non-causal and
    causal; deterministic calls never launch the atomic dQ build, and mma_backward("atomic") does."""
    from dualkv.cuda.configs import kernel_family, mma_backward

    _check_call2("mixed", 64, torch.bfloat16, causal=causal, deterministic=False)
    with kernel_family("mma"):
        before = len(launched_specs)
        _check_call2("mixed", 128, torch.bfloat16, causal=causal)
        assert not any(s.dq_atomic for s in launched_specs[before:]), launched_specs
        with mma_backward("atomic"):
            _check_call2("mixed", 128, torch.bfloat16, causal=causal, deterministic=False)
    assert any(s.dq_atomic for s in launched_specs), launched_specs


@pytest.mark.parametrize("head_dim", [64, 80])
def test_non_causal_context_attention(head_dim):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(470, 4, head_dim, generator=g, dtype=torch.float64).to(torch.bfloat16)
    cu = torch.tensor([0, 300, 301, 470], dtype=torch.int32)
    leaves = [x.cuda().requires_grad_() for _ in range(3)]
    out = dualkv.context_attention(*leaves, cu.cuda(), 300, causal=False)
    ref = reference.context_attention(*(x.double() for _ in range(3)), cu, 300, causal=False)
    low = reference.context_attention(*(x.cuda() for _ in range(3)), cu.cuda(), 300, causal=False)
    assert compare(out, ref, dtype=torch.bfloat16, ref_lowp=low).passed
    grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
    assert all(torch.isfinite(gr).all() for gr in grads)


def test_shared_prefix_at_a_padded_head_dim():
    """The HF path with a head dim the kernels do not have (80 -> 96)."""
    layout = dualkv.GroupLayout.from_lengths([130, 40], [[64, 1, 90], [33]])
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(layout.total_tokens, h, 80, generator=g).to(torch.bfloat16) for h in (8, 2, 2))
    out = dualkv.shared_prefix_attention(q.cuda(), k.cuda(), v.cuda(), layout)
    ref = reference.shared_prefix_attention(q.double(), k.double(), v.double(), layout)
    low = reference.shared_prefix_attention(q.cuda(), k.cuda(), v.cuda(), layout)
    assert out.shape == q.shape and compare(out, ref, dtype=torch.bfloat16, ref_lowp=low).passed


def test_refusals():
    x = torch.randn(20, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="no sliding window with causal=False"):
        dualkv.context_attention(x, x, x, causal=False, window_size=(4, 4))
    y = torch.randn(20, 2, 44, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head_dim 44 is not supported by the CUDA kernels: it must be a multiple of 8"):
        dualkv.context_attention(y, y, y)
