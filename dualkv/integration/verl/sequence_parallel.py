"""Ulysses sequence parallelism around the "dualkv" attention (seed section 2.3).

The P+ΣR packing happens before veRL's Ulysses slice, so each rank holds a contiguous part of the packed stream
(padded to a multiple of SP). Inside every attention layer:

1. all-to-all: gather the sequence, scatter the heads — each rank now has all T tokens and H/SP heads (K/V heads
   repeated first when fewer than SP, as veRL's FlashAttention path does);
2. :func:`dualkv.shared_prefix_attention` on the full layout (a ``GroupLayout`` or, with trie packing, a
   ``PrefixTreeLayout``), unchanged;
3. all-to-all back: scatter the sequence, gather the heads.

The function is registered as the per-layer attention of the "dualkv" backend
(:func:`dualkv.integration.hf.register`); without an SP group (SP = 1) it is plain ``shared_prefix_attention``.
"""

from __future__ import annotations

import torch

from ... import shared_prefix_attention
from ...layout import GroupLayout
from ...tree import PrefixTreeLayout

__all__ = ["ulysses_packed_attention", "repeat_kv_heads_for_sp"]


def repeat_kv_heads_for_sp(k: torch.Tensor, v: torch.Tensor, sp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Repeat K/V heads (dim 1) so their count is a multiple of ``sp``; head j of the result is head j // rep of the
    input, which keeps every query head's K/V head (GQA) after the head scatter."""
    kv_heads = k.shape[1]
    if kv_heads % sp == 0:
        return k, v
    if sp % kv_heads != 0:
        raise ValueError(f"{kv_heads} key/value heads cannot be split over sequence-parallel size {sp} (one must "
                         "divide the other)")
    rep = sp // kv_heads
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def ulysses_packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             layout: GroupLayout | PrefixTreeLayout, *,
                             softmax_scale: float, window_size: tuple[int, int]) -> torch.Tensor:
    """Packed attention of this rank's (T_local, H, d) slice under veRL's current Ulysses group (see module doc)."""
    from verl.utils.ulysses import (gather_heads_scatter_seq, gather_seq_scatter_heads,
                                    get_ulysses_sequence_parallel_group, get_ulysses_sequence_parallel_world_size)

    group = get_ulysses_sequence_parallel_group()
    sp = get_ulysses_sequence_parallel_world_size(group)
    if sp == 1:
        return shared_prefix_attention(q, k, v, layout, softmax_scale=softmax_scale, window_size=window_size)
    if q.shape[1] % sp != 0:
        raise ValueError(f"{q.shape[1]} attention heads cannot be split over sequence-parallel size {sp}")
    total = layout.total_tokens
    if q.shape[0] * sp < total:
        raise ValueError(f"rank holds {q.shape[0]} tokens x SP {sp} < {total} packed tokens: inputs were not sliced "
                         "from this layout")
    k, v = repeat_kv_heads_for_sp(k, v, sp)
    q, k, v = (gather_seq_scatter_heads(t, seq_dim=0, head_dim=1, unpadded_dim_size=total, group=group)
               for t in (q, k, v))
    out = shared_prefix_attention(q, k, v, layout, softmax_scale=softmax_scale, window_size=window_size)
    return gather_heads_scatter_seq(out, head_dim=1, seq_dim=0, group=group)
