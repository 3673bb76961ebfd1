"""The chunked log-prob head against full-logit PyTorch: values and gradients (hidden, weight, bias) for the plain
and fused paths, softcap and temperature, odd chunk sizes; at most (chunk × V) logits exist and none are kept for
the backward; a fused backward missing its entropy term is caught; the maps back to the caller's layouts."""

import pytest
import torch

from dualkv.integration import logprobs as lpmod
from dualkv.integration.logprobs import packed_logprobs, to_padded, to_sequence_layout, token_logprobs
from dualkv.testing import rel_err
from dualkv.verify.model_checks import pack_rows, random_rows

T, D, V = 23, 6, 37


def _inputs(dtype, seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()  # noqa: E731
    rows, groups = random_rows((6, 4), ((3, 1, 5), (2,)), V, seed)
    packed = pack_rows(rows, groups)
    t = packed.layout.total_tokens
    return make(t, D), make(V, D), (make(V) if bias else None), packed


def _naive(h, w, b, packed, temperature, softcap):
    logits = torch.nn.functional.linear(h[packed.predictor_index], w, b).to(torch.float64)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logp = torch.log_softmax(logits / temperature, -1)
    return logp.gather(-1, packed.response_ids[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


def _value_and_grads(fn, h, w, b, seed=1):
    lp, ent = fn()
    gen = torch.Generator().manual_seed(seed)
    g1, g2 = (torch.randn(lp.shape[0], generator=gen, dtype=torch.float64).to(lp.dtype) for _ in range(2))
    leaves = [t for t in (h, w, b) if t is not None]
    return (lp, ent, *torch.autograd.grad((lp * g1).sum() + (ent * g2).sum(), leaves))


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("chunk", [1, 4, 1000])
@pytest.mark.parametrize("temperature,softcap", [(1.0, None), (0.6, 3.0)])
def test_matches_full_logits_float64(fused, chunk, temperature, softcap):
    h, w, b, packed = _inputs(torch.float64)
    ref = _value_and_grads(lambda: _naive(h, w, b, packed, temperature, softcap), h, w, b)
    got = _value_and_grads(lambda: packed_logprobs(h, w, packed, temperature=temperature, chunk_size=chunk, bias=b,
                                                   logit_softcap=softcap, fused=fused), h, w, b)
    for name, a, r in zip(("logp", "entropy", "dh", "dW", "db"), got, ref):
        assert rel_err(a, r) < 1e-12, name


@pytest.mark.parametrize("dtype,bound", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_fused_equals_plain_low_precision(dtype, bound):
    h, w, _, packed = _inputs(dtype, seed=2, bias=False)
    plain = _value_and_grads(lambda: packed_logprobs(h, w, packed, chunk_size=5), h, w, None)
    fused = _value_and_grads(lambda: packed_logprobs(h, w, packed, chunk_size=5, fused=True), h, w, None)
    for a, r in zip(fused, plain):
        assert a.dtype == r.dtype and rel_err(a, r) < bound


def test_missing_entropy_gradient_is_caught(monkeypatch):
    """Negative control: a fused backward that drops the entropy term fails the comparison the real one passes."""
    h, w, b, packed = _inputs(torch.float64, seed=3)
    ref = _value_and_grads(lambda: _naive(h, w, b, packed, 1.0, None), h, w, b)
    real = lpmod._grad_z
    monkeypatch.setattr(lpmod, "_grad_z", lambda z, lse, ent, tg, gl, ge: real(z, lse, ent, tg, gl, None))
    got = _value_and_grads(lambda: packed_logprobs(h, w, packed, bias=b, chunk_size=4, fused=True), h, w, b)
    assert rel_err(got[0], ref[0]) < 1e-12           # values untouched
    assert rel_err(got[2], ref[2]) > 1e-3            # d hidden wrong


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
def test_no_full_logits_exist_or_are_saved(fused, monkeypatch):
    """At most chunk × V logits are ever made, and autograd keeps none of them for the backward."""
    h, w, b, packed = _inputs(torch.float64, seed=4)
    chunk, made = 3, []
    real = lpmod._logits
    monkeypatch.setattr(lpmod, "_logits", lambda hh, *a: (made.append(hh.shape[0]), real(hh, *a))[1])
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, ent = packed_logprobs(h, w, packed, bias=b, chunk_size=chunk, fused=fused)
    (lp.sum() + ent.sum()).backward()
    assert made and max(made) <= chunk
    assert saved and not [s for s in saved if len(s) == 2 and s[-1] == V], saved


def test_saved_logits_would_be_caught(monkeypatch):
    """Negative control for the test above: the plain path without per-chunk checkpointing keeps every chunk's
    logits for the backward (M × V in all), and the saved-tensor check sees it."""
    h, w, b, packed = _inputs(torch.float64, seed=4)
    monkeypatch.setattr(lpmod, "checkpoint", lambda fn, *args, **kw: fn(*args))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(tuple(t.shape)), t)[1], lambda t: t):
        packed_logprobs(h, w, packed, bias=b, chunk_size=3)
    assert [s for s in saved if len(s) == 2 and s[-1] == V]


def test_without_entropy_and_no_grad():
    h, w, b, packed = _inputs(torch.float64, seed=5)
    for fused in (False, True):
        lp, ent = packed_logprobs(h, w, packed, bias=b, with_entropy=False, fused=fused)
        assert ent is None
        lp.sum().backward()
    with torch.no_grad():
        lp, ent = packed_logprobs(h, w, packed, bias=b)
    assert rel_err(lp, _naive(h, w, b, packed, 1.0, None)[0]) < 1e-12


def test_layouts_back():
    _, _, _, packed = _inputs(torch.float64, seed=6)
    values = torch.arange(1.0, packed.layout.total_response_tokens + 1)
    padded = to_padded(values, packed)
    assert padded.shape == (packed.num_rows, packed.response_width)
    seq, cu = to_sequence_layout(values, packed)
    lens = packed.layout.flat_response_lens
    for b, r in enumerate(lens):
        off = int(cu[b + 1])
        # veRL's no_padding_2_padding: values[off - R - 1 : off - 1] are the row's response log-probs
        assert torch.equal(seq[off - r - 1:off - 1], padded[b, :r])
    assert seq.sum() == values.sum()


def test_bad_inputs_name_the_problem():
    h, w, b, packed = _inputs(torch.float64, seed=7)
    idx, tg = packed.predictor_index, packed.response_ids
    with pytest.raises(ValueError, match="hidden_states must be"):
        token_logprobs(h[None, None], w, idx, tg)
    with pytest.raises(ValueError, match="lm_head weight"):
        token_logprobs(h, w[:, :3], idx, tg)
    with pytest.raises(ValueError, match="share dtype"):
        token_logprobs(h, w.float(), idx, tg)
    with pytest.raises(ValueError, match="bias must be"):
        token_logprobs(h, w, idx, tg, bias=b[:3])
    with pytest.raises(ValueError, match="predictor_index has"):
        token_logprobs(h, w, idx[:-1], tg)
    with pytest.raises(ValueError, match="targets must be"):
        token_logprobs(h, w, idx, tg.float())
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(h, w, idx, tg, temperature=0)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(h, w, idx, tg, chunk_size=0)
    with pytest.raises(ValueError, match="logit_softcap"):
        token_logprobs(h, w, idx, tg, logit_softcap=-1.0)
    with pytest.raises(ValueError, match="tokens but the packed batch"):
        packed_logprobs(h[1:], w, packed)
    with pytest.raises(ValueError, match="one per response token"):
        to_sequence_layout(torch.zeros(3), packed)


@pytest.mark.parametrize("use", ["logp", "entropy"])
def test_fused_with_one_output_unused(use):
    """A loss on only one output: the fused backward gets None for the other and skips its term."""
    h, w, b, packed = _inputs(torch.float64, seed=8)
    pick = (lambda lp, ent: lp) if use == "logp" else (lambda lp, ent: ent)
    ref = torch.autograd.grad(pick(*_naive(h, w, b, packed, 0.9, 2.0)).sum(), (h, w, b))
    got = torch.autograd.grad(pick(*packed_logprobs(h, w, packed, bias=b, temperature=0.9, logit_softcap=2.0,
                                                    chunk_size=4, fused=True)).sum(), (h, w, b))
    assert max(rel_err(a, r) for a, r in zip(got, ref)) < 1e-12


def _rounded_chunk_products(acc, grad_rows, h_rows):
    """The known-wrong accumulation: each chunk's dW product rounded to the head's dtype (bf16) before the sum."""
    return acc + (grad_rows.t() @ h_rows).to(acc.dtype)


def test_weight_gradient_chunks_are_summed_in_float32():
    """The accumulator alone: bf16 chunk products summed in float32 are exact to float32 rounding; rounding each
    product to bf16 first is off by ~2^-9."""
    gen = torch.Generator().manual_seed(4)
    chunks = [(torch.randn(64, 16, generator=gen).bfloat16(), torch.randn(64, 8, generator=gen).bfloat16())
              for _ in range(50)]
    ref = sum(g.double().t() @ h.double() for g, h in chunks)
    fixed, rounded = torch.zeros(16, 8), torch.zeros(16, 8)
    for g, h in chunks:
        fixed = lpmod._accumulate_weight_grad(fixed, g, h)
        rounded = _rounded_chunk_products(rounded, g, h)
    assert rel_err(fixed, ref) < 1e-6 < 1e-4 < rel_err(rounded, ref)


def test_fused_weight_gradient_is_accumulated_in_float32():
    """bf16 head, 32 chunks whose dW products cancel (two halves of the same rows with opposite advantages and a
    few different targets, as GRPO's zero-mean advantages do): against float64, the fused backward with the
    known-wrong bf16 chunk products is more than twice as far off as the float32 accumulation (whose error is the
    bf16 logits and the final cast of dW to bf16)."""
    gen = torch.Generator().manual_seed(3)
    m, d, v = 2048, 32, 16
    half = torch.randn(m // 2, d, generator=gen, dtype=torch.float64)
    h64 = torch.cat([half, half])
    w64 = torch.randn(v, d, generator=gen, dtype=torch.float64) * 0.05
    targets = (h64 @ torch.randn(v, d, generator=gen, dtype=torch.float64).t()).argmax(-1)
    flip = torch.rand(m // 2, generator=gen) < 0.05
    targets[m // 2:][flip] = (targets[m // 2:][flip] + 1) % v
    advantages = torch.cat([torch.ones(m // 2), -torch.ones(m // 2)])

    def dw(h, w):
        h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
        lp, _ = token_logprobs(h, w, torch.arange(m), targets, chunk_size=64, with_entropy=False, fused=True)
        return torch.autograd.grad((lp * advantages.to(lp.dtype)).sum(), w)[0]

    h16, w16 = h64.to(torch.bfloat16), w64.to(torch.bfloat16)
    ref = dw(h16.double(), w16.double())
    fixed = dw(h16, w16)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lpmod, "_accumulate_weight_grad", _rounded_chunk_products)
        rounded = dw(h16, w16)
    err_fixed, err_rounded = rel_err(fixed, ref), rel_err(rounded, ref)
    assert fixed.dtype == torch.bfloat16 and err_rounded > 2 * err_fixed, (err_fixed, err_rounded)
