"""Row gathers whose gradient is the same bits on every run.

``x.index_select(0, index)`` has a backward of ``index_add_``, which on CUDA adds every gathered row's gradient with
atomics: where ``index`` repeats a row (a group's last prompt position predicts the first token of each of its N
responses; a prefix-tree token read by several sequences; call 2's context rows inside several sequences' own keys)
the sum's order, hence its rounding, changes from run to run. That broke the deterministic default's promise of
bitwise-stable training runs (TRL, H200: two dualkv runs of the same seed parted at step 5, stock runs did not).
:func:`gather_rows` keeps the forward and sums repeated rows in a fixed order instead.
"""

from __future__ import annotations

import torch

__all__ = ["gather_rows"]


class _GatherRows(torch.autograd.Function):
    """``source[index]`` along dim 0; the backward sums repeated rows in a fixed order."""

    @staticmethod
    def forward(ctx, source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.source_shape = source.shape
        return source.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        grad_source = grad.new_zeros(ctx.source_shape)
        if grad_source.is_cuda:
            # CUDA's accumulating index_put_ sorts the indices and sums each row's run in that order (PyTorch's own
            # deterministic index_add_ is this call); its atomic-free kernel adds in the accumulation dtype.
            grad_source.index_put_((index,), grad.contiguous(), accumulate=True)
        else:
            grad_source.index_add_(0, index, grad)  # sequential on the CPU
        return grad_source, None


def gather_rows(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` of ``source``: (M, ...) from a (T, ...) tensor and an (M,) int64 index, as
    ``source.index_select(0, index)``, with a gradient that sums the M rows' gradients into T rows in a fixed order
    (bitwise the same on every run, also where ``index`` repeats rows)."""
    if not (torch.is_grad_enabled() and source.requires_grad):
        return source.index_select(0, index)
    return _GatherRows.apply(source, index)
