"""The paper's call 2 on the kernels' segment table: any number of query rows per sequence, aligned bottom-right.

Sequence i has P context keys (logical positions 0..P-1), R_i decoded keys (P..P+R_i-1) and L_i <= P + R_i query
rows, query row j at logical position P + R_i - L_i + j. The kernels take segments (q_start, q_len, ctx_start,
ctx_len) whose q_len query rows and q_len own keys are row-aligned (own key j at logical ctx_len + j) and whose
ctx_len context keys come first. Sequence i becomes one segment of M_i = max(L_i, R_i) rows:

* own keys: the last M_i of its P + R_i keys, [context rows c_i..P-1 ; its decoded keys] with
  c_i = P + R_i - M_i, gathered into an own-key tensor aligned with the segment's rows;
* context keys: context rows 0..c_i-1;
* query rows: M_i - L_i zero rows in front when L_i < R_i (their outputs are dropped), then its L_i rows.

The dK/dV kernel writes each context row of the tensor it is given once, summed over the segments sharing that
context, so the kernels get exactly the context rows the segments read, and segments reading different context
lengths must not read the same rows: with one distinct c_i > 0 (the usual case: every sequence passes the same
number of prompt rows) the kernels read context rows 0..c_i-1 in place; otherwise each distinct c_i reads its own
copy of them, and autograd sums the copies' gradients. With L_i = R_i and equal offsets (training) the inputs go to
the kernels as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .._gather import gather_rows
from .schedule import segments_from_cu_seqlens

__all__ = ["Call2Map", "map_call2", "gather_inputs", "scatter_outputs"]


@dataclass(frozen=True, eq=False)
class Call2Map:
    """How one call-2 shape maps onto the kernels (host arrays; see the module doc).

    Attributes:
        segments: int32 (N, 4) segment table, sequences sharing a context length adjacent.
        own_index: int64 (T_ext,) row of [k_context; k_decoded] behind each own-key row; None: k_decoded as is.
        query_index: int64 (T_ext,) row of q behind each segment row, -1 for a zero row; None: q as is.
        out_index: int64 (T_q,) segment row of each query row; None: the same rows.
        context_lens: the context runs the kernels read, laid back to back (rows 0..c-1 of the context each): one
            run is a view of the context tensor, several are copies; None: the context tensor as it is.
    """

    segments: np.ndarray
    own_index: np.ndarray | None
    query_index: np.ndarray | None
    out_index: np.ndarray | None
    context_lens: tuple[int, ...] | None


def map_call2(cu_seqlens_q: Sequence[int], cu_seqlens_k: Sequence[int], context_len: int) -> Call2Map:
    """The mapping of validated call-2 offsets (host ints, L_i <= P + R_i) with P = ``context_len``."""
    cu_q = np.asarray(cu_seqlens_q, dtype=np.int64)
    cu_k = np.asarray(cu_seqlens_k, dtype=np.int64)
    if np.array_equal(cu_q, cu_k):
        return Call2Map(segments_from_cu_seqlens(cu_q, context_len), None, None, None, None)
    p = int(context_len)
    lq, lk = np.diff(cu_q), np.diff(cu_k)
    rows = np.maximum(lq, lk)                        # M_i
    ctx = p + lk - rows                              # c_i
    first = np.concatenate([[0], np.cumsum(rows)[:-1]])
    seq = np.repeat(np.arange(rows.shape[0]), rows)
    t = np.arange(int(rows.sum())) - first[seq]      # row within its segment
    pos = ctx[seq] + t                               # logical position of the row's own key
    own_index = np.where(pos < p, pos, cu_k[seq] + pos)  # context row pos, or decoded row pos - P (after P rows)
    pad = (rows - lq)[seq]
    real = t >= pad
    query_index = np.where(real, cu_q[seq] + t - pad, -1)
    runs = tuple(sorted({int(c) for c in ctx if c > 0}, reverse=True))
    offsets = dict(zip(runs, np.concatenate([[0], np.cumsum(runs)[:-1]]).astype(int).tolist()))
    ctx_start = np.array([offsets.get(int(c), 0) for c in ctx], dtype=np.int64)
    table = np.stack([first, rows, ctx_start, ctx], 1)[np.argsort(-ctx, kind="stable")]
    no_padding = not (rows > lq).any()
    return Call2Map(table.astype(np.int32), own_index, None if no_padding else query_index,
                    None if no_padding else np.flatnonzero(real), runs)


def _index(a: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(a).to(device)


def gather_inputs(m: Call2Map, q: torch.Tensor, k_context: torch.Tensor, v_context: torch.Tensor,
                  k_decoded: torch.Tensor, v_decoded: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(q, k_ctx, v_ctx, k_own, v_own) for the kernels: q (T_ext, H, d), context (T_c, H_k, d), own keys
    (T_ext, H_k, d). Differentiable (row gathers and cat), so gradients reach the caller's five tensors; the gathers
    sum a repeated row's gradients in a fixed order (:func:`dualkv._gather.gather_rows`)."""
    if m.own_index is None:
        return q, k_context, v_context, k_decoded, v_decoded
    own = _index(m.own_index, q.device)
    k_own = gather_rows(torch.cat([k_context, k_decoded]), own)  # (context rows repeat across sequences)
    v_own = gather_rows(torch.cat([v_context, v_decoded]), own)
    if len(m.context_lens) == 1:  # a view: rows the segments do not read as context are not handed over
        k_context, v_context = k_context[:m.context_lens[0]], v_context[:m.context_lens[0]]
    else:                         # none (an empty view), or one copy per distinct context length
        k_context = torch.cat([k_context[:0], *(k_context[:c] for c in m.context_lens)])
        v_context = torch.cat([v_context[:0], *(v_context[:c] for c in m.context_lens)])
    if m.query_index is not None:
        rows = np.where(m.query_index < 0, q.shape[0], m.query_index)  # -1 -> the appended zero row
        q = gather_rows(torch.cat([q, q.new_zeros((1, *q.shape[1:]))]), _index(rows, q.device))
    return q, k_context, v_context, k_own, v_own


def scatter_outputs(m: Call2Map, out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The caller's rows of the kernels' out (T_ext, H, d) and lse (H, T_ext)."""
    if m.out_index is None:
        return out, lse
    index = _index(m.out_index, out.device)
    return out.index_select(0, index), lse.index_select(1, index)
