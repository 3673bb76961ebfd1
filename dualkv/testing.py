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


def representation_slack(ref64: torch.Tensor, dtype: torch.dtype) -> float:
    """FlashAttention's gradient slack: 2 * max |(ref + 0.3 - 0.3) - ref| at ``dtype`` — the rounding of values of
    magnitude ~0.3 in that dtype (its tests add this to the bound of dq/dk/dv)."""
    r = ref64.detach().to(device="cpu", dtype=dtype)
    return 2.0 * (r + 0.3 - 0.3 - r).abs().max().item() if r.numel() else 0.0


def cancellation_slack(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_out: torch.Tensor,
                       scale: float | None = None) -> float:
    """fp32 floor of the dQ/dK error: both go through dS = P (dP - D), where dP = dO . V and D = dO . O are fp32 sums
    of head_dim products of about the same size that a kernel forms in different orders. Where they cancel exactly
    in PyTorch's own computation (a window of 0: O = V), the PyTorch error FlashAttention's rule scales is 0, while
    any other summation order leaves up to head_dim * u32 * |dO| |V| per entry. This is that floor carried to dQ / dK
    (times max |K|, |Q| and the softmax scale), doubled; it is ~1e-5 at head_dim 256 for unit-variance inputs."""
    d = q.shape[-1]
    scale = d ** -0.5 if scale is None else scale
    peak = lambda t: t.detach().abs().max().item()  # noqa: E731
    return 2.0 * d * 2.0 ** -24 * peak(d_out) * peak(v) * max(peak(q), peak(k)) * scale


# ---------------------------------------------------------------------------------------------- errors
def _as_f64_cpu(out: torch.Tensor, ref: torch.Tensor) -> list[torch.Tensor]:
    """``out`` and ``ref`` in float64 on the CPU; their shapes must be equal (broadcasting one against the other would
    compare different elements, and a (n, 1) / (1, m) pair would pass on any values that happen to line up)."""
    if out.shape != ref.shape:
        raise ValueError(f"compared tensors differ in shape: {tuple(out.shape)} against the reference's "
                         f"{tuple(ref.shape)}")
    return [t.detach().to(device="cpu", dtype=torch.float64) for t in (out, ref)]


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
        """A finite error within a finite bound (an infinite bound, from a low-precision baseline with NaN / inf,
        would pass anything)."""
        return math.isfinite(self.error) and math.isfinite(self.bound) and self.error <= self.bound


def compare(out: torch.Tensor, ref64: torch.Tensor, *, dtype: torch.dtype, ref_lowp: torch.Tensor | None = None,
            is_grad: bool = False, fp32_floor: float = 0.0) -> Comparison:
    """Apply the project's tolerance rule to ``out`` (computed at ``dtype``) against the float64 oracle;
    ``fp32_floor`` (dQ/dK rows: :func:`cancellation_slack`) is added to low-precision gradient bounds."""
    if dtype in REL_BOUNDS:
        return Comparison(rel_err(out, ref64), REL_BOUNDS[dtype], "rel")
    if ref_lowp is None:
        raise ValueError(f"{dtype} results need the same computation done by PyTorch at {dtype} (ref_lowp)")
    factor = FA_FACTOR_GRAD if is_grad else FA_FACTOR_OUT
    bound = factor * max_abs_err(ref_lowp, ref64) + FA_ATOL[dtype]
    if is_grad:
        bound += representation_slack(ref64, dtype) + fp32_floor
    return Comparison(max_abs_err(out, ref64), bound, "max_abs")


def bound_margin(row: dict) -> float:
    """How far a recorded check (a dict with ``error`` and ``bound``; optionally an absolute floor ``atol`` on its
    ``max_abs``) is into its bound: <= 1 passed, > 1 failed, ``inf`` for a NaN error. Reports use it to show each
    run's closest check."""
    ratios = [row["error"] / row["bound"] if row["bound"] else (math.inf if row["error"] else 0.0)]
    if row.get("atol"):
        ratios.append(row["max_abs"] / row["atol"])
    ratios = [r for r in ratios if not math.isnan(r)]     # NaN compares false both ways: it would never be worst
    return min(ratios) if ratios else math.inf


