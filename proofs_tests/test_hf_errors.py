"""The "dualkv" backend refuses what it would get wrong, with an error naming the problem: attention softcapping,
dropout in training, attention sinks, non-causal layers, missing/wrong layout or positions, padding masks, batched
or cached inputs; and a known-wrong run (positions not checked) shows why the position check exists."""

import pytest
import torch
import transformers

from dualkv.integration.hf import (apply_dualkv, disable_dualkv, dualkv_attention_forward, enable_dualkv,
                                   packed_model_inputs)
from dualkv.integration.logprobs import model_response_logprobs
from dualkv.testing import rel_err, tiny_causal_lm
from dualkv.verify.model_checks import pack_rows, random_rows, stock_forward


def _packed(model, seed=0):
    rows, groups = random_rows((5, 3), ((2, 3), (1,)), model.config.vocab_size, seed)
    return rows, pack_rows(rows, groups)


def _tiny(cls_name, config_name, **fields):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, attn_implementation="sdpa")
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(getattr(transformers, config_name)(**{**base, **fields}))


def test_attention_softcapping_is_refused():
    # eager: newer transformers (5.24) refuse to build Gemma2 with sdpa
    model = _tiny("Gemma2ForCausalLM", "Gemma2Config", attn_logit_softcapping=50.0, attn_implementation="eager")
    _, packed = _packed(model)
    with apply_dualkv(model), pytest.raises(NotImplementedError, match="softcapping"):
        model(**packed_model_inputs(packed))


def test_attention_sinks_are_refused():
    model = _tiny("GptOssForCausalLM", "GptOssConfig", num_local_experts=2, num_experts_per_tok=1,
                  attn_implementation="eager")
    _, packed = _packed(model)
    with apply_dualkv(model), pytest.raises(NotImplementedError, match="sinks"):
        model(**packed_model_inputs(packed))


def test_dropout_in_training_is_refused_but_eval_runs():
    model = tiny_causal_lm("qwen3", dtype=torch.float32, attention_dropout=0.1)
    _, packed = _packed(model)
    with apply_dualkv(model):
        model.eval()
        model(**packed_model_inputs(packed))
        model.train()
        with pytest.raises(NotImplementedError, match="dropout"):
            model(**packed_model_inputs(packed))


def test_bidirectional_layers_are_refused():
    model = tiny_causal_lm("gemma3", dtype=torch.float32, use_bidirectional_attention=True)
    _, packed = _packed(model)
    with apply_dualkv(model), pytest.raises(NotImplementedError, match="not causal"):
        model(**packed_model_inputs(packed))


@pytest.fixture
def model_and_batch():
    model = tiny_causal_lm("qwen3", dtype=torch.float64)
    rows, packed = _packed(model)
    return model, rows, packed


def test_missing_layout(model_and_batch):
    model, _, packed = model_and_batch
    inputs = packed_model_inputs(packed)
    del inputs["dualkv_layout"]
    with apply_dualkv(model), pytest.raises(ValueError, match="dualkv_layout=packed.layout"):
        model(**inputs)
    with apply_dualkv(model, check_inputs=False), pytest.raises(ValueError, match="needs the packed layout"):
        model(**inputs)


def test_missing_or_wrong_positions(model_and_batch):
    model, _, packed = model_and_batch
    inputs = packed_model_inputs(packed)
    with apply_dualkv(model):
        with pytest.raises(ValueError, match="needs position_ids"):
            model(**{**inputs, "position_ids": None})
        arange = torch.arange(packed.layout.total_tokens)[None]
        with pytest.raises(ValueError, match="position_ids do not match"):
            model(**{**inputs, "position_ids": arange})


def test_unchecked_wrong_positions_give_wrong_answers(model_and_batch, monkeypatch):
    """Negative control for the position checks (model input and attention): without them, 0..T-1 positions run
    and are silently wrong; with them, the attention refuses them even when the input hook is off."""
    import dualkv.integration.hf as hf

    model, rows, packed = model_and_batch
    inputs = {**packed_model_inputs(packed), "position_ids": torch.arange(packed.layout.total_tokens)[None]}
    with torch.no_grad():
        ref, _, _ = stock_forward(model, rows)
        with apply_dualkv(model, check_inputs=False):
            good, _ = model_response_logprobs(model, packed, with_entropy=False)
            with pytest.raises(ValueError, match="position_ids do not match"):
                model.get_decoder()(**inputs)
            monkeypatch.setattr(hf, "_check_positions", lambda *_: None)
            hidden = model.get_decoder()(**inputs).last_hidden_state[0]
            logp = torch.log_softmax(model.lm_head(hidden[packed.predictor_index]), -1)
            bad = logp.gather(-1, packed.response_ids[:, None])[:, 0]
    assert rel_err(good, ref) < 1e-12 and rel_err(bad, ref) > 1e-4


def test_padding_mask_batch_and_token_count(model_and_batch):
    model, _, packed = model_and_batch
    inputs = packed_model_inputs(packed)
    t = packed.layout.total_tokens
    with apply_dualkv(model):
        model(**{**inputs, "attention_mask": torch.ones(1, t, dtype=torch.long)})   # all ones: fine
        mask = torch.ones(1, t, dtype=torch.long)
        mask[0, 0] = 0
        with pytest.raises(ValueError, match="no padding mask"):
            model(**{**inputs, "attention_mask": mask})
        with pytest.raises(ValueError, match=r"shape \(1, %d" % t):
            model(**{**inputs, "input_ids": inputs["input_ids"].repeat(2, 1)})
        with pytest.raises(ValueError, match=r"shape \(1, %d" % t):
            model(**{**inputs, "input_ids": inputs["input_ids"][:, 1:]})
    with apply_dualkv(model, check_inputs=False):
        with pytest.raises(ValueError, match="batch size 1"):
            model(**{**inputs, "input_ids": inputs["input_ids"].repeat(2, 1),
                     "position_ids": inputs["position_ids"].repeat(2, 1)})


