"""The systems a benchmark compares, each as (token layout, attention function) around the same stock HF modules.

* ``dualkv`` — P+ΣR packing, the ``"dualkv"`` attention (:func:`dualkv.shared_prefix_attention`: the CUDA kernels
  for CUDA bf16/fp16 when available, else the reference).
* ``fa2_ncopy`` — baseline (a): the N-copy varlen layout (N rows [P; R_i], N(P+R) tokens) with PyTorch's
  FlashAttention-2 (``torch.nn.attention.varlen.varlen_attn``, causal).
* ``pg_padded`` — baseline (b), Prefix-Grouper style as the paper's appendix runs it: a padded (N, P + R_max)
  batch through every layer op; attention = two FlashAttention calls: the prompt's causal self-attention once, then
  every response over [the prompt K/V repeated per response (expand + copy); its own K/V], bottom-right causal.
  (The published Prefix Grouper packs [prefix; suffixes]; this is the padded variant the paper benchmarks.)
* ``flex`` — baseline (c): the P+ΣR packing with ``torch.compile(flex_attention)`` and the BlockMask
  ``k <= q and same group and (k in prompt or seg[k] == seg[q])``, built per shape.
* ``cudnn_ncopy`` — the N-copy varlen layout of ``fa2_ncopy`` (so every other op sees the same N(P+R) tokens) with
  cuDNN attention (Hopper's fastest stock attention): each layer scatters the copies into a padded (N, L_max) batch,
  runs ``aten._scaled_dot_product_cudnn_attention`` causally (padding at the end, which no causal query sees) and
  gathers the rows back.
* ``cudnn_cascade`` — dualkv's P+ΣR packing with the attention composed from three cuDNN calls merged by
  log-sum-exp (:func:`dualkv.cascade.shared_prefix_attention`): the same layout as ``dualkv``, so it isolates what
  the fused kernels add beyond the packing.

On a CPU (smoke runs only) FlashAttention is replaced by :func:`dualkv.reference.standard_varlen_attention`
(same semantics), FlexAttention's backward (absent on CPUs) by SDPA with the same mask function made dense, and
cuDNN by :class:`dualkv.cascade.ReferenceEngine` (plain PyTorch math).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from .. import cascade
from .._checks import resolve_scale
from ..integration import hf as dualkv_hf
from ..integration.packing import PackedBatch
from ..layout import GroupLayout
from ..reference import standard_varlen_attention
from .registry import layer_systems

__all__ = ["SYSTEMS", "SystemBatch", "build_batch", "padded_slots", "register_attention", "varlen_causal"]

#: The layer-level systems of the one registry (dualkv.bench.registry).
SYSTEMS = layer_systems()
ATTN_NAMES = {"dualkv": dualkv_hf.ATTN_NAME, "fa2_ncopy": "dualkv_bench_fa2_varlen",
              "cudnn_ncopy": "dualkv_bench_cudnn_ncopy", "cudnn_cascade": "dualkv_bench_cudnn_cascade",
              "pg_padded": "dualkv_bench_pg_padded", "flex": "dualkv_bench_flex"}
if set(ATTN_NAMES) != set(SYSTEMS):
    raise RuntimeError(f"layer systems {SYSTEMS} and their attention functions {sorted(ATTN_NAMES)} disagree")


@dataclass
class SystemBatch:
    """One system's view of a packed micro-batch.

    Attributes:
        grid: (B, L) shape the model/layer runs on.
        gather: (B*L,) int64 packed token shown at each grid slot (padding slots repeat token 0).
        position_ids: (B, L) int64.
        to_packed: (T,) int64 grid slot (flattened) of each packed token's first copy.
        predictor_index: (ΣR,) int64 grid slot (flattened) whose output predicts each response token.
        forward_kwargs: what the attention function reads (layout, cu_seqlens, prompt length, block mask).
    """

    system: str
    grid: tuple[int, int]
    gather: torch.Tensor
    position_ids: torch.Tensor
    to_packed: torch.Tensor
    predictor_index: torch.Tensor
    forward_kwargs: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def attn_name(self) -> str:
        return ATTN_NAMES[self.system]


def _t(array, device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(device)


def _packed_batch(packed: PackedBatch, device) -> SystemBatch:
    t = packed.layout.total_tokens
    return SystemBatch("dualkv", (1, t), torch.arange(t, device=device), packed.position_ids.to(device)[None],
                       torch.arange(t, device=device), packed.predictor_index.to(device),
                       {dualkv_hf.LAYOUT_KWARG: packed.layout})


def _ncopy_batch(packed: PackedBatch, device) -> SystemBatch:
    layout = packed.layout
    index = layout.copy_token_index
    cu = layout.copy_cu_seqlens
    rows_p = [layout.prompt_lens[g] for g in layout.response_group]
    predictor = np.concatenate([np.arange(cu[b] + p - 1, cu[b] + p - 1 + r)
                                for b, (p, r) in enumerate(zip(rows_p, layout.flat_response_lens))])
    positions = packed.position_ids.cpu().numpy()[index]
    kwargs = {"bench_cu_seqlens": torch.from_numpy(cu.astype(np.int32)).to(device),
              "bench_max_seqlen": int(np.diff(cu).max())}
    return SystemBatch("fa2_ncopy", (1, len(index)), _t(index, device), _t(positions, device)[None],
                       _t(layout.first_copy_index, device), _t(predictor, device), kwargs)


def padded_slots(seq_lens) -> tuple[np.ndarray, int]:
    """Sequences of ``seq_lens`` tokens, packed back to back, as rows of a batch padded at the end to the longest:
    (slot of each packed token in the flattened (len(seq_lens), width) batch (int64), width). cuDNN N-copy's layout
    at both benchmark levels."""
    width = int(max(seq_lens))
    return np.concatenate([c * width + np.arange(n) for c, n in enumerate(seq_lens)]).astype(np.int64), width


def _cudnn_ncopy_batch(packed: PackedBatch, device) -> SystemBatch:
    """``fa2_ncopy``'s token layout; its attention reads where each row sits in the padded (copies, L_max) batch."""
    batch = _ncopy_batch(packed, device)
    lens = np.diff(packed.layout.copy_cu_seqlens)
    slot_of_row, width = padded_slots(lens)
    batch.system = "cudnn_ncopy"
    batch.forward_kwargs = {"bench_slot_of_row": _t(slot_of_row, device), "bench_padded_grid": (len(lens), width)}
    return batch


