"""What every check of dualkv shares: the independent N-copy oracle, random cases, and the one tolerance rule.

Used by ``proofs_tests/``, ``dualkv verify`` and the GPU tests, so a bound means the same thing everywhere.

Tolerance rule:
* float64 (and float32) results are compared with the float64 oracle by relative error
  ``||out - ref|| / ||ref||`` against a fixed bound (:data:`REL_BOUNDS`);
* float16/bfloat16 results use FlashAttention's criterion: the max error against the float64 oracle must be at
  most ``factor`` times the max error of the same computation done by PyTorch at that dtype (factor 2 for
  outputs, 3 for gradients), plus a tiny absolute slack for exact-zero baselines.
"""

from __future__ import annotations

import math
import random
import types
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from .layout import GroupLayout

#: Relative-error bounds for high-precision dtypes (float64 oracle).
REL_BOUNDS = {torch.float64: 1e-10, torch.float32: 1e-5}
#: FlashAttention's criterion factors.
FA_FACTOR_OUT = 2.0
FA_FACTOR_GRAD = 3.0
#: Absolute slack added to FlashAttention-style bounds (guards against a zero PyTorch error).
FA_ATOL = {torch.bfloat16: 1e-4, torch.float16: 1e-5}


# ---------------------------------------------------------------------------------------------- errors
def _as_f64_cpu(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().to(device="cpu", dtype=torch.float64) for t in tensors]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| computed in float64 on the CPU (inf if out has NaN/inf)."""
    out64, ref64 = _as_f64_cpu(out, ref)
    if not torch.isfinite(out64).all():
        return math.inf
    denom = ref64.norm().item()
    return (out64 - ref64).norm().item() / (denom if denom > 0 else 1.0)


def max_abs_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = _as_f64_cpu(out, ref)
    if not torch.isfinite(out64).all():
        return math.inf
    return (out64 - ref64).abs().max().item() if out64.numel() else 0.0


@dataclass(frozen=True)
class Comparison:
    """One quantity compared with its oracle."""

    error: float
    bound: float
    metric: str  # "rel" or "max_abs"

    @property
    def passed(self) -> bool:
        return math.isfinite(self.error) and self.error <= self.bound


def compare(out: torch.Tensor, ref64: torch.Tensor, *, dtype: torch.dtype, ref_lowp: torch.Tensor | None = None,
            is_grad: bool = False) -> Comparison:
    """Apply the project's tolerance rule to ``out`` (computed at ``dtype``) against the float64 oracle."""
    if dtype in REL_BOUNDS:
        return Comparison(rel_err(out, ref64), REL_BOUNDS[dtype], "rel")
    if ref_lowp is None:
        raise ValueError(f"{dtype} results need the same computation done by PyTorch at {dtype} (ref_lowp)")
    factor = FA_FACTOR_GRAD if is_grad else FA_FACTOR_OUT
    bound = factor * max_abs_err(ref_lowp, ref64) + FA_ATOL[dtype]
    return Comparison(max_abs_err(out, ref64), bound, "max_abs")


# ---------------------------------------------------------------------------------------------- oracle
def _sdpa_row(q, k, v, q_pos, k_pos, scale, left, right):
    """q (Lq, H, d) k/v (Lk, Hk, d) through torch SDPA with an explicit boolean mask (any dtype, CPU or GPU)."""
    mask = k_pos[None, :] <= q_pos[:, None]
    if left >= 0:
        mask &= k_pos[None, :] >= q_pos[:, None] - left
    if right >= 0:
        mask &= k_pos[None, :] <= q_pos[:, None] + right
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                         scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(0, 1)


def n_copy_oracle(q_std: torch.Tensor, k_std: torch.Tensor, v_std: torch.Tensor, cu_seqlens: Sequence[int],
                  scale: float | None = None, window: tuple[int, int] = (-1, -1)) -> torch.Tensor:
    """Causal attention of N-copy rows with PyTorch's own SDPA, one row at a time (independent of dualkv's code).

    Args:
        q_std: (T_std, H, d); k_std, v_std: (T_std, H_k, d); cu_seqlens: row offsets (host ints).
        window: (left, right) in positions; right is capped at 0 (causal).
    Returns:
        (T_std, H, d).
    """
    d = q_std.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    left = window[0]
    outs = []
    for a, b in zip(cu_seqlens, cu_seqlens[1:]):
        pos = torch.arange(b - a, device=q_std.device)
        outs.append(_sdpa_row(q_std[a:b], k_std[a:b], v_std[a:b], pos, pos, scale, left, 0))
    return torch.cat(outs, 0)


# ---------------------------------------------------------------------------------------------- random cases
def random_layout(rng: random.Random, *, groups: int = 1, n_choices: Sequence[int] = (1, 2, 3, 5),
                  len_choices: Sequence[int] = (1, 2, 7, 16, 33, 63, 64, 65)) -> GroupLayout:
    """A random multi-group layout drawn from awkward lengths."""
    prompts = [rng.choice(len_choices) for _ in range(groups)]
    responses = [[rng.choice(len_choices) for _ in range(rng.choice(n_choices))] for _ in range(groups)]
    return GroupLayout.from_lengths(prompts, responses)


def random_qkv(layout: GroupLayout, heads: int, kv_heads: int, head_dim: int, *, dtype: torch.dtype,
               device: torch.device | str = "cpu", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed (T, H, d) q and (T, H_k, d) k, v drawn N(0, 1) in float64 then cast (so all dtypes share values)."""
    gen = torch.Generator().manual_seed(seed)
    t = layout.total_tokens
    make = lambda h: torch.randn(t, h, head_dim, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)  # noqa: E731
    return make(heads), make(kv_heads), make(kv_heads)


# ---------------------------------------------------------------------------------------------- models
def fp64_clean_norms(model: torch.nn.Module) -> torch.nn.Module:
    """Make HF RMSNorms compute in their input dtype (stock ones round through float32, which caps a float64
    model's gradient agreement near 1e-7). Only for exactness tests."""

    def forward(self, x):
        eps = getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6))
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        weight = self.weight
        if getattr(self, "_dualkv_offset_one", False):
            weight = 1.0 + weight
        return weight.to(x.dtype) * normed

    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm") and hasattr(module, "weight"):
            module._dualkv_offset_one = name.startswith("Gemma")
            module.forward = types.MethodType(forward, module)
    return model


def tiny_causal_lm(arch: str, *, dtype: torch.dtype = torch.float64, seed: int = 0, vocab: int = 97,
                   **overrides) -> torch.nn.Module:
    """A tiny randomly initialised ``transformers`` causal LM built from a config (nothing is downloaded).

    ``arch`` is one of ``qwen3``, ``llama``, ``qwen2``. Attention starts as ``sdpa`` (the stock N-copy path).
    """
    import transformers

    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  attn_implementation="sdpa")
    common.update(overrides)
    if arch == "qwen3":
        config = transformers.Qwen3Config(head_dim=8, **common)
        cls = transformers.Qwen3ForCausalLM
    elif arch == "llama":
        config = transformers.LlamaConfig(head_dim=8, **common)
        cls = transformers.LlamaForCausalLM
    elif arch == "qwen2":
        config = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose qwen3, llama or qwen2")
    torch.manual_seed(seed)
    model = cls(config).to(dtype)
    return fp64_clean_norms(model) if dtype == torch.float64 else model