def test_direct_interface_errors():
    class Layer(torch.nn.Module):
        is_causal = True

    layer, layout = Layer(), pack_rows(*random_rows((3,), ((2,),), 97, 0)).layout
    q = torch.randn(1, 4, layout.total_tokens, 8)
    k = torch.randn(1, 2, layout.total_tokens, 8)
    with pytest.raises(NotImplementedError, match="KV cache"):
        dualkv_attention_forward(layer, q, torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8), None,
                                 dualkv_layout=layout)
    with pytest.raises(NotImplementedError, match="sinks"):
        dualkv_attention_forward(layer, q, k, k, None, s_aux=torch.zeros(4), dualkv_layout=layout)
    with pytest.raises(ValueError, match="builds its mask"):
        dualkv_attention_forward(layer, q, k, k, torch.zeros(1, 1, 5, 5), dualkv_layout=layout)
    with pytest.raises(ValueError, match="needs the packed layout"):
        dualkv_attention_forward(layer, q, k, k, None, dualkv_layout=[3, 2])
    layer.config = type("C", (), {"layer_types": ["sliding_attention"]})()
    layer.layer_idx = 0
    with pytest.raises(ValueError, match="sliding_attention layer but no sliding_window"):
        dualkv_attention_forward(layer, q, k, k, None, dualkv_layout=layout)
    layer.config.layer_types = ["chunked_attention"]
    with pytest.raises(NotImplementedError, match="chunked_attention"):
        dualkv_attention_forward(layer, q, k, k, None, sliding_window=None, dualkv_layout=layout)


def test_enable_disable_state_errors(model_and_batch):
    model, _, _ = model_and_batch
    enable_dualkv(model)
    assert model.config._attn_implementation == "dualkv"
    with pytest.raises(RuntimeError, match="already enabled"):
        enable_dualkv(model)
    disable_dualkv(model)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="not enabled"):
        disable_dualkv(model)
    with pytest.raises(TypeError, match="PreTrainedModel"):
        enable_dualkv(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("field", ["logits_scaling", "lm_head_multiplier", "logit_scale"])
def test_logit_scaling_head_is_refused(model_and_batch, field):
    model, _, packed = model_and_batch
    setattr(model.config, field, 4.0)   # (a fresh model per test)
    with apply_dualkv(model), pytest.raises(NotImplementedError, match=field):
        model_response_logprobs(model, packed)


def test_logprobs_of_a_model_not_in_dualkv_mode_are_refused(model_and_batch):
    """model_response_logprobs on a stock-attention model is refused by name; the negative control shows what the
    unchecked call returned (the packed rows attend to each other: wrong log-probs)."""
    model, rows, packed = model_and_batch
    with pytest.raises(ValueError, match="runs 'sdpa'.*enable_dualkv"):
        model_response_logprobs(model, packed)
    with torch.no_grad():
        ref, _, _ = stock_forward(model, rows)
        hidden = model.get_decoder()(**packed_model_inputs(packed)).last_hidden_state[0]   # sdpa on packed rows
        logp = torch.log_softmax(model.lm_head(hidden[packed.predictor_index]), -1)
        unchecked = logp.gather(-1, packed.response_ids[:, None])[:, 0]
        with apply_dualkv(model):
            good, _ = model_response_logprobs(model, packed, with_entropy=False)
    assert rel_err(good, ref) < 1e-12 and (unchecked - ref).abs().max().item() > 1e-2
    model.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="runs 'eager'"):
        model_response_logprobs(model, packed)


def test_hybrid_models_are_refused(monkeypatch):
    """Token mixers outside attention (Qwen3-Next's linear-attention layers) would run across the packed rows:
    enable_dualkv and the log-prob head refuse them by name; the negative control runs the hybrid model's packed
    micro-batch with the check bypassed and gets log-probs that differ from the stock model's; the same model with
    only full-attention layers passes the check."""
    from dualkv.integration import hf

    fields = dict(num_hidden_layers=2, linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
                  linear_value_head_dim=8, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                  shared_expert_intermediate_size=16)
    hybrid = _tiny("Qwen3NextForCausalLM", "Qwen3NextConfig", layer_types=["linear_attention", "full_attention"],
                   **fields).float().eval()  # (its MoE's grouped matmul has no float64)
    rows, packed = _packed(hybrid)
    with pytest.raises(NotImplementedError, match="linear_attention layers"):
        enable_dualkv(hybrid)
    holder = torch.nn.Module()  # no config: the module scan alone names the mixer
    holder.add_module("mixer", hybrid.model.layers[0].linear_attn)
    with pytest.raises(NotImplementedError, match="GatedDeltaNet"):
        hf.check_token_mixers(holder, "probe")
    with torch.no_grad():
        ref, _, _ = stock_forward(hybrid, rows)
        with monkeypatch.context() as patch:
            patch.setattr(hf, "check_token_mixers", lambda model, what: None)   # the unchecked (wrong) path
            with apply_dualkv(hybrid):
                unchecked, _ = model_response_logprobs(hybrid, packed, with_entropy=False)
    assert (unchecked - ref).abs().max().item() > 1e-3
    plain = _tiny("Qwen3NextForCausalLM", "Qwen3NextConfig", layer_types=["full_attention", "full_attention"],
                  **fields)
    hf.check_token_mixers(plain, "probe")   # the same family with attention only passes (its stock forward with no
    #                                          linear layers fails in transformers 5.10, so it is not run here)
