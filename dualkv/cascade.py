"""Exact shared-prefix attention composed from stock attention kernels: the cascade.

Each group g of a :class:`~dualkv.layout.GroupLayout` is three ordinary attention problems:

* ``prompt`` — the prompt's causal self-attention (call 1): q, k, v of the prompt rows, (1, H, P, d);
* ``cross``  — every response query of the group against the prompt keys, no mask: q (1, H, ΣR, d), k/v (1, H_k, P, d);
* ``own``    — each response causally over its own keys: (N, H, R_max, d), padded at the end when the R_i differ
  (a causal query never sees the padded keys after it; padded query rows are dropped).

A response row's output is the log-sum-exp merge of its ``cross`` and ``own`` results. The backward runs each
part's backward with the *merged* output and LSE — an attention backward needs only O and the full softmax's LSE
(D = rowsum(dO * O), P = exp(S - LSE)) — and sums dQ of the response rows over ``cross`` and ``own``, and dK/dV of
the prompt rows over ``prompt`` and ``cross`` (the N responses' prompt gradients). It is exact: the same function
as the fused kernels, with different rounding.

The parts run on an :class:`Engine`: :class:`CudnnEngine` (``aten._scaled_dot_product_cudnn_attention``, native GQA,
what any PyTorch user on Hopper can call) on CUDA, :class:`ReferenceEngine` (plain PyTorch math in the input dtype,
float64 included) elsewhere, so the composition itself is checked on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from ._checks import check_layout_tensors, check_window, resolve_scale
from .layout import GroupLayout

__all__ = ["CudnnEngine", "Engine", "ReferenceEngine", "cascade_backward", "engine_for", "shared_prefix_attention"]

Tensor = torch.Tensor


class Engine(Protocol):
    """One ordinary attention problem on (B, H, S, d) tensors (k/v may have fewer heads: GQA).

    ``forward`` returns (out (B, H, S_q, d), lse, state): lse in the engine's own shape, which
    :meth:`rows` reads as (B, H, S_q) and :meth:`like` writes back; state is whatever its backward needs.
    ``backward`` takes the output and LSE to differentiate through (here: the merged ones)."""

    name: str

    def forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor, object]:
        ...

    def backward(self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, state: object,
                 causal: bool, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        ...

    def backward_rows(self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse_rows: Tensor,
                      causal: bool, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        """``backward`` without a forward of this engine: the LSE given as (B, H, S_q) float rows."""
        ...

    def rows(self, lse: Tensor) -> Tensor:
        ...

    def like(self, lse: Tensor, rows: Tensor) -> Tensor:
        ...


class CudnnEngine:
    """PyTorch's cuDNN fused attention (``aten._scaled_dot_product_cudnn_attention`` and its backward).

    cuDNN refuses one query against one key ("s_q = s_kv = 1 is not supported"); those parts (a one-token prompt, a
    one-token response) run as plain fp32 math, with the LSE in cuDNN's (B, H, S, 1) shape."""

    name = "cudnn"

    @staticmethod
    def _tiny(q, k) -> bool:
        return q.shape[2] == 1 and k.shape[2] == 1

    def forward(self, q, k, v, causal, scale):
        if self._tiny(q, k):
            out, lse, _ = ReferenceEngine().forward(q.float(), k.float(), v.float(), causal, scale)
            return out.to(q.dtype), lse[..., None], None
        (out, lse, cum_q, cum_k, max_q, max_k, seed, offset,
         _) = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
        return out, lse, (cum_q, cum_k, max_q, max_k, seed, offset)

    def backward(self, dout, q, k, v, out, lse, state, causal, scale):
        if state is None:  # a tiny part (see forward)
            grads = ReferenceEngine().backward(dout.float(), q.float(), k.float(), v.float(), out.float(),
                                               lse[..., 0], None, causal, scale)
            return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
        cum_q, cum_k, max_q, max_k, seed, offset = state
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal, scale=scale)

    def backward_rows(self, dout, q, k, v, out, lse_rows, causal, scale):
        if self._tiny(q, k):
            return self.backward(dout, q, k, v, out, lse_rows[..., None], None, causal, scale)
        # The backward takes the forward's state and LSE layout: both read off a tiny forward of the same heads,
        # dtype and device (the state's tensors do not depend on the sequence lengths without dropout).
        lse_like, (cum_q, cum_k, _, _, seed, offset) = self._template(q, k)
        lse = _strided_like(lse_like, (*lse_rows.shape, *lse_like.shape[3:]))
        lse.copy_(lse_rows.reshape(lse.shape))
        return self.backward(dout, q, k, v, out, lse, (cum_q, cum_k, q.shape[2], k.shape[2], seed, offset),
                             causal, scale)

    @staticmethod
    def _template(q: Tensor, k: Tensor) -> tuple[Tensor, tuple]:
        """(LSE, state) of a forward on zeros laid out like ``q`` and ``k`` (at most 3 rows): cuDNN's LSE layout may
        depend on the inputs' strides, so they are part of the cache key."""
        key = (q.device, q.dtype, q.shape[1], k.shape[1], q.shape[3], _stride_order(q), _stride_order(k))
        if key not in _CUDNN_TEMPLATES:
            tq, tk = torch.zeros_like(q[:1, :, :3]), torch.zeros_like(k[:1, :, :3])  # strides kept (dense slices)
            _, lse, *state = CudnnEngine().forward(tq, tk, tk, True, 1.0)
            _CUDNN_TEMPLATES[key] = (lse, state[0])
        return _CUDNN_TEMPLATES[key]

    def rows(self, lse):
        return lse.reshape(lse.shape[0], lse.shape[1], lse.shape[2])

    def like(self, lse, rows):
        # The backward rejects an LSE of any other shape than the forward's ("the dim for Stats is invalid").
        new = torch.empty_like(lse)
        new.copy_(rows.reshape(lse.shape))
        return new