def _padded_batch(packed: PackedBatch, device) -> SystemBatch:
    layout = packed.layout
    if layout.num_groups != 1:
        raise ValueError("the padded Prefix-Grouper baseline runs one prompt group per micro-batch")
    p, lens = layout.prompt_lens[0], layout.flat_response_lens
    width = p + max(lens)
    gather = np.zeros((len(lens), width), dtype=np.int64)
    to_packed = np.empty(layout.total_tokens, dtype=np.int64)
    to_packed[:p] = np.arange(p)
    predictor = []
    for b, (start, r) in enumerate(zip(layout.response_starts, lens)):
        gather[b, :p] = np.arange(p)
        gather[b, p:p + r] = np.arange(start, start + r)
        to_packed[start:start + r] = b * width + p + np.arange(r)
        predictor.append(b * width + p - 1 + np.arange(r))
    positions = np.broadcast_to(np.arange(width), (len(lens), width))
    return SystemBatch("pg_padded", (len(lens), width), _t(gather.reshape(-1), device), _t(positions, device),
                       _t(to_packed, device), _t(np.concatenate(predictor), device), {"bench_prompt_len": p})


@dataclass
class FlexMask:
    """The shared-prompt mask as a FlexAttention ``mask_mod`` over packed token indices, and its BlockMask."""

    mask_mod: Callable
    block_mask: object = None


def shared_prompt_mask_mod(group: torch.Tensor, segment: torch.Tensor) -> Callable:
    """mask_mod(b, h, q, kv) = kv <= q and same group and (kv in the prompt or in q's response).

    group: (T,) group of each packed token; segment: (T,) 0 for prompt tokens, 1 + response index otherwise.
    """

    def mask_mod(b, h, q, kv):
        visible = (segment[kv] == 0) | (segment[kv] == segment[q])
        return (kv <= q) & (group[kv] == group[q]) & visible

    return mask_mod


