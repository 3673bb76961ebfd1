"""The hybrid path (``DUALKV_PATH=hybrid``, dualkv.cuda.hybrid): the fused forward's output and LSE handed to the
cascade's part backwards (dualkv.cascade.cascade_backward) with no cascade forward.

On the CPU the fused forward is stood in for by the float64 reference (``dualkv.cuda.api._run`` patched) and the
parts run on the reference engine, so the autograd function and ``cascade_backward`` (LSE rows per part, padded own
slots of unequal responses, the dQ and prompt dK/dV sums) are checked exactly against the N-copy oracle; known-wrong
variants must fail. On a GPU the public API runs it: fused kernels forward, cuDNN backward.
"""

import os
from dataclasses import replace

import pytest
import torch

import dualkv
from dualkv import GroupLayout
from dualkv.cascade import ReferenceEngine, cascade_backward
from dualkv.testing import assert_rows_pass
from dualkv.verify.cases import attention_cases, random_cases
from dualkv.verify.checks import shared_prefix_check
from test_cascade import skip_unless_cudnn_serves

NO_WINDOW = [c for c in attention_cases() if c.window == (-1, -1)]
CPU_CASES = NO_WINDOW + [replace(c, window=(-1, -1)) for c in random_cases(
    6, 5, prompt_lens=(1, 5, 17), response_lens=(1, 2, 9, 16), group_sizes=(1, 2, 5))]


def _hybrid_on_reference(monkeypatch, engine=None, lse_shift=0.0):
    """FusedForwardCascadeBackward with the reference as its forward; ``engine``/``lse_shift``: known-wrong variants."""
    from dualkv.cuda import api, hybrid
    from dualkv.reference import shared_prefix_attention as reference

    def fn(q, k, v, layout, window_size=(-1, -1), return_lse=False):
        def forward(q_, k_, v_, *_):
            out, lse = reference(q_, k_, v_, layout, return_lse=True)
            return out, lse + lse_shift
        monkeypatch.setattr(api, "_run", forward)
        if engine is not None:
            monkeypatch.setattr(hybrid, "cascade_backward",
                                lambda *a: cascade_backward(*a, engine=engine))
        out, lse = hybrid.FusedForwardCascadeBackward.apply(q, k, v, layout, None, q.shape[-1] ** -0.5)
        return (out, lse) if return_lse else out
    return fn


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.name)
def test_hybrid_float64_equals_ncopy(case, monkeypatch):
    rows = shared_prefix_check(case, attention_fn=_hybrid_on_reference(monkeypatch), backend="hybrid")
    assert_rows_pass(rows, max_error=1e-10)


class _NoCrossPromptGrad(ReferenceEngine):
    """Known-wrong: the responses' gradient into the prompt K/V (the cross part's dK/dV) is dropped."""

    def backward(self, dout, q, k, v, out, lse, state, causal, scale):
        dq, dk, dv = super().backward(dout, q, k, v, out, lse, state, causal, scale)
        return (dq, torch.zeros_like(dk), torch.zeros_like(dv)) if not causal else (dq, dk, dv)


class _NotCausal(ReferenceEngine):
    """Known-wrong: the causal parts' backward (prompt and own) without their masks."""

    def backward(self, dout, q, k, v, out, lse, state, causal, scale):
        return super().backward(dout, q, k, v, out, lse, state, False, scale)


@pytest.mark.parametrize("variant", ["no_cross_prompt_grad", "not_causal", "lse_off_by_0.5"])
def test_known_wrong_hybrids_are_caught(variant, monkeypatch):
    case = next(c for c in CPU_CASES if c.layout.num_groups > 1 and max(map(max, c.layout.response_lens)) > 2)
    kwargs = {"no_cross_prompt_grad": {"engine": _NoCrossPromptGrad()},
              "not_causal": {"engine": _NotCausal()},
              "lse_off_by_0.5": {"lse_shift": 0.5}}[variant]
    rows = shared_prefix_check(case, attention_fn=_hybrid_on_reference(monkeypatch, **kwargs), backend="wrong")
    grads = [r for r in rows if r.quantity in ("dq", "dk", "dv")]
    assert len(grads) == 3
    with pytest.raises(AssertionError):
        assert_rows_pass(grads, max_error=1e-10)


def test_cascade_backward_pads_unequal_responses_without_nan():
    """Padded own slots get a huge LSE (their probabilities are 0) and a zero upstream gradient: no inf * 0."""
    from dualkv.reference import shared_prefix_attention as reference

    layout = GroupLayout.from_lengths([7], [[1, 30, 4]])
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(layout.total_tokens, 4, 16, dtype=torch.float64, generator=gen) * 30  # large scores
    k, v = (torch.randn(layout.total_tokens, 2, 16, dtype=torch.float64, generator=gen) * 30 for _ in range(2))
    out, lse = reference(q, k, v, layout, return_lse=True)
    dout = torch.randn_like(out)
    got = cascade_backward(dout, q, k, v, out, lse, layout, 16 ** -0.5, engine=ReferenceEngine())
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(reference(*leaves, layout), leaves, dout)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_strided_like_keeps_the_templates_memory_order():
    from dualkv.cascade import _stride_order, _strided_like

    template = torch.zeros(1, 3, 4, 1).transpose(1, 2)   # (1, 4, 3, 1), heads innermost in memory
    got = _strided_like(template, (2, 4, 5, 1))
    assert got.shape == (2, 4, 5, 1) and got.stride() == (20, 1, 4, 1)  # heads innermost, as in the template
    assert _stride_order(torch.zeros(2, 3, 4)) == (0, 1, 2)
    assert _stride_order(template) == (2, 1, 0, 3)  # size-1 dimensions last, in index order


