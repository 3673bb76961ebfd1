"""Model configurations and whole-model FLOPs of a packed micro-batch in either layout.

Per token, every decoder layer runs matrix products whose forward cost is 2 FLOPs per weight used:

* attention projections: Q ``D*H*d``, K ``D*Hk*d``, V ``D*Hk*d`` (none when K = V), O ``H*d*D``;
* MLP: dense SwiGLU ``3*D*I``; MoE: router ``D*E`` plus ``top_k * 3*D*I_expert``;

and the LM head ``D*V`` once per token. Attention adds ``4*d*H`` per (query, key) pair
(:mod:`dualkv.analysis.pairs`), with a causal window on sliding-window layers. Backward: 2x the forward for the
matrix products, 2.5x for attention (FlashAttention's count); ``recompute=True`` adds one more forward (gradient
checkpointing). Norms, RoPE and element-wise ops are left out (well under 1% of the FLOPs).

Shipped configurations (``configs/*.json``): qwen3-8b, qwen3-30b-a3b, llama-3.1-8b, gemma4-31b-style.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from functools import lru_cache
from importlib import resources

from ..layout import GroupLayout
from .._checks import check_int, check_mode
from ..tree import PrefixTreeLayout
from .pairs import MODE_FACTOR, attention_flops, n_copy_pairs, useful_pairs

__all__ = [
    "AttentionShape",
    "QWEN3_8B_ATTENTION",
    "ModelConfig",
    "LayerSpec",
    "available_models",
    "load_model",
    "linear_flops_per_token",
    "model_flops",
    "step_speedup_bounds",
    "mfu",
    "amdahl",
    "PEAK_BF16_FLOPS",
]

#: Dense bf16 tensor-core peak (FLOP/s) from the vendors' datasheets, for MFU.
PEAK_BF16_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12}

#: Backward cost of the matrix products as a multiple of their forward (dX and dW).
_LINEAR_FACTOR = {"fwd": 1.0, "bwd": 2.0, "fwdbwd": 3.0}


@dataclass(frozen=True)
class AttentionShape:
    """The head geometry of one attention layer: q is (tokens, ``heads``, ``head_dim``), k and v are (tokens,
    ``kv_heads``, ``head_dim``). The field names are the benchmarks' (``dualkv bench kernel`` rows and options)."""

    heads: int
    kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for name in ("heads", "kv_heads", "head_dim"):
            object.__setattr__(self, name, int(check_int(getattr(self, name), name, 1)))
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")


@dataclass(frozen=True)
class LayerSpec:
    """Attention geometry of one decoder layer. ``window_left`` = -1: full causal attention."""

    kind: str
    heads: int
    kv_heads: int
    head_dim: int
    window_left: int
    k_eq_v: bool = False


