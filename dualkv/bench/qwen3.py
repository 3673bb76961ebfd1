"""Qwen3 shapes for the benchmarks (published model configs, written out: nothing is downloaded) and builders of
randomly initialised decoder layers / whole models on the target device and dtype."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

__all__ = ["QWEN3", "TINY", "qwen3_config", "build_layer", "build_model"]

_COMMON = dict(vocab_size=151936, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False,
               rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})

#: Dimensions of the released Qwen3 dense models (config.json of each).
QWEN3 = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
}
#: Tiny dimensions for smoke runs (--tiny).
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, tie_word_embeddings=False, vocab_size=256)


def qwen3_config(name: str, *, max_positions: int, num_layers: int | None = None):
    """A ``Qwen3Config`` of model ``name`` (or ``"tiny"``) able to hold ``max_positions`` positions."""
    import transformers

    if name != "tiny" and name not in QWEN3:
        raise ValueError(f"unknown Qwen3 size {name!r}; choose from tiny, {', '.join(QWEN3)}")
    fields = {**_COMMON, **(TINY if name == "tiny" else QWEN3[name])}
    if num_layers is not None:
        fields["num_hidden_layers"] = num_layers
    fields["max_position_embeddings"] = max(40960, max_positions)
    return transformers.Qwen3Config(**fields)


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_layer(config, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """(Qwen3DecoderLayer, Qwen3RotaryEmbedding) with random weights, made directly on ``device`` in ``dtype``."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

    torch.manual_seed(seed)
    with torch.device(device), _default_dtype(dtype):
        layer = Qwen3DecoderLayer(config, layer_idx=0)
        rotary = Qwen3RotaryEmbedding(config)
    return layer.train(), rotary


def build_model(config, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A randomly initialised ``Qwen3ForCausalLM`` made directly on ``device`` in ``dtype``."""
    import transformers

    torch.manual_seed(seed)
    with torch.device(device), _default_dtype(dtype):
        model = transformers.Qwen3ForCausalLM(config)
    return model.train()