def flex_mask(packed: "PackedBatch | GroupLayout", device, *, build_block_mask: bool = True,
              mask_mod_fn: Callable = shared_prompt_mask_mod) -> FlexMask:
    """The FlexMask of a packed micro-batch (group and segment ids of every packed token) on ``device``."""
    layout = packed if isinstance(packed, GroupLayout) else packed.layout
    group = np.empty(layout.total_tokens, dtype=np.int64)
    segment = np.zeros(layout.total_tokens, dtype=np.int64)
    for g in range(layout.num_groups):
        a, _ = layout.prompt_range(g)
        group[a:a + layout.prompt_lens[g] + sum(layout.response_lens[g])] = g
    for s, (start, r) in enumerate(zip(layout.response_starts, layout.flat_response_lens)):
        segment[start:start + r] = s + 1
    mask = FlexMask(mask_mod_fn(_t(group, device), _t(segment, device)))
    if build_block_mask:
        t = layout.total_tokens
        mask.block_mask = block_mask_builder(device)(mask.mask_mod, None, None, t, t, device=device)
    return mask


def block_mask_builder(device) -> Callable:
    """FlexAttention's ``create_block_mask`` for masks on ``device``: on CUDA ``torch.compile(create_block_mask)`` (one
    per process), which never builds the dense O(T^2) mask (PyTorch's advice since its ``_compile=True`` flag was
    deprecated); elsewhere the eager function."""
    from torch.nn.attention.flex_attention import create_block_mask

    if torch.device(device).type != "cuda":
        return create_block_mask
    if not _COMPILED_BLOCK_MASK:
        _raise_recompile_limits()
        _COMPILED_BLOCK_MASK.append(torch.compile(create_block_mask))
    return _COMPILED_BLOCK_MASK[0]


_COMPILED_BLOCK_MASK: list[Callable] = []  # block_mask_builder's compiled create_block_mask, once made


def build_batch(system: str, packed: PackedBatch, device: torch.device | str, *,
                flex_mask_fn: Callable[[PackedBatch, object], FlexMask] = flex_mask) -> SystemBatch:
    """``system``'s layout of ``packed`` (one of :data:`SYSTEMS`)."""
    if system == "dualkv":
        return _packed_batch(packed, device)
    if system == "fa2_ncopy":
        return _ncopy_batch(packed, device)
    if system == "pg_padded":
        return _padded_batch(packed, device)
    if system == "cudnn_ncopy":
        return _cudnn_ncopy_batch(packed, device)
    if system == "cudnn_cascade":
        batch = _packed_batch(packed, device)
        batch.system = "cudnn_cascade"
        return batch
    if system == "flex":
        batch = _packed_batch(packed, device)
        batch.system = "flex"
        batch.forward_kwargs = {"bench_flex": flex_mask_fn(packed, device)}
        return batch
    raise ValueError(f"unknown system {system!r}; choose from {', '.join(SYSTEMS)}")


# ---------------------------------------------------------------------------------------------- attention ops
def _varlen_kwargs(h: int, hk: int) -> dict:
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    kwargs = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if "enable_gqa" in params and h != hk:
        kwargs["enable_gqa"] = True
    return kwargs


def varlen_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                  max_q: int, max_k: int, scale: float) -> torch.Tensor:
    """Causal varlen attention, bottom-right aligned: q (Tq, H, d), k/v (Tk, H_k, d), int32 cu_seqlens.

    CUDA: PyTorch's FlashAttention-2 (``varlen_attn``; torch >= 2.9). CPU: the dualkv reference of the same op.
    """
    if q.is_cuda:
        from torch.nn.attention.varlen import varlen_attn

        return varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), cu_q, cu_k, max_q, max_k, scale=scale,
                           **_varlen_kwargs(q.shape[1], k.shape[1]))
    return standard_varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=True)


