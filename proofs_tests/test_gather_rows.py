"""Row gathers whose gradient is the same bits on every run (dualkv/_gather.py): values and gradients against
index_select in float64, repeated rows summed; a gather that drops repeated rows' gradients is caught; the
integration paths that gather repeated rows (the log-prob heads, prefix-tree unpacking, call 2's own keys) go
through it. On a GPU: the gradient is bitwise the same over repeated runs where index_select's (atomic adds) is not,
and the log-prob head's backward repeats bit for bit."""

import numpy as np
import pytest
import torch

from dualkv._gather import _GatherRows, gather_rows
from dualkv.cuda.call2 import gather_inputs, map_call2
from dualkv.integration.logprobs import token_logprobs

REPEATS = torch.tensor([3, 0, 3, 5, 3, 1, 0, 3])  # row 3 four times, row 0 twice, rows 2 and 4 never


def _grad(gather, source, index, seed=1):
    out = gather(source, index)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return out, torch.autograd.grad((out * weights.to(out.dtype)).sum(), source)[0]


def _index_put_without_accumulate(source, index):
    """Known-wrong: a gather whose backward keeps one of a repeated row's gradients."""

    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, i):
            ctx.save_for_backward(i)
            ctx.shape = x.shape
            return x.index_select(0, i)

        @staticmethod
        def backward(ctx, g):
            (i,) = ctx.saved_tensors
            return g.new_zeros(ctx.shape).index_copy_(0, i, g), None

    return Wrong.apply(source, index)


def _matches_index_select(gather, shape=(6, 4, 3)) -> bool:
    source = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    out, grad = _grad(gather, source, REPEATS)
    ref_out, ref_grad = _grad(lambda x, i: x.index_select(0, i), source, REPEATS)
    return torch.equal(out, ref_out) and torch.allclose(grad, ref_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(6, 5), (6, 4, 3)])
def test_values_and_gradient_match_index_select(shape):
    assert _matches_index_select(gather_rows, shape)


def test_a_gather_dropping_repeated_rows_is_caught():
    assert not _matches_index_select(_index_put_without_accumulate)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_gradient_is_the_sum(dtype):
    source = torch.randn(6, 8, dtype=dtype, requires_grad=True)
    _, grad = _grad(gather_rows, source, REPEATS)
    _, ref = _grad(lambda x, i: x.index_select(0, i), source.detach().double().requires_grad_(), REPEATS)
    assert torch.allclose(grad.double(), ref, rtol=2e-2, atol=2e-2)
    assert grad.dtype == dtype


def test_without_grad_it_is_index_select():
    source = torch.randn(6, 3)
    assert gather_rows(source, REPEATS).grad_fn is None
    with torch.no_grad():
        assert gather_rows(source.requires_grad_(), REPEATS).grad_fn is None


def _graph_has_gather(tensor: torch.Tensor) -> bool:
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if type(fn).__name__ == f"{_GatherRows.__name__}Backward":
            return True
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return False


def test_log_prob_head_gathers_through_it():
    hidden = torch.randn(10, 4, requires_grad=True)
    weight = torch.randn(7, 4)
    predictors = torch.tensor([5, 5, 5, 6, 7, 8])   # a group's last prompt row predicts three first tokens
    for fused in (False, True):
        logp, _ = token_logprobs(hidden, weight, predictors, torch.tensor([1, 2, 3, 4, 5, 6]), fused=fused)
        assert _graph_has_gather(logp)


def test_call2_own_keys_gather_through_it():
    # two sequences of 2 decoded keys whose 3 query rows reach back into the P = 4 shared context rows
    m = map_call2([0, 3, 6], [0, 2, 4], 4)
    assert m.own_index is not None and len(np.unique(m.own_index)) < len(m.own_index)
    q = torch.randn(6, 2, 8, requires_grad=True)
    k_ctx, v_ctx = (torch.randn(4, 1, 8, requires_grad=True) for _ in range(2))
    k_dec, v_dec = (torch.randn(4, 1, 8, requires_grad=True) for _ in range(2))
    _, _, _, k_own, v_own = gather_inputs(m, q, k_ctx, v_ctx, k_dec, v_dec)
    assert _graph_has_gather(k_own) and _graph_has_gather(v_own)


def test_prefix_tree_unpack_gathers_through_it():
    from dualkv.tree import TreeTargets

    targets = TreeTargets(rows=torch.arange(3), predictor_index=torch.arange(3), target_ids=torch.arange(3),
                          gather=torch.tensor([0, 1, 0, 2]), cu_seqlens=torch.tensor([0, 2, 4]))
    values = torch.randn(3, requires_grad=True)
    assert _graph_has_gather(targets.unpack(values))


# ------------------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_gradient_repeats_bitwise_where_index_select_does_not():
    gen = torch.Generator(device="cuda").manual_seed(0)
    source = torch.randn(4, 256, device="cuda", generator=gen, requires_grad=True)
    index = torch.randint(0, 4, (1 << 16,), device="cuda", generator=gen)
    upstream = torch.randn(index.shape[0], 256, device="cuda", generator=gen)

    def grads(gather):
        return [torch.autograd.grad((gather(source, index) * upstream).sum(), source)[0] for _ in range(8)]

    ours = grads(gather_rows)
    assert all(torch.equal(g, ours[0]) for g in ours)
    ref = torch.zeros(4, 256, dtype=torch.float64, device="cuda").index_add_(0, index, upstream.double())
    assert (ours[0].double() - ref).abs().max() <= 1e-4 * ref.abs().max()
    # the atomic adds of index_select's backward land in another order on some run (the known-wrong variant)
    theirs = grads(lambda x, i: x.index_select(0, i))
    assert any(not torch.equal(g, theirs[0]) for g in theirs[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
def test_gpu_log_prob_head_backward_repeats_bitwise(fused):
    from dualkv.verify.repeat_checks import head_repeat_check

    (row,) = head_repeat_check(head=lambda h, w, p, t: token_logprobs(h, w, p, t, fused=fused), runs=5)
    assert row.passed, row
