"""``dualkv verify``'s run-to-run repeat checks (dualkv/verify/repeat_checks.py): a run function whose bits change
fails its row, a repeatable one passes; on a GPU the matrix holds the kernels' and the log-prob head's repeat rows and
the atomic-gather head as a control; there they pass, and the control is caught."""

import math

import pytest
import torch

import dualkv.verify.runner as runner
from dualkv.verify import mutants
from dualkv.verify.cases import attention_cases
from dualkv.verify.repeat_checks import (RUNS, attention_repeat_check, head_repeat_check, repeat_cases,
                                         repeat_rows)


def test_a_run_whose_bits_change_fails_and_a_repeatable_one_passes():
    calls = []

    def drifting():
        calls.append(1)
        return torch.ones(3), torch.full((2,), 1.0 + 1e-7 * len(calls))

    same, drift = repeat_rows("repeat", "toy", drifting, ("a", "b"), "cpu", "fp32")
    assert len(calls) == RUNS
    assert same.passed and same.error == 0.0
    assert not drift.passed and 0 < drift.error < 1e-6 and drift.bound == 0.0


def test_a_nan_that_moves_counts_as_a_difference():
    values = iter([torch.tensor([math.nan, 1.0]), torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.nan])])
    (row,) = repeat_rows("repeat", "toy", lambda: (next(values),), ("x",), "cpu", "fp32")
    assert not row.passed


def test_the_quantity_count_must_match():
    with pytest.raises(ValueError, match="2 tensors for 1 quantities"):
        repeat_rows("repeat", "toy", lambda: (torch.ones(1), torch.ones(1)), ("x",), "cpu", "fp32")


def test_cpu_paths_repeat():
    head = head_repeat_check(device="cpu", groups=2, responses=3, response_len=4, hidden_dim=16, vocab=50)
    attention = attention_repeat_check(attention_cases()[3], dtype=torch.float32, device="cpu", backend="reference")
    assert all(r.passed for r in head + attention) and len(attention) == 3


def test_the_matrix_has_the_repeat_rows_and_their_control_on_a_gpu_only(monkeypatch):
    monkeypatch.setattr(runner, "gpu_rows_missing", lambda: "no CUDA device")
    assert not any(t.label.startswith(("repeat", "control atomic")) for t in runner.build_tasks())
    monkeypatch.setattr(runner, "gpu_rows_missing", lambda: None)
    labels = [t.label for t in runner.build_tasks()]
    repeats = [label for label in labels if label.startswith("repeat cuda bf16")]
    assert len(repeats) == 3 and all("win" not in label for label in repeats)
    assert "repeat cuda log-prob head" in labels and "control atomic_gather_head" in labels


@pytest.mark.gpu
def test_gpu_repeat_rows_pass_and_the_atomic_head_is_caught():
    rows = [r for c in repeat_cases(attention_cases()) for r in attention_repeat_check(c, dtype=torch.bfloat16)] + head_repeat_check()
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]
    control = head_repeat_check(groups=1, responses=1 << 14, response_len=1, head=mutants.atomic_gather_head)
    assert not control[0].passed and control[0].error > 0
