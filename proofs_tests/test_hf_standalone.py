"""The "dualkv" attention used on its own, as ``AutoModelForCausalLM.from_config(cfg, attn_implementation="dualkv")``
(no enable_dualkv, so no input hook): packed inputs give the stock model's logits, and what it would get wrong —
omitted or wrong position ids, a padding mask, a KV cache holding earlier tokens — is refused by name."""

import copy

import pytest
import torch
import transformers

import dualkv.integration.hf as hf
from dualkv.testing import fp64_clean_norms
from dualkv.verify.model_checks import pack_rows, random_rows, stock_forward


@pytest.fixture(scope="module")
def models():
    """The same tiny float64 Qwen3 twice: built for "dualkv" directly, and stock (sdpa) for the reference."""
    config = transformers.Qwen3Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      max_position_embeddings=512)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="dualkv",
                                                          dtype=torch.float64)
    stock = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa",
                                                          dtype=torch.float64)
    stock.load_state_dict(model.state_dict())
    assert model.config._attn_implementation == "dualkv" and not hasattr(model, "_dualkv_state")
    return fp64_clean_norms(model).eval(), fp64_clean_norms(stock).eval()


@pytest.fixture(scope="module")
def batch():
    rows, groups = random_rows((6, 3), ((2, 3), (1,)), 97, seed=0)
    return rows, pack_rows(rows, groups)


def _response_logprobs(model, packed, **inputs):
    with torch.no_grad():
        logits = model(input_ids=packed.input_ids[None], dualkv_layout=packed.layout, **inputs).logits[0]
    logp = torch.log_softmax(logits[packed.predictor_index], -1)
    return logp.gather(-1, packed.response_ids[:, None])[:, 0]


def test_packed_inputs_with_positions_give_the_stock_result(models, batch):
    model, stock = models
    rows, packed = batch
    with torch.no_grad():
        ref, _, _ = stock_forward(stock, rows)
    got = _response_logprobs(model, packed, position_ids=packed.position_ids[None], use_cache=False)
    assert (got - ref).abs().max().item() < 1e-12


def test_omitted_positions_are_refused(models, batch):
    """Reproduces the reported silent error first: with 0..T-1 positions (what transformers makes when position_ids
    are omitted) the log-probs are off; the attention now refuses them by name."""
    model, stock = models
    rows, packed = batch
    with torch.no_grad():
        ref, _, _ = stock_forward(stock, rows)
    arange = torch.arange(packed.layout.total_tokens)[None]
    with pytest.MonkeyPatch.context() as patch:           # the unchecked path (what happened before the check)
        patch.setattr(hf, "_check_positions", lambda *_: None)
        silent = _response_logprobs(model, packed)
        assert torch.equal(silent, _response_logprobs(model, packed, position_ids=arange))
    assert (silent - ref).abs().max().item() > 1e-2
    with pytest.raises(ValueError, match="position_ids do not match the packed layout"):
        _response_logprobs(model, packed)
    with pytest.raises(ValueError, match="position_ids do not match the packed layout"):
        _response_logprobs(model, packed, position_ids=arange)


def test_a_padding_mask_is_refused(models, batch):
    model, _ = models
    _, packed = batch
    t = packed.layout.total_tokens
    inputs = dict(position_ids=packed.position_ids[None], use_cache=False)
    _response_logprobs(model, packed, attention_mask=torch.ones(1, t, dtype=torch.long), **inputs)  # masks nothing
    mask = torch.ones(1, t, dtype=torch.long)
    mask[0, -2:] = 0
    with pytest.raises(ValueError, match="takes no padding mask"):
        _response_logprobs(model, packed, attention_mask=mask, **inputs)


def test_a_kv_cache_with_earlier_tokens_is_refused(models, batch):
    model, _ = models
    _, packed = batch
    with torch.no_grad():
        out = model(input_ids=packed.input_ids[None], position_ids=packed.position_ids[None],
                    dualkv_layout=packed.layout, use_cache=True)      # an empty cache on the first call is fine
        with pytest.raises(NotImplementedError, match="without a KV cache"):
            model(input_ids=packed.input_ids[None, :1], position_ids=packed.position_ids[None, :1],
                  dualkv_layout=packed.layout, past_key_values=out.past_key_values)


def test_positions_are_read_once_per_forward(models, batch, monkeypatch):
    """Every layer sees the same position tensor: the check reads it once (one host sync per forward)."""
    model, _ = models
    _, packed = batch
    reads = []
    layout_tensors = type(packed.layout).device_tensors
    monkeypatch.setattr(type(packed.layout), "device_tensors",
                        lambda self, device: reads.append(device) or layout_tensors(self, device))
    positions = packed.position_ids[None].clone()
    _response_logprobs(model, packed, position_ids=positions, use_cache=False)
    assert len(reads) == 1 and model.config.num_hidden_layers > 1
    positions[0, 0] = 5                                   # modified in place: checked again, and refused
    with pytest.raises(ValueError, match="position_ids do not match"):
        _response_logprobs(model, packed, position_ids=positions, use_cache=False)
