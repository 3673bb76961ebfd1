"""A prefix-tree cascade from stock attention parts (the benchmark's "best cascade" baseline for trees).

For a preorder :class:`dualkv.PrefixTreeLayout` the attention of every token is the log-sum-exp merge of
* ``own`` — its node's causal self-attention (consecutive nodes of equal length batched as one (n, H, L, d) call);
* ``cross(a)`` — for every internal node a, ALL its descendants' queries (one contiguous packed range in preorder)
  against a's keys, no mask: one call per internal node, a's K/V read once for the whole subtree.
The backward runs each part's backward with the merged output and LSE and sums the gradients (dQ over a row's parts,
dK/dV of a node over its own part and its cross part), as :mod:`dualkv.cascade` does for one level. Parts run on
:class:`dualkv.cascade.CudnnEngine` on CUDA fp16/bf16 and on the reference math elsewhere (float64 proofs on the CPU).
Deterministic only as far as cuDNN's non-causal backward is.
"""

from __future__ import annotations

import torch

from ..cascade import engine_for, merge_lse
from ..tree import PrefixTreeLayout

Tensor = torch.Tensor


def _own_batches(layout: PrefixTreeLayout) -> list[tuple[int, int, int]]:
    """(first row, nodes, length): runs of consecutive nodes of equal length (their rows are one (n, L) block)."""
    out: list[list[int]] = []
    for i, n in enumerate(layout.node_lens):
        if out and out[-1][2] == n:
            out[-1][1] += 1
        else:
            out.append([layout.node_starts[i], 1, n])
    return [tuple(b) for b in out]


def _cross_parts(layout: PrefixTreeLayout) -> list[tuple[int, int, int, int]]:
    """(key row start, key row end, query row start, query row end) per internal node: its keys, its descendants."""
    from ..cuda.tree_schedule import check_preorder, subtree_ends

    check_preorder(layout)
    ends = subtree_ends(layout)
    parts = []
    for a in range(layout.num_nodes):
        if ends[a] > a + 1:
            k0, k1 = layout.node_range(a)
            last = int(ends[a]) - 1
            parts.append((k0, k1, k1, layout.node_starts[last] + layout.node_lens[last]))
    return parts


def _bhsd(rows: Tensor) -> Tensor:
    return rows.unsqueeze(0).transpose(1, 2)


def _batch(t: Tensor, start: int, n: int, length: int) -> Tensor:
    return t[start:start + n * length].view(n, length, *t.shape[1:]).transpose(1, 2)


class _TreeCascade(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, layout, scale):
        engine = engine_for(q)
        acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        acc = torch.empty(q.shape, dtype=acc_dtype, device=q.device)
        lse = torch.empty(q.shape[1], q.shape[0], dtype=acc_dtype, device=q.device)
        own_saved, cross_saved = [], []
        for start, n, length in _own_batches(layout):
            o, l, st = engine.forward(_batch(q, start, n, length), _batch(k, start, n, length),
                                      _batch(v, start, n, length), True, scale)
            rows = slice(start, start + n * length)
            acc[rows] = o.transpose(1, 2).reshape(n * length, *q.shape[1:])
            lse[:, rows] = engine.rows(l).transpose(0, 1).reshape(q.shape[1], n * length)
            own_saved.append((l, st))
        for k0, k1, r0, r1 in _cross_parts(layout):
            o, l, st = engine.forward(_bhsd(q[r0:r1]), _bhsd(k[k0:k1]), _bhsd(v[k0:k1]), False, scale)
            acc[r0:r1], lse[:, r0:r1] = merge_lse(acc[r0:r1], lse[:, r0:r1], o[0].transpose(0, 1),
                                                  engine.rows(l)[0], acc_dtype)
            cross_saved.append((l, st))
        out = acc.to(q.dtype)
        ctx.layout, ctx.scale, ctx.engine = layout, scale, engine
        ctx.own_saved, ctx.cross_saved = own_saved, cross_saved
        ctx.save_for_backward(q, k, v, out, lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, d_lse):
        q, k, v, out, lse = ctx.saved_tensors
        engine, scale, layout = ctx.engine, ctx.scale, ctx.layout
        dout = dout.contiguous()
        acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        dq, dk, dv = (torch.zeros(t.shape, dtype=acc_dtype, device=t.device) for t in (q, k, v))
        for (start, n, length), (l, st) in zip(_own_batches(layout), ctx.own_saved):
            rows = slice(start, start + n * length)
            l_m = engine.like(l, lse[:, rows].reshape(q.shape[1], n, length).transpose(0, 1))
            grads = engine.backward(_batch(dout, start, n, length), _batch(q, start, n, length),
                                    _batch(k, start, n, length), _batch(v, start, n, length),
                                    _batch(out, start, n, length), l_m, st, True, scale)
            for acc, g in zip((dq, dk, dv), grads):
                acc[rows] += g.transpose(1, 2).reshape(n * length, *g.shape[1:2], g.shape[3])
        for (k0, k1, r0, r1), (l, st) in zip(_cross_parts(layout), ctx.cross_saved):
            l_m = engine.like(l, lse[None, :, r0:r1])
            gq, gk, gv = engine.backward(_bhsd(dout[r0:r1]), _bhsd(q[r0:r1]), _bhsd(k[k0:k1]), _bhsd(v[k0:k1]),
                                         _bhsd(out[r0:r1]), l_m, st, False, scale)
            dq[r0:r1] += gq[0].transpose(0, 1)
            dk[k0:k1] += gk[0].transpose(0, 1)
            dv[k0:k1] += gv[0].transpose(0, 1)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def tree_cascade_attention(q: Tensor, k: Tensor, v: Tensor, layout: PrefixTreeLayout,
                           softmax_scale: float | None = None, return_lse: bool = False):
    """Tree attention from stock parts. q: (T, H, d); k, v: (T, H_k, d) packed in preorder; returns out (T, H, d)
    [, lse (H, T)]. No gradient through the returned LSE."""
    from ..reference.tree import check_tree_tensors

    _, _, d = check_tree_tensors(q, k, v, layout)
    out, lse = _TreeCascade.apply(q, k, v, layout, softmax_scale or d ** -0.5)
    return (out, lse) if return_lse else out