def _no_window(sliding_window) -> None:
    if sliding_window:
        raise NotImplementedError("the benchmark baselines implement full causal attention only")


def _fa2_varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                          sliding_window=None, **kwargs):
    """(a) N-copy varlen: query (1, H, T_std, d) -> ((1, T_std, H, d), None)."""
    _no_window(sliding_window)
    cu, max_len = kwargs["bench_cu_seqlens"], kwargs["bench_max_seqlen"]
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    return varlen_causal(q, k, v, cu, cu, max_len, max_len, scaling)[None], None


def _pg_padded_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                         sliding_window=None, **kwargs):
    """(b) padded two-call attention: query (N, H, P + R_max, d) -> ((N, P + R_max, H, d), None)."""
    _no_window(sliding_window)
    p = kwargs["bench_prompt_len"]
    n, h, width, d = query.shape
    hk, rmax = key.shape[1], width - p
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))           # (N, L, heads, d)
    dev = query.device
    cu_p = torch.tensor([0, p], dtype=torch.int32, device=dev)
    out_prompt = varlen_causal(q[0, :p], k[0, :p], v[0, :p], cu_p, cu_p, p, p, scaling)         # call 1, once
    k2 = torch.cat([k[:1, :p].expand(n, p, hk, d), k[:, p:]], 1).reshape(n * width, hk, d)      # prompt K/V x N
    v2 = torch.cat([v[:1, :p].expand(n, p, hk, d), v[:, p:]], 1).reshape(n * width, hk, d)
    cu_q = torch.arange(n + 1, dtype=torch.int32, device=dev) * rmax
    cu_k = torch.arange(n + 1, dtype=torch.int32, device=dev) * width
    out_resp = varlen_causal(q[:, p:].reshape(n * rmax, h, d), k2, v2, cu_q, cu_k, rmax, width, scaling)  # call 2
    out = torch.cat([out_prompt[None].expand(n, p, h, d), out_resp.view(n, rmax, h, d)], 1)
    return out, None


class _PaddedCausal(torch.autograd.Function):
    """Causal attention of packed sequences through a :mod:`dualkv.cascade` engine on their padded batch.

    q: (T, H, d); k, v: (T, H_k, d); slot_of_row: (T,) int64 slot of each row in the flattened (S, L) batch (S
    sequences padded at the end to L, the longest). Returns (T, H, d). Padded slots hold zeros: a causal query never
    sees the padded keys after it, and a padded query's output is dropped, so its dO (zero) adds nothing to any
    gradient."""

    @staticmethod
    def forward(ctx, q, k, v, slot_of_row, grid, scale):
        engine = cascade.engine_for(q)
        q4, k4, v4 = (_padded(t, slot_of_row, grid) for t in (q, k, v))
        out4, lse, state = engine.forward(q4, k4, v4, True, scale)
        ctx.save_for_backward(q4, k4, v4, out4, lse, slot_of_row)
        ctx.engine, ctx.state, ctx.grid, ctx.scale = engine, state, grid, scale
        return _unpadded(out4, slot_of_row)

    @staticmethod
    def backward(ctx, dout):
        q4, k4, v4, out4, lse, slot_of_row = ctx.saved_tensors
        d4 = _padded(dout, slot_of_row, ctx.grid)
        if d4.stride() != out4.stride():  # cuDNN's backward takes dO laid out as its forward's O
            d4 = torch.empty_like(out4).copy_(d4)
        grads = ctx.engine.backward(d4, q4, k4, v4, out4, lse, ctx.state, True, ctx.scale)
        return (*(_unpadded(g, slot_of_row) for g in grads), None, None, None)


