"""The chunked log-prob head on whole models: ``model_response_logprobs`` (packed decoder + head) equals the stock
model's full logits on each N-copy row at a temperature — log-probs, entropy and every parameter gradient — for the
plain and the fused head; a tokenizer-style left-padded batch packed with ``pack_padded`` comes back in the
caller's padded layout; ``enable_dualkv``/``disable_dualkv`` for trainers that build the model once."""

import pytest
import torch

from dualkv.integration.hf import disable_dualkv, enable_dualkv
from dualkv.integration.logprobs import model_response_logprobs, to_padded
from dualkv.integration.packing import pack_padded
from dualkv.testing import rel_err, tiny_causal_lm
from dualkv.verify.model_checks import pack_rows, random_rows

TEMPERATURE = 0.7


def stock_rows(model, rows, temperature):
    """Stock model (its own attention, full logits incl. final softcap) on each row: (logp, entropy) in row order."""
    lps, ents = [], []
    for prompt, response in rows:
        logits = model(input_ids=torch.cat([prompt, response])[None]).logits[0]
        p, r = len(prompt), len(response)
        logp = torch.log_softmax(logits[p - 1:p + r - 1] / temperature, -1)
        lps.append(logp.gather(-1, response[:, None])[:, 0])
        ents.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(lps), torch.cat(ents)


def _grads(model, lp, ent, seed):
    gen = torch.Generator().manual_seed(seed)
    w1, w2 = (torch.randn(lp.shape[0], generator=gen, dtype=torch.float64).to(lp.dtype) for _ in range(2))
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad((lp * w1).sum() + (ent * w2).sum(), params)


def _check_against_stock(model, rows, groups, *, fused, bound, chunk_size=5, grad_bound=None):
    packed = pack_rows(rows, groups)
    lp_ref, ent_ref = stock_rows(model, rows, TEMPERATURE)
    g_ref = _grads(model, lp_ref, ent_ref, 0)
    enable_dualkv(model)
    try:
        lp, ent = model_response_logprobs(model, packed, temperature=TEMPERATURE, chunk_size=chunk_size, fused=fused)
        grads = _grads(model, lp, ent, 0)
    finally:
        disable_dualkv(model)
    assert rel_err(lp, lp_ref) <= bound and rel_err(ent, ent_ref) <= bound, (rel_err(lp, lp_ref),
                                                                               rel_err(ent, ent_ref))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    bad = {n: e for n, a, b in zip(names, grads, g_ref) if not (e := rel_err(a, b)) <= (grad_bound or bound)}
    assert not bad, bad
    return lp, packed


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("arch", ["qwen3", "gemma4", "llama3"])
def test_head_equals_stock_float64(arch, fused):
    model = tiny_causal_lm(arch, dtype=torch.float64, seed=3)
    rows, groups = random_rows((8, 2, 5), ((3, 1, 4), (1,), (6, 2)), model.config.vocab_size, 3)
    _check_against_stock(model, rows, groups, fused=fused, bound=1e-9)


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
def test_head_equals_stock_float32(fused):
    model = tiny_causal_lm("qwen3_moe", dtype=torch.float32, seed=4)
    rows, groups = random_rows((7, 4), ((2, 5), (1, 1, 3)), model.config.vocab_size, 4)
    _check_against_stock(model, rows, groups, fused=fused, bound=1e-5)


def test_head_with_gradient_checkpointing_enable_disable():
    """Trainer-style: enable once, gradient checkpointing on, backward outside any context manager."""
    model = tiny_causal_lm("gemma3", dtype=torch.float64, seed=5)
    model.gradient_checkpointing_enable()
    model.train()
    rows, groups = random_rows((6, 3), ((2, 4), (1,)), model.config.vocab_size, 5)
    _check_against_stock(model, rows, groups, fused=True, bound=1e-9)
    assert model.config._attn_implementation == "sdpa"   # restored


def test_first_token_from_wrong_row_is_caught():
    """Negative control: predicting every first response token from the group's first response row (not the
    shared last prompt position) is caught by the same comparison."""
    model = tiny_causal_lm("qwen3", dtype=torch.float64, seed=6)
    rows, groups = random_rows((5,), ((3, 2),), model.config.vocab_size, 6)
    packed = pack_rows(rows, groups)
    lp_ref, _ = stock_rows(model, rows, 1.0)
    wrong = packed.predictor_index.clone()
    wrong[0] += 1   # row 0's first token predicted from its own first token
    from dualkv.integration.logprobs import token_logprobs
    with torch.no_grad():
        enable_dualkv(model)
        hidden = model.get_decoder()(input_ids=packed.input_ids[None], position_ids=packed.position_ids[None],
                                     dualkv_layout=packed.layout).last_hidden_state[0]
        disable_dualkv(model)
        good, _ = token_logprobs(hidden, model.lm_head.weight, packed.predictor_index, packed.response_ids)
        bad, _ = token_logprobs(hidden, model.lm_head.weight, wrong, packed.response_ids)
    assert rel_err(good, lp_ref) < 1e-12 and rel_err(bad, lp_ref) > 1e-3


def _tokenizer_batch(rows, pad_id, prompt_width, response_width):
    """What a tokenizer + rollout produce: prompts left-padded to prompt_width, responses right-padded."""
    ids = torch.full((len(rows), prompt_width + response_width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, (prompt, response) in enumerate(rows):
        ids[b, prompt_width - len(prompt):prompt_width] = prompt
        mask[b, prompt_width - len(prompt):prompt_width] = 1
        ids[b, prompt_width:prompt_width + len(response)] = response
        mask[b, prompt_width:prompt_width + len(response)] = 1
    return ids, mask


def test_left_padded_tokenizer_batch():
    """pack_padded of a left/right padded batch; values return as (B, response_width) matching the stock model
    run on the same padded batch (attention mask + position ids from the mask, as veRL does)."""
    model = tiny_causal_lm("qwen2", dtype=torch.float64, seed=7)
    rows, groups = random_rows((4, 7), ((3, 1), (5, 2, 2)), model.config.vocab_size, 7)
    ids, mask = _tokenizer_batch(rows, pad_id=0, prompt_width=9, response_width=6)
    packed = pack_padded(ids, mask, 9, groups)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask,
                       position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        logp_all = torch.log_softmax(logits[:, 8:-1], -1).gather(-1, ids[:, 9:, None])[..., 0]
        ref = logp_all * mask[:, 9:]
        enable_dualkv(model)
        lp, _ = model_response_logprobs(model, packed, with_entropy=False)
        disable_dualkv(model)
    out = to_padded(lp, packed)
    assert out.shape == (len(rows), 6)
    assert rel_err(out, ref) < 1e-9
    assert rel_err(lp, stock_rows(model, rows, 1.0)[0]) < 1e-9


def test_registered_name_builds_a_dualkv_model():
    """attn_implementation="dualkv" works at construction once dualkv.integration.hf is imported."""
    model = tiny_causal_lm("qwen3", dtype=torch.float64, seed=8, attn_implementation="dualkv")
    assert model.config._attn_implementation == "dualkv"
    stock = tiny_causal_lm("qwen3", dtype=torch.float64, seed=8)
    rows, groups = random_rows((5,), ((2, 3),), model.config.vocab_size, 8)
    packed = pack_rows(rows, groups)
    with torch.no_grad():
        lp, _ = model_response_logprobs(model, packed)
        ref, _ = stock_rows(stock, rows, 1.0)
    assert rel_err(lp, ref) < 1e-9
