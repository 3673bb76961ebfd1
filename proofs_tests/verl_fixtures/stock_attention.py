"""The stock (N-copy) attention for veRL runs on machines without flash-attn: what veRL does with
``flash_attention_2``, with PyTorch's FlashAttention-2 varlen kernel in its place (the dualkv reference of the same
op on a CPU).

veRL hands a packed (1, T) stream of rows whose position ids restart at 0 per row, with no mask. With Ulysses
sequence parallelism (SP > 1) each rank holds T/SP tokens, and veRL's ``_ulysses_flash_attention_forward`` (which
only wraps ``flash_attention_2``) does the all-to-alls around the kernel; a custom attention name gets no such
wrapper, so :func:`stock_varlen_attention` does the same steps itself, in veRL's order:

1. repeat K/V heads ``max(SP // H_kv, 1)`` times; all-to-all q, k, v: gather the sequence, scatter the heads;
2. all-gather the position ids (the rows' boundaries are where they restart at 0);
3. causal varlen attention over the rows; 4. all-to-all back: scatter the sequence, gather the heads.

Used by ``experiments/policy_update_bench.py``, ``experiments/verl/distributed_parity.py`` and
``experiments/verl/multigpu_bench.py``.
"""

from __future__ import annotations

import torch

__all__ = ["STOCK_ATTENTION", "stock_varlen_attention", "register_stock_attention"]

#: The ``attn_implementation`` name the stock runs use.
STOCK_ATTENTION = "dualkv_bench_stock_varlen"


def _rows_of(positions: torch.Tensor) -> tuple[torch.Tensor, int]:
    """int32 cu_seqlens and the longest row of a packed stream whose position ids restart at 0 per row."""
    flat = positions.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("the stock attention needs packed position ids that start at 0 (one row per restart)")
    cu = torch.cat([starts, starts.new_tensor([flat.numel()])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def stock_varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                           sliding_window=None, **kwargs):
    """``transformers`` attention function: query (1, H, T_local, d), key/value (1, H_kv, T_local, d) ->
    ((1, T_local, H, d), None). T_local is the rank's Ulysses slice (the whole stream at SP = 1)."""
    from dualkv.bench.systems import varlen_causal
    from dualkv.reference import standard_varlen_attention

    if sliding_window or (dropout and module.training):
        raise NotImplementedError("the stock attention is full causal attention without dropout")
    positions = kwargs.get("position_ids")
    if positions is None or query.shape[0] != 1:
        raise ValueError("the stock attention needs packed (1, T) inputs with position_ids")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))          # (T_local, H, d)
    group, sp = None, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from verl.utils.ulysses import get_ulysses_sequence_parallel_group, get_ulysses_sequence_parallel_world_size

        group = get_ulysses_sequence_parallel_group()
        sp = get_ulysses_sequence_parallel_world_size(group)
    if sp > 1:
        from verl.utils.ulysses import gather_heads_scatter_seq, gather_seq_scatter_heads

        repeats = max(sp // k.shape[1], 1)
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        q, k, v = (gather_seq_scatter_heads(t, seq_dim=0, head_dim=1, group=group) for t in (q, k, v))
        parts = [torch.empty_like(positions) for _ in range(sp)]
        torch.distributed.all_gather(parts, positions.contiguous(), group=group)
        positions = torch.cat(parts, dim=-1)
    cu, max_len = _rows_of(positions)
    if q.dtype in (torch.float16, torch.bfloat16):
        out = varlen_causal(q, k, v, cu, cu, max_len, max_len, scaling)
    else:       # PyTorch's FlashAttention takes fp16/bf16 only: fp32 runs (exactness checks) use the reference
        out = standard_varlen_attention(q, k, v, cu, cu, max_len, max_len, softmax_scale=scaling, causal=True)
    if sp > 1:
        out = gather_heads_scatter_seq(out, head_dim=1, seq_dim=0, group=group)
    return out[None], None


def register_stock_attention() -> str:
    """Register :func:`stock_varlen_attention` with ``transformers`` as :data:`STOCK_ATTENTION`; return the name."""
    from transformers import AttentionInterface

    AttentionInterface.register(STOCK_ATTENTION, stock_varlen_attention)
    return STOCK_ATTENTION
