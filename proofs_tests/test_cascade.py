"""The cascade (dualkv.cascade): shared-prefix attention composed from ordinary attention calls merged by LSE.

On the CPU the parts run on the reference engine in float64, so the composition itself (the LSE merge, the merged
O/LSE handed to each part's backward, the sums of dQ and of the prompt dK/dV, padding of unequal responses) is
checked exactly against the N-copy oracle; known-wrong compositions must fail. On a GPU the parts run on cuDNN.
"""

import os
import re
from dataclasses import replace

import pytest
import torch

from dualkv import GroupLayout
from dualkv.cascade import CudnnEngine, ReferenceEngine, shared_prefix_attention
from dualkv.testing import assert_rows_pass
from dualkv.verify.cases import attention_cases, random_cases
from dualkv.verify.checks import AttentionCase, shared_prefix_check



def _unwindowed(cases):
    return [replace(c, window=(-1, -1)) for c in cases]


NO_WINDOW = [c for c in attention_cases() if c.window == (-1, -1)]
CPU_CASES = NO_WINDOW + _unwindowed(random_cases(6, 3, prompt_lens=(1, 5, 17), response_lens=(1, 2, 9, 16),
                                                 group_sizes=(1, 2, 5)))


def _cascade(engine):
    def fn(q, k, v, layout, window_size=(-1, -1), return_lse=False):
        return shared_prefix_attention(q, k, v, layout, window_size=window_size, return_lse=return_lse,
                                       engine=engine)
    return fn


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.name)
def test_cascade_float64_equals_ncopy(case):
    rows = shared_prefix_check(case, attention_fn=_cascade(ReferenceEngine()), backend="cascade")
    assert_rows_pass(rows, max_error=1e-10)


class _UnmergedLse(ReferenceEngine):
    """Known-wrong: each part's backward gets its own LSE instead of the merged one."""

    def like(self, lse, rows):
        return lse


class _NoCrossPromptGrad(ReferenceEngine):
    """Known-wrong: the responses' gradient into the prompt K/V (the cross part's dK/dV) is dropped."""

    def backward(self, dout, q, k, v, out, lse, state, causal, scale):
        dq, dk, dv = super().backward(dout, q, k, v, out, lse, state, causal, scale)
        return (dq, torch.zeros_like(dk), torch.zeros_like(dv)) if not causal else (dq, dk, dv)


class _OwnNotCausal(ReferenceEngine):
    """Known-wrong: the responses see their own later tokens."""

    def forward(self, q, k, v, causal, scale):
        return super().forward(q, k, v, False, scale)


@pytest.mark.parametrize("engine", [_UnmergedLse(), _NoCrossPromptGrad(), _OwnNotCausal()],
                         ids=lambda e: type(e).__name__)
def test_known_wrong_compositions_are_caught(engine):
    case = AttentionCase((9,), ((4, 1, 7),), 4, 2, 16)
    rows = shared_prefix_check(case, attention_fn=_cascade(engine), backend="mutant")
    assert not all(r.passed for r in rows), "a known-wrong cascade passed the oracle"


def test_unequal_and_equal_responses_agree_with_reference_bitwise_layout():
    """The padded own part (unequal R_i) and the batched view (equal R_i) give the same rows for equal lengths."""
    torch.manual_seed(1)
    layout = GroupLayout.from_lengths([6, 3], [[4, 4, 4], [2, 5]])
    q = torch.randn(layout.total_tokens, 4, 8, dtype=torch.float64)
    k, v = (torch.randn(layout.total_tokens, 2, 8, dtype=torch.float64) for _ in range(2))
    from dualkv.reference import shared_prefix_attention as reference

    out, lse = shared_prefix_attention(q, k, v, layout, return_lse=True)
    ref_out, ref_lse = reference(q, k, v, layout, return_lse=True)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_refuses_windows_and_lse_gradients():
    layout = GroupLayout.single(5, [3, 2])
    q = torch.randn(layout.total_tokens, 2, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(layout.total_tokens, 2, 8, dtype=torch.float64) for _ in range(2))
    with pytest.raises(NotImplementedError, match="sliding window"):
        shared_prefix_attention(q, k, v, layout, window_size=(4, 0))
    out, lse = shared_prefix_attention(q, k, v, layout, return_lse=True)
    with pytest.raises(NotImplementedError, match="LSE"):
        lse.sum().backward()
    with pytest.raises(ValueError):
        shared_prefix_attention(q, k[:-1], v, layout)