def _padded(rows: torch.Tensor, slot_of_row: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(T, heads, d) rows -> the (S, heads, L, d) padded batch of ``grid`` = (S, L), zeros in the padded slots (rows
    innermost in memory)."""
    seqs, width = grid
    batch = rows.new_zeros(seqs * width, *rows.shape[1:])
    batch[slot_of_row] = rows
    return batch.view(seqs, width, *rows.shape[1:]).transpose(1, 2)


def _unpadded(t4: torch.Tensor, slot_of_row: torch.Tensor) -> torch.Tensor:
    """(S, heads, L, d) padded batch -> (T, heads, d) rows at ``slot_of_row``."""
    s, heads, length, d = t4.shape
    return t4.transpose(1, 2).reshape(s * length, heads, d)[slot_of_row]


def _cudnn_ncopy_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                           sliding_window=None, **kwargs):
    """N-copy rows through cuDNN on their padded batch: query (1, H, T_std, d) -> ((1, T_std, H, d), None)."""
    _no_window(sliding_window)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    scale = resolve_scale(scaling, q.shape[-1])
    out = _PaddedCausal.apply(q, k, v, kwargs["bench_slot_of_row"], kwargs["bench_padded_grid"], scale)
    return out[None], None


def _cascade_packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: GroupLayout, *,
                              softmax_scale: float, window_size: tuple[int, int]) -> torch.Tensor:
    """The P+ΣR packing's attention as the cuDNN cascade: q (T, H, d), k/v (T, H_k, d) -> (T, H, d)."""
    return cascade.shared_prefix_attention(q, k, v, layout, softmax_scale=softmax_scale, window_size=window_size)


_COMPILED_FLEX: dict = {}


def compiled_flex_attention(dynamic: bool | None = False) -> Callable:
    """``torch.compile(flex_attention, dynamic=dynamic)``, one per setting, with room for a recompile per shape.

    ``dynamic=False`` (the benchmarks' default) compiles a static kernel for every shape. With torch.compile's
    default, the second shape a process sees switches it to dynamic-shape kernels: an earlier Table 1 run that had
    compiled FlexAttention at a small shape first (the agreement check) measured its backward at (16, 32K) on an H200
    at 224.7 ms, against 176.3 ms compiled for that shape (we attribute the gap to the dynamic-shape kernels; it was
    not isolated further). ``None`` keeps the default (what a trainer whose shapes change every micro-batch would
    run: see ``bench_varying``).
    """
    if dynamic not in _COMPILED_FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        _raise_recompile_limits()
        _COMPILED_FLEX[dynamic] = torch.compile(flex_attention, dynamic=dynamic)
    return _COMPILED_FLEX[dynamic]


def _raise_recompile_limits() -> None:
    """Room for a recompile per benchmarked shape (torch.compile's default limit is 8)."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))


def _flex_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                    **kwargs):
    """(c) FlexAttention on the packing: query (1, H, T, d) -> ((1, T, H, d), None)."""
    _no_window(sliding_window)
    mask: FlexMask = kwargs["bench_flex"]
    gqa = query.shape[1] != key.shape[1]
    if query.is_cuda:
        out = compiled_flex_attention()(query, key, value, block_mask=mask.block_mask, scale=scaling, enable_gqa=gqa)
    elif torch.is_grad_enabled() and query.requires_grad:
        # FlexAttention has no CPU backward: the same mask_mod, made dense, through SDPA (smoke runs only).
        from torch.nn.attention.flex_attention import create_mask

        t = query.shape[2]
        dense = create_mask(mask.mask_mod, None, None, t, t, device=query.device)
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=dense, scale=scaling,
                                                               enable_gqa=gqa)
    else:
        from torch.nn.attention.flex_attention import flex_attention

        out = flex_attention(query, key, value, block_mask=mask.block_mask, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2), None


def register_attention() -> None:
    """Register the baselines' attention functions with ``transformers.AttentionInterface`` (and ``"dualkv"``)."""
    from transformers import AttentionInterface

    dualkv_hf.register()
    dualkv_hf.register(_cascade_packed_attention, name=ATTN_NAMES["cudnn_cascade"])
    AttentionInterface.register(ATTN_NAMES["fa2_ncopy"], _fa2_varlen_attention)
    AttentionInterface.register(ATTN_NAMES["cudnn_ncopy"], _cudnn_ncopy_attention)
    AttentionInterface.register(ATTN_NAMES["pg_padded"], _pg_padded_attention)
    AttentionInterface.register(ATTN_NAMES["flex"], _flex_attention)
