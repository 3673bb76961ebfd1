"""Every supported architecture, packed P+ΣR with the "dualkv" attention vs the stock model on each N-copy row:
log-probs, entropy, every parameter gradient (the worst one is reported) and the prompt hidden states at every
layer. Tiny random models built from configs (dualkv.testing.tiny_causal_lm); several groups of different P and N,
R_i = 1, sliding windows shorter than the rows, gradient checkpointing."""

import pytest
import torch

from dualkv.integration import hf
from dualkv.testing import TINY_ARCHS
from dualkv.verify.model_checks import model_check

ARCHS = list(TINY_ARCHS)
SLIDING = ["qwen2_sliding", "qwen3_sliding", "gemma3", "gemma4", "gemma4_kv_shared"]
#: Several groups of different P and N, single-token responses, rows longer than every window (4 or 5).
PROMPTS, RESPONSES = (9, 3, 6), ((4, 1, 6), (1,), (2, 7))

#: Qwen3-MoE's stock router takes its softmax in float32 (like stock RMSNorms, which the tests replace), so its
#: float64 gradients agree to ~1e-8 only; outputs stay exact.
FP64_GRAD_BOUND = {"qwen3_moe": 1e-6}


def _errors(rows):
    return {r.quantity.split(" (")[0]: r.error for r in rows}


@pytest.mark.parametrize("arch", ARCHS)
def test_float64_exact(arch):
    errors = _errors(model_check(arch, PROMPTS, RESPONSES, seed=2))
    bounds = {"logprobs": 1e-9, "entropy": 1e-9, "param grads": FP64_GRAD_BOUND.get(arch, 1e-9),
              "prompt hidden states": 1e-9}
    bad = {q: e for q, e in errors.items() if not e <= bounds[q]}
    assert not bad, f"{arch}: {bad}"


@pytest.mark.parametrize("arch", ARCHS)
def test_float32(arch):
    errors = _errors(model_check(arch, (9, 4), ((4, 1, 3), (2, 6)), dtype=torch.float32, seed=1))
    bad = {q: e for q, e in errors.items() if not e <= 1e-5}
    assert not bad, f"{arch}: {bad}"


@pytest.mark.parametrize("arch", ["gemma3", "qwen3_moe", "gemma4"])
def test_gradient_checkpointing(arch):
    errors = _errors(model_check(arch, (6, 2), ((2, 3), (1,)), gradient_checkpointing=True))
    assert max(errors.values()) <= FP64_GRAD_BOUND.get(arch, 1e-9), errors


@pytest.mark.parametrize("arch", SLIDING)
def test_window_off_by_one_is_caught(arch, monkeypatch):
    """Negative control: HF's window W means keys in (i - W, i]; using W as FlashAttention's left (one key too
    many) must be caught by the same comparison the real mapping passes."""
    monkeypatch.setattr(hf, "hf_window", lambda w: (-1, -1) if not w else (w, 0))
    errors = _errors(model_check(arch, PROMPTS, RESPONSES, seed=2))
    assert errors["logprobs"] > 1e-6 and errors["prompt hidden states"] > 1e-6, errors


@pytest.mark.parametrize("arch", ["gemma3", "gemma4"])
def test_window_ignored_is_caught(arch, monkeypatch):
    """Negative control: running sliding layers as full attention is caught."""
    monkeypatch.setattr(hf, "hf_window", lambda w: (-1, -1))
    assert _errors(model_check(arch, PROMPTS, RESPONSES, seed=2))["logprobs"] > 1e-6


def test_window_semantics():
    assert hf.hf_window(None) == (-1, -1)
    assert hf.hf_window(1) == (0, 0)        # W = 1: the token itself
    assert hf.hf_window(4096) == (4095, 0)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="sliding_window"):
            hf.hf_window(bad)


def test_wrapped_packed_attention_for_sequence_parallelism():
    """register(packed_attention=fn) swaps the per-layer attention (how a Ulysses wrapper plugs in): a wrapper that
    splits the heads in two groups, as a head-scattering all-to-all would, stays exact and is called per layer."""
    import dualkv

    calls = []

    def head_split(q, k, v, layout, *, softmax_scale, window_size):
        calls.append(q.shape)
        hq, hk = q.shape[1] // 2, k.shape[1] // 2
        parts = [dualkv.shared_prefix_attention(q[:, i * hq:(i + 1) * hq], k[:, i * hk:(i + 1) * hk],
                                                v[:, i * hk:(i + 1) * hk], layout, softmax_scale=softmax_scale,
                                                window_size=window_size) for i in range(2)]
        return torch.cat(parts, 1)

    hf.register(packed_attention=head_split)
    try:
        errors = _errors(model_check("qwen3_sliding", PROMPTS, RESPONSES, seed=2))
    finally:
        hf.register()
    assert len(calls) == 2 and max(errors.values()) <= 1e-9, errors
