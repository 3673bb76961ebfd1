"""The per-layer packed attention the TRL integration registers for ``"dualkv"``: autocast-aware.

TRL's default mixed precision is autocast over the checkpoint's weights. With float32 weights a Qwen3 layer hands
its attention float32 queries/keys (its q/k RMSNorm multiplies by a float32 weight) next to bfloat16 values: stock
``sdpa`` is on autocast's lower-precision list and runs in bfloat16, and transformers' FlashAttention path casts
float32 inputs to the autocast dtype. :func:`autocast_packed_attention` does the same, so the packed attention
runs dualkv's CUDA kernels (which take fp16/bf16) instead of falling back to the float32 reference; without
autocast it is :func:`dualkv.shared_prefix_attention` unchanged.
"""

from __future__ import annotations

import torch

from ... import shared_prefix_attention
from ...layout import GroupLayout

__all__ = ["autocast_packed_attention"]


def autocast_packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: GroupLayout, *,
                              softmax_scale: float, window_size: tuple[int, int]) -> torch.Tensor:
    """q (T, H, d), k/v (T, H_k, d) -> (T, H, d); inputs cast to the autocast dtype when autocast is on."""
    device = q.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    return shared_prefix_attention(q, k, v, layout, softmax_scale=softmax_scale, window_size=window_size)
