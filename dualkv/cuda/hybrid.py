"""The fused forward with the cuDNN cascade's backward: for ``deterministic=False`` calls where the cuDNN cascade's
backward was measured the faster one and dualkv's forward faster or close (Hopper, head dims 64 and 128 under
``DUALKV_PATH=auto``: ``configs.CASCADE_FASTER``), and wherever the cascade serves the head dim under
``DUALKV_PATH=hybrid`` (up to 128, and 192 / 256 on Hopper; see :func:`dualkv.cuda.configs.attention_path`).

An attention backward needs only the output and the full softmax's log-sum-exp (D = rowsum(dO * O),
P = exp(S - LSE)); the fused forward returns both, so :func:`dualkv.cascade.cascade_backward` runs each cascade part's
cuDNN backward from them, with no cuDNN forward. Exact; not bitwise reproducible run to run (the cuDNN cross-part
backward is not), which is why only ``deterministic=False`` calls take it.
"""

from __future__ import annotations

import torch

from ..cascade import cascade_backward, refuse_lse_gradient
from ..layout import GroupLayout


class FusedForwardCascadeBackward(torch.autograd.Function):
    """(q (T, H, d), k, v (T, H_k, d), layout, plan, scale) -> out (T, H, d), lse (H, T) float32 natural log."""

    @staticmethod
    def forward(ctx, q, k, v, layout: GroupLayout, plan, scale: float):
        from .api import _run

        out, lse = _run(q, k, v, k, v, plan, scale, -1, True)   # grad mode is off here: the mode picks nothing
        ctx.layout, ctx.scale = layout, scale
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, d_lse):
        refuse_lse_gradient(d_lse, "the deterministic=False path on Hopper (fused forward, cuDNN backward)")
        if dout is None:
            return None, None, None, None, None, None
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = cascade_backward(dout, q, k, v, out, lse, ctx.layout, ctx.scale)
        return dq, dk, dv, None, None, None
