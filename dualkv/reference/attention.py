"""Pure-PyTorch oracle of the DualKV decomposition (any dtype, CPU or CUDA, differentiable by autograd).

* :func:`flash_attn_dualkv_varlen_func` — the paper's call 2: decoded queries over [shared context; own decoded].
* :func:`context_attention` — call 1: causal self-attention of the prompt(s).
* :func:`standard_varlen_attention` — FlashAttention-2 varlen semantics: the N-copy baseline.
* :func:`shared_prefix_attention` — calls 1 and 2 for every group of a packed micro-batch.

Shapes follow FlashAttention: packed (tokens, heads, head_dim); LSE is (heads, tokens), float32 (float64 for
float64 inputs).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .._checks import (check_context_inputs, check_cu_seqlens, check_deterministic, check_dualkv_inputs,
                       check_layout_tensors, check_max_seqlen, check_qkv, check_same_tokens, check_window,
                       resolve_scale)
from .._warnings import warn_once
from ..layout import GroupLayout
from .core import masked_attention

__all__ = [
    "flash_attn_dualkv_varlen_func",
    "context_attention",
    "standard_varlen_attention",
    "shared_prefix_attention",
]


def _arange(a: int, b: int, device: torch.device) -> torch.Tensor:
    return torch.arange(a, b, dtype=torch.int64, device=device)


def _note_deterministic(deterministic: bool | None) -> None:
    """The reference is deterministic whatever the caller asks: ``deterministic=False`` is accepted (API parity
    with the CUDA backend) but has no effect, and says so once."""
    if check_deterministic(deterministic) is False:
        warn_once("deterministic=False has no effect on dualkv's reference backend: it is always deterministic "
                  "(only the CUDA backend has non-deterministic paths)", stacklevel=4)


def _finish(out: torch.Tensor, lse: torch.Tensor, return_lse: bool):
    return (out, lse) if return_lse else out


def _varlen(q, k, v, cu_q: list[int], cu_k: list[int], scale: float, causal: bool, window: tuple[int, int]):
    """Per-sequence causal attention with FlashAttention's bottom-right alignment (query r of a length-Lq
    sequence over Lk keys sits at position Lk - Lq + r)."""
    outs, lses = [], []
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        lq, lk = q1 - q0, k1 - k0
        if lq > lk:
            raise ValueError(f"sequence {s} has {lq} queries but only {lk} keys; bottom-right aligned causal "
                             "attention needs seqlen_q <= seqlen_k")
        q_pos = _arange(lk - lq, lk, q.device)
        k_pos = _arange(0, lk, q.device)
        out, lse = masked_attention(q[q0:q1], k[k0:k1], v[k0:k1], q_pos, k_pos, scale=scale, causal=causal,
                                    window=window)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, 0), torch.cat(lses, 1)


def _dualkv(q, k_context, v_context, k_decoded, v_decoded, cu: list[int], scale: float, causal: bool,
            window: tuple[int, int], cu_k: list[int] | None = None):
    """Call 2 on validated inputs: sequence s's L_s query rows (``cu``) over [context; its R_s decoded keys]
    (``cu_k``, default ``cu``), aligned bottom-right: query row j sits at logical position P + R_s - L_s + j."""
    cu_k = cu if cu_k is None else cu_k
    p = k_context.shape[0]
    outs, lses = [], []
    for (a, b), (ka, kb) in zip(zip(cu, cu[1:]), zip(cu_k, cu_k[1:])):
        keys = torch.cat([k_context, k_decoded[ka:kb]], 0)
        values = torch.cat([v_context, v_decoded[ka:kb]], 0)
        n_keys = p + kb - ka
        out, lse = masked_attention(q[a:b], keys, values, _arange(n_keys - (b - a), n_keys, q.device),
                                    _arange(0, n_keys, q.device), scale=scale, causal=causal, window=window)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, 0), torch.cat(lses, 1)


def standard_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                              cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                              softmax_scale: float | None = None, causal: bool = True,
                              window_size: Sequence[int] = (-1, -1), return_lse: bool = False):
    """FlashAttention-2 ``flash_attn_varlen_func`` semantics (the N-copy baseline when rows are [P; R_i]).

    Args:
        q: (total_q, H, d); k, v: (total_k, H_k, d).
        cu_seqlens_q, cu_seqlens_k: (N + 1,) int32 offsets.
    Returns:
        out (total_q, H, d) [, lse (H, total_q)].
    """
    tensors = {"q": q, "k": k, "v": v}
    h, hk, d = check_qkv(tensors, query="q", keys=("k", "v"))
    check_same_tokens(k, "k", v, "v")
    cu_q = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0], q.device)
    cu_k = check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[0], q.device)
    if len(cu_q) != len(cu_k):
        raise ValueError(f"cu_seqlens_q has {len(cu_q) - 1} sequences but cu_seqlens_k has {len(cu_k) - 1}")
    check_max_seqlen(max_seqlen_q, "max_seqlen_q", [b - a for a, b in zip(cu_q, cu_q[1:])])
    check_max_seqlen(max_seqlen_k, "max_seqlen_k", [b - a for a, b in zip(cu_k, cu_k[1:])])
    window = check_window(window_size, causal)
    out, lse = _varlen(q, k, v, cu_q, cu_k, resolve_scale(softmax_scale, d), causal, window)
    return _finish(out, lse, return_lse)


def context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                      max_seqlen: int | None = None, softmax_scale: float | None = None, causal: bool = True,
                      window_size: Sequence[int] = (-1, -1), return_lse: bool = False,
                      deterministic: bool | None = None):
    """Call 1: self-attention of the prompt, computed once. (``deterministic`` is accepted for API parity; the
    reference always is deterministic, and ``deterministic=False`` warns that it has no effect.)

    Args:
        q: (P, H, d); k, v: (P, H_k, d). With ``cu_seqlens`` (G + 1,), several prompts packed back to back.
    Returns:
        out (P, H, d) [, lse (H, P)].
    """
    _note_deterministic(deterministic)
    _, _, d, cu = check_context_inputs(q, k, v, cu_seqlens, max_seqlen)
    out, lse = _varlen(q, k, v, cu, cu, resolve_scale(softmax_scale, d), causal, check_window(window_size, causal))
    return _finish(out, lse, return_lse)


def flash_attn_dualkv_varlen_func(q: torch.Tensor, k_context: torch.Tensor, v_context: torch.Tensor,
                                  k_decoded: torch.Tensor, v_decoded: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                  cu_seqlens_k_decoded: torch.Tensor, max_seqlen_q: int, context_seqlen: int,
                                  max_seqlen_k_decoded: int, softmax_scale: float | None = None,
                                  causal: bool = True, window_size: Sequence[int] = (-1, -1),
                                  return_lse: bool = False, deterministic: bool | None = None):
    """Call 2 (the paper's API): each sequence's query rows attend to the shared context and to its own decoded
    keys.

    Sequence i has R_i decoded keys (``cu_seqlens_k_decoded``) at logical positions P..P+R_i-1 after the P context
    keys (0..P-1), and L_i <= P + R_i query rows (``cu_seqlens_q``) aligned bottom-right: query row j sits at
    logical position P + R_i - L_i + j. So L_i = R_i is the training case (one query per decoded token), and
    L_i > R_i passes prompt rows together with the response rows. ``causal=True`` (dualkv's default; the paper's
    is ``causal=False``): a query sees the keys at positions <= its own; ``causal=False``: all P + R_i keys. A
    ``window_size`` (left, right) further limits keys to [pos - left, pos + right] (-1: unbounded; causal caps
    right at 0).

    Args:
        q: (sum_i L_i, H, d) queries, packed varlen.
        k_context, v_context: (P, H_k, d) shared context, stored once.
        k_decoded, v_decoded: (sum_i R_i, H_k, d) per-sequence decoded keys/values.
        cu_seqlens_q: (N + 1,) int32 query offsets; cu_seqlens_k_decoded: (N + 1,) int32 decoded-key offsets.
        max_seqlen_q >= max L_i, max_seqlen_k_decoded >= max R_i, context_seqlen = P.
        deterministic: accepted for API parity (the reference always is; False warns that it has no effect).
    Returns:
        out (sum_i L_i, H, d) [, lse (H, sum_i L_i)].
    """
    _note_deterministic(deterministic)
    _, _, d, cu_q, cu_k = check_dualkv_inputs(q, k_context, v_context, k_decoded, v_decoded, cu_seqlens_q,
                                              cu_seqlens_k_decoded, max_seqlen_q, context_seqlen,
                                              max_seqlen_k_decoded)
    out, lse = _dualkv(q, k_context, v_context, k_decoded, v_decoded, cu_q, resolve_scale(softmax_scale, d),
                       causal, check_window(window_size, causal), cu_k)
    return _finish(out, lse, return_lse)


def shared_prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: GroupLayout,
                            softmax_scale: float | None = None, window_size: Sequence[int] = (-1, -1),
                            return_lse: bool = False, deterministic: bool | None = None):
    """Exact causal attention of a shared-prompt packed micro-batch: call 1 + call 2 for every group.

    Equal to running causal attention on the N-copy layout and keeping each prompt once.

    Args:
        q: (T, H, d); k, v: (T, H_k, d), packed as ``layout`` says.
    Returns:
        out (T, H, d) [, lse (H, T)].
    """
    _note_deterministic(deterministic)
    _, _, d = check_layout_tensors(q, k, v, layout)
    out, lse = per_group_attention(q, k, v, layout, resolve_scale(softmax_scale, d), check_window(window_size, True))
    return _finish(out, lse, return_lse)


def per_group_attention(q, k, v, layout: GroupLayout, scale: float, window: tuple[int, int], decoded=None):
    """Call 1 then call 2 (``decoded``, default :func:`_dualkv`) for each group, outputs in packed order."""
    decoded = decoded or _dualkv
    outs, lses = [], []
    for g in range(layout.num_groups):
        p0, p1 = layout.prompt_range(g)
        r0, r1 = layout.responses_range(g)
        cu_prompt = [0, p1 - p0]
        out_c, lse_c = _varlen(q[p0:p1], k[p0:p1], v[p0:p1], cu_prompt, cu_prompt, scale, True, window)
        out_d, lse_d = decoded(q[r0:r1], k[p0:p1], v[p0:p1], k[r0:r1], v[r0:r1], layout.response_cu_seqlens(g),
                               scale, True, window)
        outs += [out_c, out_d]
        lses += [lse_c, lse_d]
    return torch.cat(outs, 0), torch.cat(lses, 1)
