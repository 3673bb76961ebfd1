"""Known-wrong variants must FAIL the very checks the real implementation passes (negative controls)."""

import pytest

from dualkv.verify import mutants
from dualkv.verify.checks import AttentionCase, shared_prefix_check, two_call_check
from dualkv.verify.model_checks import model_check

CASE = AttentionCase((65,), ((63, 1, 129),), 4, 2, 64)
MULTI = AttentionCase((9, 17), ((3, 5), (2,)), 4, 2, 32)


@pytest.mark.parametrize("case", [CASE, MULTI], ids=["one-group", "two-groups"])
def test_real_implementation_passes(case):
    assert all(r.passed for r in shared_prefix_check(case))


def test_no_context_grad_is_caught():
    rows = {r.quantity: r for r in shared_prefix_check(CASE, attention_fn=mutants.no_context_grad)}
    assert rows["out"].passed and rows["dq"].passed          # forward and dq are untouched ...
    assert not rows["dk"].passed and not rows["dv"].passed   # ... the missing context gradient is caught


def test_no_context_grad_through_the_paper_api_is_caught():
    rows = {r.quantity: r for r in two_call_check(CASE, call2=mutants.no_context_grad_call2)}
    assert not rows["dk_c"].passed and not rows["dv_c"].passed
    assert rows["dk_d"].passed and rows["out_d"].passed


@pytest.mark.parametrize("case", [CASE, MULTI], ids=["one-group", "two-groups"])
def test_shifted_mask_is_caught(case):
    rows = {r.quantity: r for r in shared_prefix_check(case, attention_fn=mutants.shifted_mask)}
    assert not rows["out"].passed


def test_first_token_from_own_row_is_caught():
    rows = {r.quantity: r for r in model_check("qwen3", (7, 3), ((2, 1, 5), (1,)),
                                                predictor_fn=mutants.own_row_first_token)}
    assert not rows["logprobs"].passed
    assert rows["prompt hidden states"].passed