def assert_rows_pass(rows, max_error: float | None = None) -> None:
    """Fail (AssertionError naming every failing quantity) unless every verify Row passed (and, if given, every
    error is <= ``max_error``)."""
    bad = [f"{r.quantity}: {r.error:.3e} > {r.bound:.3e}" for r in rows if not r.passed]
    if bad:  # raised, not asserted: python -O must not turn a failed check into a pass
        raise AssertionError(f"{rows[0].config} {rows[0].dtype}: " + "; ".join(bad))
    if max_error is not None:
        worst = max(rows, key=lambda r: r.error)
        if not worst.error <= max_error:
            raise AssertionError(f"{worst.config} {worst.quantity}: {worst.error:.3e} > {max_error:.1e}")


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
def random_qkv(layout: GroupLayout, heads: int, kv_heads: int, head_dim: int, *, dtype: torch.dtype,
               device: torch.device | str = "cpu", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed (T, H, d) q and (T, H_k, d) k, v drawn N(0, 1) in float64 then cast (so all dtypes share values)."""
    gen = torch.Generator().manual_seed(seed)
    t = layout.total_tokens
    make = lambda h: torch.randn(t, h, head_dim, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)  # noqa: E731
    return make(heads), make(kv_heads), make(kv_heads)


# ---------------------------------------------------------------------------------------------- models
def _norm_scale_kind(module: torch.nn.Module) -> str:
    """How an RMSNorm applies its weight: ``"weight"`` (w * x), ``"one_plus"`` (Gemma 1-3: (1 + w) * x) or
    ``"none"`` (no weight). Decided by probing the module's own forward in float32, so a new architecture's norm is
    classified by what it computes, not by its class name."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return "none"
    probe = torch.linspace(-1.0, 1.0, weight.shape[-1], dtype=torch.float32, device=weight.device)[None] + 0.25
    with torch.no_grad():
        got = module(probe.to(weight.dtype)).to(torch.float64)
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
        p64 = probe.to(torch.float64)
        normed = p64 * torch.rsqrt(p64.pow(2).mean(-1, keepdim=True) + eps)
        w = weight.detach().to(torch.float64)
        errors = {"weight": (got - w * normed).abs().max().item(),
                  "one_plus": (got - (1.0 + w) * normed).abs().max().item()}
    kind = min(errors, key=errors.get)
    if errors[kind] > 1e-2 * max(1.0, normed.abs().max().item()):
        raise RuntimeError(f"{type(module).__name__} computes neither w*x/rms(x) nor (1+w)*x/rms(x); "
                           "fp64_clean_norms cannot replace it")
    return kind


def fp64_clean_norms(model: torch.nn.Module) -> torch.nn.Module:
    """Make HF RMSNorms compute in their input dtype (stock ones round through float32, which caps a float64
    model's gradient agreement near 1e-7). Only for exactness tests.

    Each norm keeps its own weight convention (w, 1 + w for Gemma 1-3, none for Gemma 4's weightless v_norm),
    found by probing its forward (:func:`_norm_scale_kind`)."""

    def forward(self, x):
        eps = getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6))
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        if self._dualkv_scale_kind == "none":
            return normed
        weight = self.weight
        if self._dualkv_scale_kind == "one_plus":
            weight = 1.0 + weight
        return weight.to(x.dtype) * normed

    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm") and not hasattr(module, "_dualkv_scale_kind"):
            module._dualkv_scale_kind = _norm_scale_kind(module)
            module.forward = types.MethodType(forward, module)
    return model


