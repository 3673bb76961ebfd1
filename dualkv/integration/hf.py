"""HuggingFace ``transformers`` attention backend ``"dualkv"``.

A model whose ``attn_implementation`` is ``"dualkv"`` runs on a P+ΣR packed micro-batch: pass
``input_ids``/``position_ids`` of shape (1, T) and ``dualkv_layout=packed.layout`` to its forward (see
:func:`packed_model_inputs`). Every attention layer then calls :func:`dualkv.shared_prefix_attention`, which picks
the CUDA kernels for CUDA fp16/bf16 tensors and the reference otherwise.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from .. import shared_prefix_attention
from ..layout import GroupLayout
from .packing import PackedBatch

ATTN_NAME = "dualkv"
LAYOUT_KWARG = "dualkv_layout"

__all__ = ["ATTN_NAME", "LAYOUT_KWARG", "apply_dualkv", "dualkv_attention_forward", "packed_model_inputs",
           "register"]


def dualkv_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, scaling: float | None = None,
                             dropout: float = 0.0, sliding_window: int | None = None, softcap: float | None = None,
                             **kwargs) -> tuple[torch.Tensor, None]:
    """transformers attention interface: query (1, H, T, d), key/value (1, H_k, T, d) -> ((1, T, H, d), None)."""
    layout = kwargs.get(LAYOUT_KWARG)
    if not isinstance(layout, GroupLayout):
        raise ValueError(f"attn_implementation='{ATTN_NAME}' needs the packed layout: call the model with "
                         f"{LAYOUT_KWARG}=packed.layout (see dualkv.integration.hf.packed_model_inputs)")
    if query.shape[0] != 1:
        raise ValueError(f"the '{ATTN_NAME}' attention takes one packed sequence (batch size 1); got batch size "
                         f"{query.shape[0]}")
    if dropout and module.training:
        raise NotImplementedError(f"attention dropout ({dropout}) is not supported by the '{ATTN_NAME}' attention")
    if softcap:
        raise NotImplementedError(f"attention logit softcapping ({softcap}) is not supported by '{ATTN_NAME}'")
    if attention_mask is not None:
        raise ValueError(f"the '{ATTN_NAME}' attention builds its own mask from the layout; got an attention_mask")
    window = (int(sliding_window) - 1, 0) if sliding_window else (-1, -1)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    out = shared_prefix_attention(q, k, v, layout, softmax_scale=scaling, window_size=window)
    return out.unsqueeze(0), None


def register() -> None:
    """Register ``"dualkv"`` with ``transformers.AttentionInterface`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, dualkv_attention_forward)


@contextmanager
def apply_dualkv(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run an already built model with the ``"dualkv"`` attention inside the block, then restore its own.

    Keep the backward inside the block too when gradient checkpointing is on: it re-runs the attention.
    """
    register()
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTN_NAME)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


def packed_model_inputs(packed: PackedBatch) -> dict:
    """Forward kwargs for a ``"dualkv"`` model: (1, T) input and position ids plus the layout."""
    return {"input_ids": packed.input_ids.unsqueeze(0), "position_ids": packed.position_ids.unsqueeze(0),
            LAYOUT_KWARG: packed.layout}
