"""Model configurations, whole-model FLOPs, speedup bounds and MFU."""

from __future__ import annotations

import pytest

from dualkv import GroupLayout
from dualkv.analysis import (QWEN3_8B_ATTENTION, AttentionShape, ModelConfig, amdahl, attention_flops,
                             available_models, linear_flops_per_token, load_model, mfu, model_flops,
                             step_speedup_bounds, useful_pairs)
from dualkv.analysis.tokens import group_layout


def test_shipped_models():
    assert set(available_models()) == {"qwen3-8b", "qwen3-30b-a3b", "llama-3.1-8b", "gemma4-31b-style"}
    assert load_model("Qwen3-8B").name == "qwen3-8b"
    cfg = load_model("qwen3-8b")
    assert load_model(cfg) is cfg


def test_attention_shapes():
    """Qwen3-8B's attention is read from its shipped config (the benchmarks' default shape: these values are the
    ones their result files and file names assume); a model whose layers differ has no single shape."""
    assert QWEN3_8B_ATTENTION == AttentionShape(heads=32, kv_heads=8, head_dim=128)
    assert QWEN3_8B_ATTENTION == load_model("qwen3-8b").attention_shape
    assert load_model("qwen3-30b-a3b").attention_shape == AttentionShape(32, 4, 128)
    with pytest.raises(ValueError, match=r"gemma4-31b-style: its layers have 2 attention shapes .*head_dim=512"):
        load_model("gemma4-31b-style").attention_shape
    with pytest.raises(ValueError, match="heads 12 is not a multiple of kv_heads 8"):
        AttentionShape(12, 8, 128)
    with pytest.raises(ValueError, match="head_dim"):
        AttentionShape(32, 8, 0)
    with pytest.raises(TypeError, match="kv_heads must be an integer"):
        AttentionShape(32, True, 128)
    assert type(AttentionShape(32.0, 8, 128).heads) is int


def test_the_benchmarks_qwen3_table_agrees_with_the_shipped_config():
    """dualkv.bench.qwen3 writes Qwen3-8B's Hugging Face fields out for building layers; they must be the config's."""
    from dualkv.bench.qwen3 import QWEN3

    hf, cfg = QWEN3["qwen3-8b"], load_model("qwen3-8b")
    assert (hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]) == (
        QWEN3_8B_ATTENTION.heads, QWEN3_8B_ATTENTION.kv_heads, QWEN3_8B_ATTENTION.head_dim)
    assert (hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"], hf["tie_word_embeddings"]) == (
        cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.tie_word_embeddings)


@pytest.mark.parametrize("name,params", [
    # matrix weights a token passes through (+ an untied input embedding), against the published sizes:
    ("qwen3-8b", 8.19e9),          # 8.2B total (6.95B non-embedding + 2 x 0.62B embedding/head)
    ("llama-3.1-8b", 8.03e9),      # 8.0B
    ("qwen3-30b-a3b", 3.35e9),     # 3.3B activated
    ("gemma4-31b-style", 30.7e9),  # ~31B
])
def test_per_token_flops_match_published_parameter_counts(name, params):
    cfg = load_model(name)
    embedding = 0 if cfg.tie_word_embeddings else cfg.hidden_size * cfg.vocab_size   # tied: the LM head is it
    assert linear_flops_per_token(cfg) / 2 + embedding == pytest.approx(params, rel=0.01)


def test_qwen3_8b_per_token_flops_by_hand():
    d, layers, vocab = 4096, 36, 151936
    per_layer = d * 32 * 128 + 2 * d * 8 * 128 + 32 * 128 * d + 3 * d * 12288
    assert linear_flops_per_token("qwen3-8b") == 2 * (layers * per_layer + d * vocab)


def test_gemma_hybrid_layers():
    cfg = load_model("gemma4-31b-style")
    kinds = [layer.kind for layer in cfg.layers]
    assert kinds.count("sliding") == 50 and kinds.count("full") == 10 and kinds[5] == "full"
    sliding = cfg.layers[0]
    full = cfg.layers[5]
    assert (sliding.head_dim, sliding.kv_heads, sliding.window_left) == (256, 16, 1023)
    assert (full.head_dim, full.kv_heads, full.window_left, full.k_eq_v) == (512, 4, -1, True)
    layout = group_layout(8, 4096, 2048)
    flops = model_flops(cfg, layout, "fwd")
    expected = 50 * attention_flops(useful_pairs(layout, 1023), 32, 256, "fwd") \
        + 10 * attention_flops(useful_pairs(layout), 32, 512, "fwd")
    assert flops["attention"] == pytest.approx(expected)
    # the window caps the sliding layers' pairs: far fewer than unwindowed
    assert useful_pairs(layout, 1023) < useful_pairs(layout) / 3


def test_model_flops_modes_and_layouts():
    layout = GroupLayout.from_lengths([300, 200], [[50, 70], [10]])
    fwd = model_flops("llama-3.1-8b", layout, "fwd", "dualkv")
    both = model_flops("llama-3.1-8b", layout, "fwdbwd", "dualkv")
    bwd = model_flops("llama-3.1-8b", layout, "bwd", "dualkv")
    assert fwd["tokens"] == layout.total_tokens
    assert both["linear"] == pytest.approx(3 * fwd["linear"]) and bwd["linear"] == pytest.approx(2 * fwd["linear"])
    assert both["attention"] == pytest.approx(3.5 * fwd["attention"])
    assert bwd["attention"] == pytest.approx(2.5 * fwd["attention"])
    rec = model_flops("llama-3.1-8b", layout, "fwdbwd", "dualkv", recompute=True)
    assert rec["total"] == pytest.approx(both["total"] + fwd["total"])
    std = model_flops("llama-3.1-8b", layout, "fwd", "ncopy")
    assert std["tokens"] == layout.tokens_std
    assert std["linear"] / fwd["linear"] == pytest.approx(layout.tokens_std / layout.total_tokens)