#: (device, dtype, heads, kv heads, head dim, q and k stride orders) -> the LSE and state of a tiny cuDNN forward
#: (CudnnEngine.backward_rows)
_CUDNN_TEMPLATES: dict[tuple, tuple[Tensor, tuple]] = {}


def _stride_order(t: Tensor) -> tuple[int, ...]:
    """``t``'s dimensions from the outermost in memory to the innermost (size-1 dimensions in index order)."""
    return tuple(sorted(range(t.dim()), key=lambda i: (-t.stride(i) if t.shape[i] > 1 else 0, i)))


def _strided_like(template: Tensor, shape: Sequence[int]) -> Tensor:
    """An empty tensor of ``shape`` whose dimensions lie in memory in the same order as ``template``'s."""
    order = sorted(range(template.dim()), key=lambda i: -template.stride(i))
    return torch.empty([shape[i] for i in order], dtype=template.dtype,
                       device=template.device).permute([order.index(i) for i in range(template.dim())])


def _expand_kv(t: Tensor, heads: int) -> Tensor:
    return t.repeat_interleave(heads // t.shape[1], dim=1) if t.shape[1] != heads else t


def _fold_kv(t: Tensor, kv_heads: int) -> Tensor:
    """Sum a per-query-head gradient (B, H, S, d) over each GQA group -> (B, H_k, S, d)."""
    b, h, s, d = t.shape
    return t.view(b, kv_heads, h // kv_heads, s, d).sum(2) if h != kv_heads else t


class ReferenceEngine:
    """Plain PyTorch math in the inputs' dtype (float64 for proofs); any device."""

    name = "reference"

    @staticmethod
    def _scores(q, k, causal, scale):
        s = torch.matmul(q, _expand_kv(k, q.shape[1]).transpose(-1, -2)) * scale
        if causal:
            sq, sk = s.shape[-2], s.shape[-1]
            keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
            s = s.masked_fill(~keep, float("-inf"))
        return s

    def forward(self, q, k, v, causal, scale):
        s = self._scores(q, k, causal, scale)
        lse = torch.logsumexp(s, dim=-1)
        out = torch.matmul(torch.exp(s - lse[..., None]), _expand_kv(v, q.shape[1]))
        return out, lse, None

    def backward(self, dout, q, k, v, out, lse, state, causal, scale):
        p = torch.exp(self._scores(q, k, causal, scale) - lse[..., None])
        kv_heads = k.shape[1]
        dv = _fold_kv(torch.matmul(p.transpose(-1, -2), dout), kv_heads)
        dp = torch.matmul(dout, _expand_kv(v, q.shape[1]).transpose(-1, -2))
        ds = p * (dp - (dout * out).sum(-1, keepdim=True))
        dq = torch.matmul(ds, _expand_kv(k, q.shape[1])) * scale
        dk = _fold_kv(torch.matmul(ds.transpose(-1, -2), q), kv_heads) * scale
        return dq, dk, dv

    def backward_rows(self, dout, q, k, v, out, lse_rows, causal, scale):
        if q.dtype in (torch.float16, torch.bfloat16):  # an LSE rounded to 8 bits would cost percent-level errors
            grads = self.backward(*(t.float() for t in (dout, q, k, v, out)), lse_rows.float(), None, causal, scale)
            return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
        return self.backward(dout, q, k, v, out, lse_rows.to(q.dtype), None, causal, scale)

    def rows(self, lse):
        return lse

    def like(self, lse, rows):
        return rows.to(lse.dtype).reshape(lse.shape)


def engine_for(q: Tensor) -> Engine:
    """cuDNN on CUDA fp16/bf16 tensors, the reference math otherwise."""
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        return CudnnEngine()
    return ReferenceEngine()


# ---------------------------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class _Group:
    p0: int
    p1: int
    r0: int
    r1: int
    lens: tuple[int, ...]
    # Unequal responses: (N, R_max) packed row of each own-part slot (padding repeats the first response row) and
    # the flat slots of the real rows, in packed order.
    slot_rows: Tensor | None
    real_slots: Tensor | None

    @property
    def equal(self) -> bool:
        return self.slot_rows is None


def _plan(layout: GroupLayout, device: torch.device) -> list[_Group]:
    key = ("cascade_plan", str(device))
    plan = layout._device_cache.get(key)
    if plan is not None:
        return plan
    plan = []
    for g in range(layout.num_groups):
        (p0, p1), (r0, r1) = layout.prompt_range(g), layout.responses_range(g)
        lens = layout.response_lens[g]
        slot_rows = real_slots = None
        if len(set(lens)) > 1:
            r_max = max(lens)
            slots = torch.full((len(lens), r_max), r0, dtype=torch.long)
            real = []
            start = r0
            for i, r in enumerate(lens):
                slots[i, :r] = torch.arange(start, start + r)
                real.append(torch.arange(i * r_max, i * r_max + r))
                start += r
            slot_rows, real_slots = slots.to(device), torch.cat(real).to(device)
        plan.append(_Group(p0, p1, r0, r1, tuple(lens), slot_rows, real_slots))
    layout._device_cache[key] = plan
    return plan


def _bhsd(rows: Tensor) -> Tensor:
    """(S, H, d) packed rows -> a (1, H, S, d) view."""
    return rows.unsqueeze(0).transpose(1, 2)


class _Own:
    """The own part's (N, H, R_max, d) batch of one group and its mapping to packed rows."""

    def __init__(self, grp: _Group):
        self.grp = grp

    def batch(self, t: Tensor) -> Tensor:
        g = self.grp
        rows = t[g.r0:g.r1]
        if g.equal:
            return rows.view(len(g.lens), g.lens[0], *t.shape[1:]).transpose(1, 2)
        return t[g.slot_rows].transpose(1, 2)  # (N, R_max, H, d) gathered -> (N, H, R_max, d)

    def to_rows(self, x: Tensor) -> Tensor:
        """(N, H, R_max, ...) per-slot values -> (ΣR, H, ...) in packed row order (padding dropped)."""
        flat = x.transpose(1, 2).reshape(-1, *x.shape[1:2], *x.shape[3:])
        return flat if self.grp.equal else flat[self.grp.real_slots]

    def from_rows(self, rows: Tensor, pad_from: Tensor | None) -> Tensor:
        """Packed-order (ΣR, H, ...) values -> (N, H, R_max, ...); padded slots keep ``pad_from``'s values (unused,
        and may be None, when the responses are equal)."""
        g = self.grp
        if g.equal:
            return rows.reshape(len(g.lens), g.lens[0], *rows.shape[1:]).transpose(1, 2)
        flat = pad_from.transpose(1, 2).reshape(-1, *rows.shape[1:]).clone()
        flat[g.real_slots] = rows
        return flat.view(pad_from.shape[0], pad_from.shape[2], *rows.shape[1:]).transpose(1, 2)


def merge_lse(o1: Tensor, l1: Tensor, o2: Tensor, l2: Tensor, out_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Exact merge of attentions over two disjoint key sets: o (S, H, d), l (H, S) natural-log LSE -> (o, l)."""
    l1, l2 = l1.float() if l1.dtype != torch.float64 else l1, l2.float() if l2.dtype != torch.float64 else l2
    lse = torch.logaddexp(l1, l2)
    w1, w2 = torch.exp(l1 - lse).t()[..., None], torch.exp(l2 - lse).t()[..., None]
    acc = o1.to(w1.dtype) * w1 + o2.to(w2.dtype) * w2
    return acc.to(out_dtype), lse


class _CascadeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, layout, scale, engine):
        heads = q.shape[1]
        out = torch.empty_like(q)
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        lse = torch.empty(heads, q.shape[0], dtype=lse_dtype, device=q.device)
        saved = []
        for grp in _plan(layout, q.device):
            own = _Own(grp)
            qp, kp, vp = (_bhsd(t[grp.p0:grp.p1]) for t in (q, k, v))
            o_p, l_p, st_p = engine.forward(qp, kp, vp, True, scale)
            out[grp.p0:grp.p1] = o_p[0].transpose(0, 1)
            lse[:, grp.p0:grp.p1] = engine.rows(l_p)[0]

            qr = _bhsd(q[grp.r0:grp.r1])
            o_c, l_c, st_c = engine.forward(qr, kp, vp, False, scale)
            o_o, l_o, st_o = engine.forward(own.batch(q), own.batch(k), own.batch(v), True, scale)
            l_o_rows = own.to_rows(engine.rows(l_o)[..., None])[..., 0].t()  # (H, ΣR)
            merged, merged_lse = merge_lse(o_c[0].transpose(0, 1), engine.rows(l_c)[0], own.to_rows(o_o), l_o_rows,
                                           q.dtype)
            out[grp.r0:grp.r1] = merged
            lse[:, grp.r0:grp.r1] = merged_lse
            # What each part's backward differentiates through: the merged output and LSE, in its own shapes.
            l_c_m = engine.like(l_c, merged_lse[None])
            l_o_m = engine.like(l_o, own.from_rows(merged_lse.t()[..., None], engine.rows(l_o)[..., None])[..., 0])
            saved.append({"prompt": (st_p, l_p), "cross": (st_c, l_c_m), "own": (st_o, l_o_m), "o_o": o_o})
        ctx.layout, ctx.scale, ctx.engine, ctx.saved = layout, scale, engine, saved
        ctx.save_for_backward(q, k, v, out)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, d_lse):
        refuse_lse_gradient(d_lse, "the cascade")
        q, k, v, out = ctx.saved_tensors
        if dout is None:
            return None, None, None, None, None, None
        engine, scale = ctx.engine, ctx.scale

        def part_backward(g, grp, part, dout_b, q_b, k_b, v_b, out_b, causal):
            state, lse = ctx.saved[g][part]
            if part == "own":  # padded slots: their own-part output (their upstream gradient is zero)
                out_b = _Own(grp).from_rows(out_b, ctx.saved[g]["o_o"])
            return engine.backward(dout_b, q_b, k_b, v_b, out_b, lse, state, causal, scale)

        return (*_backward_groups(dout.contiguous(), q, k, v, out, ctx.layout, part_backward), None, None, None)


def refuse_lse_gradient(d_lse: Tensor | None, what: str) -> None:
    """Raise if a caller differentiates through the returned LSE: the stock attention backwards take none."""
    if d_lse is not None and bool((d_lse != 0).any()):
        raise NotImplementedError(f"{what} cannot differentiate through the returned LSE (the stock attention "
                                  "backwards have no LSE gradient); pass deterministic=True (or unset "
                                  "DUALKV_DETERMINISTIC=0) or set DUALKV_PATH=fused to run the fused kernels' backward")


#: part_backward(group index, group, part, dout, q, k, v, out, causal) -> (dq, dk, dv): see _backward_groups.
PartBackward = Callable[[int, "_Group", str, Tensor, Tensor, Tensor, Tensor, Tensor, bool], tuple[Tensor, ...]]


def _backward_groups(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, layout: GroupLayout,
                     part_backward: PartBackward) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv (packed like q, k, v) from each group's three part backwards: ``part_backward(g, grp, part, dout,
    q, k, v, out, causal)`` on (B, H, S, d) views (``g`` the group's index; ``part`` "prompt", "cross" or "own"; the
    own part's ``out`` is given in packed row order, (ΣR, H, d), for the engine to batch with its padding). Sums the
    responses' dQ over cross and own, the prompt's dK/dV over prompt and cross."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    for g, grp in enumerate(_plan(layout, q.device)):
        own = _Own(grp)
        qp, kp, vp = (_bhsd(t[grp.p0:grp.p1]) for t in (q, k, v))
        dq_p, dk_p, dv_p = part_backward(g, grp, "prompt", _bhsd(dout[grp.p0:grp.p1]), qp, kp, vp,
                                         _bhsd(out[grp.p0:grp.p1]), True)
        dout_r, out_r = dout[grp.r0:grp.r1], out[grp.r0:grp.r1]
        dq_c, dk_c, dv_c = part_backward(g, grp, "cross", _bhsd(dout_r), _bhsd(q[grp.r0:grp.r1]), kp, vp,
                                         _bhsd(out_r), False)
        q_o = own.batch(q)
        # Padded own slots get a zero upstream gradient: they contribute nothing.
        dout_o = own.from_rows(dout_r, q_o.new_zeros(q_o.shape) if not grp.equal else None)
        dq_o, dk_o, dv_o = part_backward(g, grp, "own", dout_o, q_o, own.batch(k), own.batch(v), out_r, True)
        dq[grp.p0:grp.p1] = dq_p[0].transpose(0, 1)
        dk[grp.p0:grp.p1] = (dk_p + dk_c)[0].transpose(0, 1)
        dv[grp.p0:grp.p1] = (dv_p + dv_c)[0].transpose(0, 1)
        dq[grp.r0:grp.r1] = dq_c[0].transpose(0, 1) + own.to_rows(dq_o)
        dk[grp.r0:grp.r1] = own.to_rows(dk_o)
        dv[grp.r0:grp.r1] = own.to_rows(dv_o)
    return dq, dk, dv


#: LSE given to padded own-part query rows in :func:`cascade_backward`: exp(score - LSE) is 0 there (their upstream
#: gradient is zero too), so they add nothing and cannot overflow.
_PAD_LSE = 1.0e30


def cascade_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, layout: GroupLayout,
                     scale: float, engine: Engine | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The cascade's backward after ANY exact forward of the same attention (e.g. dualkv's fused kernel): each part's
    backward with the given output and natural-log LSE. q, out, dout (T, H, d); k, v (T, H_k, d); lse (H, T) float.
    Returns dq, dk, dv like q, k, v."""
    engine = engine or engine_for(q)
    lse_rows = lse.t()  # (T, H)

    def part_backward(g, grp, part, dout_b, q_b, k_b, v_b, out_b, causal):
        if part == "own":
            own, unequal = _Own(grp), not grp.equal
            pad = torch.full((*q_b.shape[:3], 1), _PAD_LSE, dtype=lse.dtype, device=lse.device) if unequal else None
            lse_b = own.from_rows(lse_rows[grp.r0:grp.r1, :, None], pad)[..., 0]     # (N, H, R_max)
            out_b = own.from_rows(out_b, q_b.new_zeros(q_b.shape) if unequal else None)
        else:
            r0, r1 = (grp.p0, grp.p1) if part == "prompt" else (grp.r0, grp.r1)
            lse_b = lse_rows[r0:r1].t()[None]                                         # (1, H, S)
        return engine.backward_rows(dout_b, q_b, k_b, v_b, out_b, lse_b, causal, scale)

    return _backward_groups(dout.contiguous(), q, k, v, out, layout, part_backward)


def shared_prefix_attention(q: Tensor, k: Tensor, v: Tensor, layout: GroupLayout, softmax_scale: float | None = None,
                            window_size: Sequence[int] = (-1, -1), return_lse: bool = False,
                            engine: Engine | None = None):
    """Calls 1 and 2 of every group, composed from ordinary attention calls (see the module docstring).

    q: (T, H, d); k, v: (T, H_k, d) packed by ``layout``. Returns out (T, H, d) [and the natural-log LSE (H, T),
    float32 (float64 for float64 inputs)]. Differentiable in q, k, v. Sliding windows are not supported here.
    """
    h, hk, d = check_layout_tensors(q, k, v, layout)
    window = check_window(window_size, True)
    if window[0] >= 0:
        raise NotImplementedError("the cascade has no sliding window; use the fused kernels for window_size")
    scale = resolve_scale(softmax_scale, d)
    engine = engine or engine_for(q)
    out, lse = _CascadeFn.apply(q, k, v, layout, scale, engine)
    return (out, lse) if return_lse else out