#: The tiny architectures :func:`tiny_causal_lm` builds (name -> what it exercises).
TINY_ARCHS = {
    "qwen3": "Qwen3 (q/k norms, GQA)",
    "llama": "Llama (GQA, default RoPE)",
    "qwen2": "Qwen2 (qkv bias, MHA)",
    "llama3": "Llama 3 (llama3 RoPE scaling)",
    "qwen2_sliding": "Qwen2 with a sliding-window layer (window 5)",
    "qwen3_sliding": "Qwen3 with a sliding-window layer (window 5)",
    "qwen3_moe": "Qwen3-MoE (4 experts, top-2)",
    "gemma3": "Gemma 3 (sliding window 4 on 2 of 3 layers, query_pre_attn_scalar scaling, (1+w) norms)",
    "gemma4": "Gemma 4 hybrid: sliding layers head dim 256 (window 4), a global layer head dim 512 with k=v, "
              "per-layer inputs, final logit softcap 30",
    "gemma4_kv_shared": "Gemma 4 with the last 2 of 4 layers reusing earlier layers' K/V (E2B-style)",
}


def _tiny_spec(arch: str, vocab: int) -> tuple[str, str, dict]:
    """(config class name, model class name, config fields) of a tiny ``arch`` beyond the shared small sizes."""
    llama3_rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    sliding = {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}
    gemma4 = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512,
              "sliding_window": 4, "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": vocab,
              "final_logit_softcapping": 30.0}
    specs = {
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
        "llama": ("LlamaConfig", "LlamaForCausalLM", {"head_dim": 8}),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
        "llama3": ("LlamaConfig", "LlamaForCausalLM", {"head_dim": 8, "rope_parameters": llama3_rope}),
        "qwen2_sliding": ("Qwen2Config", "Qwen2ForCausalLM", sliding),
        "qwen3_sliding": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8, **sliding}),
        "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                      {"head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                       "norm_topk_prob": True, "experts_implementation": "eager"}),  # grouped_mm has no float64
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                   {"head_dim": 8, "num_hidden_layers": 3, "sliding_window": 4, "query_pre_attn_scalar": 12,
                    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]}),
        "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM",
                   {**gemma4, "num_hidden_layers": 3, "attention_k_eq_v": True, "num_global_key_value_heads": 1,
                    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]}),
        "gemma4_kv_shared": ("Gemma4TextConfig", "Gemma4ForCausalLM",
                             {**gemma4, "num_hidden_layers": 4, "num_kv_shared_layers": 2,
                              "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                                              "full_attention"]}),
    }
    if arch not in specs:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(TINY_ARCHS)}")
    return specs[arch]


def _temper_qk_norms(model: torch.nn.Module) -> None:
    """Scale q/k norm weights by d^(-1/4): Gemma 4 attends with scaling 1.0 after q/k RMSNorms, so at random init its
    logits have standard deviation sqrt(d) (~23 for d = 512) and the softmax is one-hot, which makes float32
    gradients ill-conditioned. Trained norms keep logits O(1); this gives the random model the same regime."""
    with torch.no_grad():
        for module in model.modules():
            for name in ("q_norm", "k_norm"):
                norm = getattr(module, name, None)
                if norm is not None and isinstance(getattr(norm, "weight", None), torch.Tensor):
                    norm.weight.mul_(norm.weight.shape[-1] ** -0.25)


def tiny_causal_lm(arch: str, *, dtype: torch.dtype = torch.float64, seed: int = 0, vocab: int = 97,
                   **overrides) -> torch.nn.Module:
    """A tiny randomly initialised ``transformers`` causal LM built from a config (nothing is downloaded).

    ``arch`` is one of :data:`TINY_ARCHS`. Attention starts as ``sdpa`` (the stock N-copy path). ``overrides``
    replace config fields (they win over the architecture's tiny defaults).
    """
    import transformers

    config_name, model_name, fields = _tiny_spec(arch, vocab)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  attn_implementation="sdpa")
    config = getattr(transformers, config_name)(**{**common, **fields, **overrides})
    cls = getattr(transformers, model_name)
    torch.manual_seed(seed)
    model = cls(config).to(dtype)
    if arch.startswith("gemma4"):
        _temper_qk_norms(model)
    return fp64_clean_norms(model) if dtype == torch.float64 else model
