"""The one masked-attention primitive every reference function is built from.

Visibility is decided on *logical positions*: key j is visible to the query at position i iff

    (not causal or j <= i)  and  (left < 0 or j >= i - left)  and  (right < 0 or j <= i + right)

Queries are processed in chunks, each only against the keys its positions can see, so memory stays
O(chunk x keys) instead of O(T^2). When gradients are needed each chunk is checkpointed, so the backward holds one
chunk's scores at a time as well.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

#: Score elements (heads x query rows x keys) one chunk may hold.
SCORE_BUDGET = 1 << 25


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """LSE is float32, or float64 for float64 inputs (so float64 references stay exact)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _visible(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, left: int, right: int) -> torch.Tensor:
    qi = q_pos[:, None]
    kj = k_pos[None, :]
    mask = torch.ones(qi.shape[0], kj.shape[1], dtype=torch.bool, device=q_pos.device)
    if causal:
        mask &= kj <= qi
    if left >= 0:
        mask &= kj >= qi - left
    if right >= 0:
        mask &= kj <= qi + right
    return mask


def _chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q (Lq, H, d), k/v (Lk, Hk, d), mask (Lq, Lk) -> out (Lq, H, d), lse (H, Lq). Rows need >= 1 visible key."""
    lq, h, d = q.shape
    hk = k.shape[1]
    qg = q.reshape(lq, hk, h // hk, d)
    scores = torch.einsum("qkgd,nkd->kgqn", qg, k) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores.to(lse_dtype(q.dtype)), dim=-1).reshape(h, lq)
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("kgqn,nkd->qkgd", probs, v).reshape(lq, h, d)
    return out, lse


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                     *, scale: float, causal: bool, window: tuple[int, int],
                     chunk_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of queries at positions ``q_pos`` over keys at positions ``k_pos`` (ascending).

    Args:
        q: (Lq, H, d); k, v: (Lk, H_k, d) with H % H_k == 0.
        q_pos: (Lq,) int64 logical positions, ascending. k_pos: (Lk,) int64, ascending.
        window: (left, right), already normalised (causal has right == 0).
    Returns:
        out (Lq, H, d) in q's dtype, lse (H, Lq) in :func:`lse_dtype`.
    """
    left, right = window
    lq = q.shape[0]
    if lq == 0:
        return q.new_zeros(q.shape), q.new_zeros((q.shape[1], 0), dtype=lse_dtype(q.dtype))
    if chunk_rows is None:
        chunk_rows = max(16, SCORE_BUDGET // max(1, q.shape[1] * k.shape[0]))
    need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    outs, lses = [], []
    for a in range(0, lq, chunk_rows):
        b = min(lq, a + chunk_rows)
        qp = q_pos[a:b]
        # Only the keys some query of this chunk can see (k_pos is ascending).
        hi_pos = qp.max() if causal else (qp.max() + right if right >= 0 else None)
        lo_pos = qp.min() - left if left >= 0 else None
        k0 = int(torch.searchsorted(k_pos, lo_pos)) if lo_pos is not None else 0
        k1 = int(torch.searchsorted(k_pos, hi_pos, right=True)) if hi_pos is not None else k_pos.shape[0]
        mask = _visible(qp, k_pos[k0:k1], causal, left, right)
        args = (q[a:b], k[k0:k1], v[k0:k1], mask, scale)
        if need_grad:
            out, lse = checkpoint(_chunk_attention, *args, use_reentrant=False)
        else:
            out, lse = _chunk_attention(*args)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, 0), torch.cat(lses, 1)