@dataclass(frozen=True)
class ModelConfig:
    """The sizes that set a decoder-only model's FLOPs and attention memory (one ``configs/<name>.json``).

    ``sliding_window`` is the number of keys a sliding-window query sees, itself included (Hugging Face's
    convention), so its causal ``window_left`` is ``sliding_window - 1``. ``layer_pattern`` repeats over the
    layers ("full" or "sliding"); global ("full") layers may have their own head dim and KV heads.
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    sliding_window: int | None = None
    layer_pattern: tuple[str, ...] = ("full",)
    global_head_dim: int | None = None
    num_global_kv_heads: int | None = None
    attention_k_eq_v: bool = False
    tie_word_embeddings: bool = False
    description: str = ""
    source: str = ""
    _layers: tuple[LayerSpec, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "vocab_size"):
            check_int(getattr(self, name), f"{self.name}.{name}", 1)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads {self.num_heads} is not a multiple of num_kv_heads "
                             f"{self.num_kv_heads}")
        if check_int(self.num_experts, f"{self.name}.num_experts", 0):
            check_int(self.experts_per_token, f"{self.name}.experts_per_token", 1)
            check_int(self.moe_intermediate_size, f"{self.name}.moe_intermediate_size", 1)
            if self.experts_per_token > self.num_experts:
                raise ValueError(f"{self.name}: experts_per_token {self.experts_per_token} is more than num_experts "
                                 f"{self.num_experts}")
        if self.global_head_dim is not None:
            check_int(self.global_head_dim, f"{self.name}.global_head_dim", 1)
        if self.num_global_kv_heads is not None:
            check_int(self.num_global_kv_heads, f"{self.name}.num_global_kv_heads", 1)
            if self.num_heads % self.num_global_kv_heads:
                raise ValueError(f"{self.name}: num_heads {self.num_heads} is not a multiple of num_global_kv_heads "
                                 f"{self.num_global_kv_heads}")
        pattern = tuple(self.layer_pattern)
        bad = [k for k in pattern if k not in ("full", "sliding")]
        if not pattern or bad:
            raise ValueError(f"{self.name}: layer_pattern entries must be 'full' or 'sliding', got {list(pattern)}")
        if "sliding" in pattern:
            check_int(self.sliding_window, f"{self.name}.sliding_window", 1)
        layers = []
        for i in range(self.num_layers):
            kind = pattern[i % len(pattern)]
            if kind == "sliding":
                layers.append(LayerSpec(kind, self.num_heads, self.num_kv_heads, self.head_dim,
                                        self.sliding_window - 1))
            else:
                hybrid = "sliding" in pattern
                layers.append(LayerSpec(kind, self.num_heads,
                                        (self.num_global_kv_heads or self.num_kv_heads) if hybrid else self.num_kv_heads,
                                        (self.global_head_dim or self.head_dim) if hybrid else self.head_dim,
                                        -1, self.attention_k_eq_v))
        object.__setattr__(self, "layer_pattern", pattern)
        object.__setattr__(self, "_layers", tuple(layers))

    @property
    def layers(self) -> tuple[LayerSpec, ...]:
        return self._layers

    @property
    def attention_shape(self) -> AttentionShape:
        """The attention shape all layers share; a model whose layers differ (a hybrid's sliding and global layers
        with their own head dim or KV heads) raises, naming the shapes."""
        shapes = dict.fromkeys(AttentionShape(layer.heads, layer.kv_heads, layer.head_dim) for layer in self.layers)
        if len(shapes) != 1:
            raise ValueError(f"{self.name}: its layers have {len(shapes)} attention shapes {list(shapes)}; "
                             "read them per layer (ModelConfig.layers)")
        return next(iter(shapes))

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls) if not f.name.startswith("_")}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"model config {data.get('name', '?')!r} has unknown keys {unknown}")
        data = dict(data)
        if "layer_pattern" in data:
            data["layer_pattern"] = tuple(data["layer_pattern"])
        return cls(**data)


@lru_cache(maxsize=None)
def available_models() -> tuple[str, ...]:
    """Names of the shipped model configurations."""
    root = resources.files(__package__) / "configs"
    return tuple(sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json")))


def load_model(name: "str | ModelConfig") -> ModelConfig:
    """A shipped configuration by name (case-insensitive), or a :class:`ModelConfig` passed through."""
    if isinstance(name, ModelConfig):
        return name
    if not isinstance(name, str):
        raise TypeError(f"model must be a name or a ModelConfig, got {type(name).__name__}")
    key = name.lower()
    if key not in available_models():
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(available_models())}")
    text = (resources.files(__package__) / "configs" / f"{key}.json").read_text()
    return ModelConfig.from_dict(json.loads(text))


#: Qwen3-8B's attention (32 query heads, 8 KV heads, head dim 128, from ``configs/qwen3-8b.json``): the seed's
#: Table 1 shape, the kernel benchmarks' default and the shape their result rows are assumed to have when they do not
#: say.
QWEN3_8B_ATTENTION = load_model("qwen3-8b").attention_shape


def _layer_linear_params(cfg: ModelConfig, layer: LayerSpec) -> int:
    """Weights a token multiplies through in one layer (active experts only)."""
    d_model = cfg.hidden_size
    q = d_model * layer.heads * layer.head_dim
    kv = d_model * layer.kv_heads * layer.head_dim * (1 if layer.k_eq_v else 2)
    o = layer.heads * layer.head_dim * d_model
    if cfg.num_experts:
        mlp = d_model * cfg.num_experts + cfg.experts_per_token * 3 * d_model * cfg.moe_intermediate_size
    else:
        mlp = 3 * d_model * cfg.intermediate_size
    return q + kv + o + mlp


def linear_flops_per_token(model: "str | ModelConfig") -> float:
    """Forward FLOPs per token of every matrix product (all layers' projections and MLP, plus the LM head)."""
    cfg = load_model(model)
    params = sum(_layer_linear_params(cfg, layer) for layer in cfg.layers) + cfg.hidden_size * cfg.vocab_size
    return 2.0 * params


def model_flops(model: "str | ModelConfig", layout: "GroupLayout | PrefixTreeLayout", mode: str = "fwdbwd",
                layout_kind: str = "dualkv", recompute: bool = False) -> dict[str, float]:
    """Whole-model FLOPs of one packed micro-batch: ``{"tokens", "linear", "attention", "total"}`` (FLOPs).

    ``layout_kind`` "dualkv" counts the shared-prompt packing (``layout.total_tokens`` tokens, useful pairs);
    "ncopy" the N-copy packing of the same rows (``layout.tokens_std`` tokens, N-copy pairs). A PrefixTreeLayout
    counts the tree packing against its root-to-leaf paths.
    """
    cfg = load_model(model)
    mode = check_mode(mode)
    if layout_kind not in ("dualkv", "ncopy"):
        raise ValueError(f"layout_kind = {layout_kind!r}: expected 'dualkv' or 'ncopy'")
    if not isinstance(layout, (GroupLayout, PrefixTreeLayout)):
        raise TypeError(f"layout must be a GroupLayout or a PrefixTreeLayout, got {type(layout).__name__}")
    count = useful_pairs if layout_kind == "dualkv" else n_copy_pairs
    tokens = layout.total_tokens if layout_kind == "dualkv" else layout.tokens_std
    extra = 1.0 if recompute and mode != "fwd" else 0.0
    linear = tokens * linear_flops_per_token(cfg) * (_LINEAR_FACTOR[mode] + extra)
    pairs_by_window: dict[int, int] = {}
    attention = 0.0
    for layer in cfg.layers:
        if layer.window_left not in pairs_by_window:
            pairs_by_window[layer.window_left] = count(layout, layer.window_left)
        per_fwd = attention_flops(pairs_by_window[layer.window_left], layer.heads, layer.head_dim, "fwd")
        attention += per_fwd * (MODE_FACTOR[mode] + extra)
    return {"tokens": float(tokens), "linear": linear, "attention": attention, "total": linear + attention}


def step_speedup_bounds(model: "str | ModelConfig", layout: "GroupLayout | PrefixTreeLayout",
                        mode: str = "fwdbwd", recompute: bool = False) -> dict[str, float]:
    """Predicted compute speedup of the shared-prompt layout for one micro-batch, with its bounds.

    ``flop_ratio`` = N-copy FLOPs / dualkv FLOPs (the speedup if time followed FLOPs). It is a mediant of the
    per-token ratio ``rho`` and the attention ratio ``attn_ratio``, so it lies between them: ``lower`` =
    min(rho, attn_ratio) <= flop_ratio <= ``upper`` = max(rho, attn_ratio). Phases dualkv does not touch (rollout,
    optimizer, communication) lower a whole training step's speedup further: see :func:`amdahl`.
    """
    std = model_flops(model, layout, mode, "ncopy", recompute)
    dk = model_flops(model, layout, mode, "dualkv", recompute)
    rho = std["tokens"] / dk["tokens"]
    attn = std["attention"] / dk["attention"]
    return {"flop_ratio": std["total"] / dk["total"], "rho": rho, "attn_ratio": attn,
            "attention_share_std": std["attention"] / std["total"],
            "attention_share_dualkv": dk["attention"] / dk["total"],
            "lower": min(rho, attn), "upper": max(rho, attn)}


def amdahl(speedup: float, fraction: float) -> float:
    """Overall speedup when a ``fraction`` (0..1) of the time is sped up by ``speedup`` and the rest is not."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction = {fraction}: must be in [0, 1]")
    if not speedup > 0:
        raise ValueError(f"speedup = {speedup}: must be > 0")
    return 1.0 / ((1.0 - fraction) + fraction / speedup)


def mfu(flops: float, seconds: float, peak_flops: float = PEAK_BF16_FLOPS["H100"], num_gpus: int = 1) -> float:
    """Model FLOPs utilisation: ``flops / (seconds * peak_flops * num_gpus)`` (a fraction, not percent).

    ``flops`` should be the *useful* model FLOPs (e.g. :func:`model_flops` of the dualkv layout, or of the
    N-copy layout when judging the N-copy system on its own terms — say which)."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds = {seconds}: a measured time must be finite and > 0")
    if not (math.isfinite(peak_flops) and peak_flops > 0):
        raise ValueError(f"peak_flops = {peak_flops}: must be finite and > 0")
    return float(flops) / (seconds * peak_flops * check_int(num_gpus, "num_gpus", 1))