# ---------------------------------------------------------------------------------------------- GPU (cuDNN parts)
GPU_CASES = [replace(c, head_dim=d) for c in NO_WINDOW[:5] for d in (64, 128)] + [
    replace(c, head_dim=d) for c in NO_WINDOW[:3] for d in (192, 256)] + _unwindowed(random_cases(
        6, 11, prompt_lens=(1, 63, 65, 129, 1000), response_lens=(1, 63, 64, 65, 127, 129), group_sizes=(1, 2, 8)))


def skip_unless_cudnn_serves(head_dim: int) -> None:
    """Skip a GPU test at a head dim the cuDNN cascade does not take on this GPU (configs.cascade_serves)."""
    from dualkv.cuda.configs import cascade_serves
    from dualkv.cuda.runtime import arch_of

    arch = arch_of(torch.cuda.current_device())
    if not cascade_serves(arch, head_dim):
        pytest.skip(f"the cuDNN cascade does not take head dim {head_dim} on {arch}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_cudnn_cascade_gpu(case, dtype):
    skip_unless_cudnn_serves(case.head_dim)
    rows = shared_prefix_check(case, dtype=dtype, device="cuda", attention_fn=_cascade(CudnnEngine()),
                               backend="cudnn_cascade")
    assert_rows_pass(rows)


def test_cudnn_engine_tiny_parts_run_as_fp32_math():
    """cuDNN refuses s_q = s_kv = 1; such parts (one-token prompts and responses) take the engine's fp32 path, whose
    LSE keeps cuDNN's (B, H, S, 1) shape. Forced here for every part, on the CPU."""

    class AllTiny(CudnnEngine):
        _tiny = staticmethod(lambda q, k: True)

    layout = GroupLayout.from_lengths([1, 1], [[1], [1, 1]])
    q = torch.randn(layout.total_tokens, 4, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(layout.total_tokens, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    from dualkv.reference import shared_prefix_attention as reference

    out = shared_prefix_attention(q, k, v, layout, engine=AllTiny())
    ref = reference(q, k, v, layout)
    d = torch.randn_like(out)
    for a, b in zip((out, *torch.autograd.grad(out, (q, k, v), d)), (ref, *torch.autograd.grad(ref, (q, k, v), d))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_dispatch_floor_rule(monkeypatch):
    """deterministic=False goes to the hybrid (fused forward, cuDNN cascade backward; d = 64, 128 on Hopper) where
    it was measured faster (at d = 96, 192 and 256 the fused kernels are as fast or faster); the deterministic
    default, windows, head dims the cascade does not take and other archs stay fused; $DUALKV_PATH overrides and is
    checked."""
    from dualkv.cuda.configs import attention_path

    monkeypatch.delenv("DUALKV_PATH", raising=False)
    assert attention_path("sm_90", 128, False, deterministic=False) == "hybrid"
    assert attention_path("sm_90", 128, False, deterministic=True) == "fused"
    assert attention_path("sm_90", 64, False, deterministic=False) == "hybrid"  # faster than the fused kernels there
    assert attention_path("sm_90", 96, False, deterministic=False) == "fused"   # the fused kernels are the fastest
    for d in (64, 96):
        assert attention_path("sm_90", d, False, deterministic=True) == "fused"
    assert attention_path("sm_90", 80, False, deterministic=False) == "fused"  # not measured: stays fused
    assert attention_path("sm_90", 128, True, deterministic=False) == "fused"
    for d in (192, 256):  # the warp-specialised backward there: as fast as cuDNN's (256) or faster (192)
        assert attention_path("sm_90", d, False, deterministic=False) == "fused"
        assert attention_path("sm_90", d, False, deterministic=True) == "fused"
        assert attention_path("sm_80", d, False, deterministic=False) == "fused"
    assert attention_path("sm_90", 512, False, deterministic=False) == "fused"  # wider than cuDNN's attention
    assert attention_path("sm_80", 128, False, deterministic=False) == "fused"
    monkeypatch.setenv("DUALKV_PATH", "cascade")
    assert attention_path("sm_80", 64, False, deterministic=True) == "cascade"
    assert attention_path("sm_90", 256, False, deterministic=True) == "cascade"
    assert attention_path("sm_80", 256, False, deterministic=True) == "fused"  # cuDNN's widest there: 128 (taken)
    assert attention_path("sm_90", 512, False, deterministic=True) == "fused"
    for d in (136, 200, 248):  # not measured, not tested through cuDNN: the fused kernels (padded)
        assert attention_path("sm_90", d, False, deterministic=True) == "fused"
    assert attention_path("sm_90", 128, True, deterministic=True) == "fused"  # no window in the cascade
    monkeypatch.setenv("DUALKV_PATH", "fused")
    assert attention_path("sm_90", 128, False, deterministic=False) == "fused"
    monkeypatch.setenv("DUALKV_PATH", "casade")
    with pytest.raises(ValueError, match="DUALKV_PATH must be one of"):
        attention_path("sm_90", 128, False, deterministic=False)


def test_path_override_wins_over_the_environment_and_is_restored(monkeypatch):
    """configs.path_override: read before $DUALKV_PATH, restored when its block ends (also on an exception; then
    $DUALKV_PATH decides again), bad values refused naming the allowed ones; a plain call sets it for the process."""
    from dualkv.cuda import configs
    from dualkv.cuda.configs import PATHS, attention_path, current_path, path_override

    before = configs._path[0]
    configs._path[0] = None                          # a fresh process's state; restored below
    try:
        monkeypatch.setenv("DUALKV_PATH", "fused")
        assert current_path() == "fused" and attention_path("sm_90", 128, False, deterministic=False) == "fused"
        with path_override("hybrid"):
            assert current_path() == "hybrid" and os.environ["DUALKV_PATH"] == "fused"
            assert attention_path("sm_80", 64, False, deterministic=True) == "hybrid"
            assert attention_path("sm_90", 128, True, deterministic=False) == "fused"   # no window in the cascade
            with path_override("auto"):              # "auto" overrides too: the rule, whatever the variable says
                assert attention_path("sm_90", 128, False, deterministic=False) == "hybrid"
                assert attention_path("sm_90", 128, False, deterministic=True) == "fused"
            assert current_path() == "hybrid"
        assert current_path() == "fused"             # the variable again
        with pytest.raises(RuntimeError, match="inside"):
            with path_override("cascade"):
                assert attention_path("sm_80", 64, False, deterministic=True) == "cascade"
                raise RuntimeError("inside")
        assert configs._path == [None] and current_path() == "fused"
        monkeypatch.setenv("DUALKV_PATH", "casade")  # a bad variable is still refused, but an override decides first
        with path_override("cascade"):
            assert attention_path("sm_80", 64, False, deterministic=True) == "cascade"
        with pytest.raises(ValueError, match="DUALKV_PATH must be one of"):
            attention_path("sm_90", 128, False, deterministic=False)
        for bad in ("casade", "Hybrid", "", None):
            with pytest.raises(ValueError, match=re.escape(f"attention path must be one of {PATHS}, got {bad!r}")):
                path_override(bad)
        assert configs._path == [None]               # a refused value leaves the choice alone
        path_override("cascade")                     # a plain call: for the rest of the process
        assert current_path() == "cascade" and attention_path("sm_80", 64, False, deterministic=True) == "cascade"
    finally:
        configs._path[0] = before
