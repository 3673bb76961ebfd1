"""Whole-model equivalence on tiny random transformers models (no downloads): the packed P+ΣR forward with the
"dualkv" attention equals the stock model run on each N-copy row — log-probs, entropy, every parameter gradient
— and every copy's prompt hidden states equal the packed prompt's at every layer (appendix A.2)."""

import pytest
import torch

from dualkv.testing import assert_rows_pass
from dualkv.verify.model_checks import model_check


def _assert_rows(rows, bound):
    assert_rows_pass(rows, max_error=bound)


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_float64_exact(arch):
    _assert_rows(model_check(arch, (7, 3), ((2, 1, 5), (1,))), 1e-9)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_float32(arch):
    _assert_rows(model_check(arch, (9,), ((4, 1, 3),), dtype=torch.float32), 1e-5)


def test_several_groups_and_single_response_groups():
    _assert_rows(model_check("qwen3", (1, 12, 5), ((3,), (2, 1, 2, 6), (1,)), seed=3), 1e-9)


def test_gradient_checkpointing():
    _assert_rows(model_check("llama", (6, 2), ((2, 3), (4,)), gradient_checkpointing=True), 1e-9)


def test_a_nan_in_the_stock_hidden_states_fails_the_invariant():
    """The prompt hidden-state row keeps the worst layer; a NaN error (a NaN on the stock side: NaN >= x is False)
    was never kept, so the row passed on the layers that compared cleanly."""
    from dualkv import GroupLayout
    from dualkv.verify.model_checks import _hidden_invariant

    layout = GroupLayout.from_lengths([3], [[2, 1]])
    packed = [torch.ones(1, 6, 4, dtype=torch.float64)] * 2
    good = torch.ones(3, 4, dtype=torch.float64)
    bad = good.clone()
    bad[0, 0] = float("nan")
    assert _hidden_invariant(layout, packed, [[good, good], [good, good]], torch.float64).passed
    for copies in ([[good, good], [good, bad]], [[bad, good], [good, good]], [[good, bad], [good, good]]):
        assert not _hidden_invariant(layout, packed, copies, torch.float64).passed, copies