@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3-30b-a3b", "gemma4-31b-style"])
@pytest.mark.parametrize("N,P,R", [(16, 65536, 512), (8, 2048, 2048), (32, 4096, 2048), (2, 64, 4096)])
def test_speedup_bounds_bracket_the_flop_ratio(model, N, P, R):
    s = step_speedup_bounds(model, group_layout(N, P, R))
    assert s["lower"] <= s["flop_ratio"] <= s["upper"]
    assert s["rho"] == pytest.approx(N * (P + R) / (P + N * R))
    assert 0 < s["attention_share_std"] < 1


def test_mfu_and_amdahl():
    assert mfu(989e12, 1.0) == pytest.approx(1.0)
    assert mfu(989e12, 2.0, num_gpus=4) == pytest.approx(0.125)
    assert amdahl(2.0, 0.5) == pytest.approx(4 / 3)
    assert amdahl(10.0, 0.0) == 1.0 and amdahl(3.0, 1.0) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="seconds"):
        mfu(1e12, 0.0)
    with pytest.raises(ValueError, match="fraction"):
        amdahl(2.0, 1.5)


def test_bad_model_input():
    with pytest.raises(ValueError, match="unknown model 'gpt-5'.*qwen3-8b"):
        load_model("gpt-5")
    with pytest.raises(TypeError, match="model must be a name"):
        load_model(8)
    base = dict(name="t", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                intermediate_size=128, vocab_size=100)
    with pytest.raises(ValueError, match="unknown keys"):
        ModelConfig.from_dict({**base, "rope": 1})
    with pytest.raises(ValueError, match="not a multiple"):
        ModelConfig.from_dict({**base, "num_kv_heads": 3})
    with pytest.raises(ValueError, match="layer_pattern"):
        ModelConfig.from_dict({**base, "layer_pattern": ["local"]})
    with pytest.raises(TypeError, match="sliding_window"):
        ModelConfig.from_dict({**base, "layer_pattern": ["sliding", "full"]})
    with pytest.raises(ValueError, match="hidden_size = 0"):
        ModelConfig.from_dict({**base, "hidden_size": 0})
    with pytest.raises(ValueError, match="layout_kind"):
        model_flops("qwen3-8b", group_layout(2, 10, 5), "fwd", "padded")


def test_mfu_and_amdahl_refuse_nan_and_inf():
    """A NaN or infinite time is no measurement: it must be refused, not turned into a NaN or 0 utilisation (a NaN
    also makes ``dualkv model --json`` print invalid JSON)."""
    for seconds in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="seconds"):
            mfu(1e12, seconds)
    with pytest.raises(ValueError, match="peak_flops"):
        mfu(1e12, 1.0, peak_flops=float("nan"))
    with pytest.raises(ValueError, match="speedup"):
        amdahl(float("nan"), 0.5)


def test_report_mfu_does_not_count_recompute():
    """MFU counts model FLOPs: gradient checkpointing's extra forward is work the hardware does, not model FLOPs
    (docs/RESULTS.md: "no recompute counted"), so ``recompute`` changes the FLOP counts but not the MFU."""
    from dualkv.analysis import model_report

    plain = model_report(8, 8192, 2048, mode="fwdbwd", seconds=2.0)
    ckpt = model_report(8, 8192, 2048, mode="fwdbwd", recompute=True, seconds=2.0)
    assert ckpt["flops_dualkv"]["total"] > plain["flops_dualkv"]["total"]
    assert ckpt["mfu"]["dualkv_flops"] == pytest.approx(plain["mfu"]["dualkv_flops"])
    assert ckpt["mfu"]["ncopy_equivalent"] == pytest.approx(plain["mfu"]["ncopy_equivalent"])
    assert plain["mfu"]["dualkv_flops"] == pytest.approx(plain["flops_dualkv"]["total"] / (2.0 * 989e12))


@pytest.mark.parametrize("extra,error,match", [
    ({"global_head_dim": -16}, ValueError, "t.global_head_dim = -16"),
    ({"global_head_dim": 2.5}, ValueError, "t.global_head_dim = 2.5 must be a whole number"),
    ({"num_global_kv_heads": 0}, ValueError, "t.num_global_kv_heads = 0"),
    ({"num_global_kv_heads": 3}, ValueError, "num_heads 4 is not a multiple of num_global_kv_heads 3"),
    ({"num_experts": 4, "experts_per_token": 8, "moe_intermediate_size": 32}, ValueError,
     "experts_per_token 8 is more than num_experts 4"),
    ({"num_experts": -1}, ValueError, "t.num_experts = -1"),
])
def test_bad_global_layer_and_expert_fields_are_refused(extra, error, match):
    """The hybrid's global-layer fields and the MoE fields are checked like the others: a negative or fractional
    head dim, or a KV-head count that does not divide the heads, must not turn into silently wrong FLOPs."""
    base = dict(name="t", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                intermediate_size=128, vocab_size=100, layer_pattern=["sliding", "full"], sliding_window=8)
    with pytest.raises(error, match=match):
        ModelConfig.from_dict({**base, **extra})