def test_hybrid_path_rule(monkeypatch):
    from dualkv.cuda.configs import attention_path

    monkeypatch.setenv("DUALKV_PATH", "hybrid")
    assert attention_path("sm_90", 128, False, deterministic=False) == "hybrid"
    assert attention_path("sm_80", 64, False, deterministic=True) == "hybrid"
    assert attention_path("sm_90", 128, True, deterministic=False) == "fused"   # no window in the cascade
    assert attention_path("sm_90", 256, False, deterministic=False) == "hybrid"  # cuDNN serves 256 on Hopper
    assert attention_path("sm_80", 256, False, deterministic=False) == "fused"   # not taken elsewhere
    assert attention_path("sm_90", 512, False, deterministic=False) == "fused"   # wider than cuDNN's attention


# ---------------------------------------------------------------------------------------------- GPU
GPU_CASES = [replace(c, head_dim=d) for c in NO_WINDOW[:5] for d in (64, 96, 128)] + [
    replace(c, head_dim=d) for c in NO_WINDOW[:3] for d in (192, 256)] + [
    replace(c, window=(-1, -1)) for c in random_cases(6, 11, prompt_lens=(1, 63, 65, 129, 1000),
                                                      response_lens=(1, 63, 64, 65, 127, 129), group_sizes=(1, 2, 8))]


@pytest.mark.gpu
@pytest.mark.parametrize("layout_of", ["bhsd", "bshd"])
def test_cudnn_backward_rows_equals_the_backward_after_its_own_forward(layout_of):
    """backward_rows (state and LSE layout from a template) gives the same bits as cuDNN's backward with the state and
    LSE of its own forward, for contiguous and packed-row (B, S, H, d)-strided inputs."""
    from dualkv.cascade import CudnnEngine

    gen = torch.Generator(device="cuda").manual_seed(0)

    def make(heads):
        t = torch.randn(1, 200, heads, 128, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
        return t.contiguous() if layout_of == "bhsd" else t
    q, k, v = make(8), make(2), make(2)
    engine = CudnnEngine()
    for causal in (True, False):
        out, lse, state = engine.forward(q, k, v, causal, 0.1)
        dout = torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=gen)
        want = engine.backward(dout, q, k, v, out, lse, state, causal, 0.1)
        got = engine.backward_rows(dout, q, k, v, out, engine.rows(lse), causal, 0.1)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_hybrid_gpu(case, dtype, monkeypatch):
    skip_unless_cudnn_serves(case.head_dim)
    monkeypatch.setenv("DUALKV_PATH", "hybrid")

    def fn(q, k, v, layout, window_size=(-1, -1), return_lse=False):
        return dualkv.shared_prefix_attention(q, k, v, layout, window_size=window_size, return_lse=return_lse,
                                              deterministic=False)
    rows = shared_prefix_check(case, dtype=dtype, device="cuda", attention_fn=fn, backend="hybrid")
    assert_rows_pass(rows)


def test_hybrid_refuses_an_lse_gradient(monkeypatch):
    layout = GroupLayout.from_lengths([5], [[3, 2]])
    q = torch.randn(layout.total_tokens, 2, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(layout.total_tokens, 1, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out, lse = _hybrid_on_reference(monkeypatch)(q, k, v, layout, return_lse=True)
    with pytest.raises(NotImplementedError, match=r"deterministic=True \(or unset DUALKV_DETERMINISTIC=0\) or set DUALKV_PATH=fused"):
        (out.sum() + lse.sum()).backward()


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [192, 256])
def test_wide_heads_stay_on_the_fused_kernels(head_dim, monkeypatch, launched_specs):
    """Hopper, head dims 192 and 256: the warp-specialised backward (deterministic) is as fast as cuDNN's or faster,
    so the default and deterministic=False both run the fused kernels (no hybrid), and neither warns."""
    import warnings

    from dualkv import _warnings
    from dualkv.cuda.runtime import arch_of

    if arch_of(torch.cuda.current_device()) != "sm_90":
        pytest.skip("the wide head dims' warp-specialised backward is Hopper's")
    for name in ("DUALKV_PATH", "DUALKV_DETERMINISTIC"):
        monkeypatch.delenv(name, raising=False)
    _warnings.reset()
    layout = GroupLayout.single(70, [33, 5])
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(layout.total_tokens, h, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen,
                           requires_grad=True) for h in (4, 2, 2))
    with warnings.catch_warnings():  # neither the default nor deterministic=False has anything to warn of
        warnings.simplefilter("error", _warnings.DualKVWarning)
        out = dualkv.shared_prefix_attention(q, k, v, layout)
        out.sum().backward()
        out = dualkv.shared_prefix_attention(q, k, v, layout, deterministic=False)
        assert "FusedForwardCascade" not in type(out.grad_fn).__name__
        out.sum().backward()
    ws = [s for s in launched_specs if s.kernel == "bwd_sm90_ws"]
    assert len(ws) == 2 and {s.head_dim for s in ws} == {head_dim}, launched_specs
    _warnings.reset()


def test_empty_settings_mean_auto(monkeypatch):
    """``export DUALKV_PATH=`` (or DUALKV_KERNELS= / DUALKV_MMA_BWD=) means the default, as for DUALKV_BACKEND,
    not an error on every call."""
    import subprocess
    import sys

    from dualkv.cuda.configs import attention_path

    monkeypatch.setenv("DUALKV_PATH", "")
    assert attention_path("sm_90", 128, False, deterministic=True) == "fused"
    code = ("from dualkv.cuda import configs; "
            "print(configs.current_kernel_family(), configs.current_mma_backward(), configs.current_path())")
    env = {**os.environ, "DUALKV_KERNELS": "", "DUALKV_MMA_BWD": "", "DUALKV_PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["auto", "auto", "auto"]
