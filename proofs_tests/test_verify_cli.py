"""``dualkv verify``: rows, JSON, exit status — and a wrong implementation turns it red."""

import json
import os
import subprocess
import sys

import dualkv.verify.checks as checks
from dualkv.cli import main
from dualkv.verify import mutants


def test_quick_verify_passes_and_writes_json(tmp_path):
    """... and the JSON records the kernel choices the CUDA rows would run under (here DUALKV_KERNELS=mma), so a
    report of the mma.sync family cannot be mistaken for the default's."""
    path = tmp_path / "rows.json"
    env = {**os.environ, "DUALKV_KERNELS": "mma", "DUALKV_MMA_BWD": "auto", "DUALKV_PATH": ""}
    proc = subprocess.run([sys.executable, "-m", "dualkv", "verify", "--quick", "--no-progress", "--json", str(path)],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rows passed" in proc.stdout and "FAIL" not in proc.stdout
    data = json.loads(path.read_text())
    assert data["summary"]["failed"] == 0 and data["summary"]["rows"] == len(data["rows"]) > 20
    assert {"check", "config", "quantity", "error", "bound", "passed"} <= set(data["rows"][0])
    assert any(r["check"].startswith("control:") for r in data["rows"])
    assert data["environment"]["torch"]
    env = data["environment"]
    assert (env["kernel_family"], env["mma_backward"], env["path"]) == ("mma", "auto", "auto"), env
    assert "nvrtc" in env


def test_verify_fails_when_the_implementation_is_wrong(monkeypatch, capsys):
    monkeypatch.setattr(checks, "shared_prefix_attention", mutants.shifted_mask)
    assert main(["verify", "--quick", "--no-progress"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_gpu_matrix_covers_the_non_deterministic_paths(monkeypatch):
    """On a GPU, verify also runs deterministic=False (Hopper's hybrid path, the mma.sync atomic dQ) at every case
    whose head dim has such a path, in both 16-bit dtypes; the function it calls passes deterministic=False."""
    import dualkv.verify.runner as runner
    from dualkv.verify.cases import attention_cases

    monkeypatch.setattr(runner.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner, "kernels_unavailable_reason", lambda: None)
    labels = [t.label for t in runner.build_tasks()]
    nondet = [label for label in labels if "deterministic=False" in label]
    small = [c for c in attention_cases() if c.head_dim <= runner.NON_DETERMINISTIC_MAX_HEAD_DIM]
    assert len(nondet) == 2 * len(small) > 0
    assert all(f"d{c.head_dim}" in label for c, label in zip(small, nondet))
    seen = {}
    monkeypatch.setattr(runner, "shared_prefix_attention", lambda *a, **kw: seen.update(kw))
    runner._non_deterministic(1, 2)
    assert seen == {"deterministic": False}


def test_a_non_finite_low_precision_baseline_fails_the_row(monkeypatch):
    """FlashAttention's rule scales the error of PyTorch's own low-precision computation; when that baseline has a
    NaN/inf the bound is inf and any finite error passed: such a row fails instead."""
    import torch

    from dualkv.verify.cases import attention_cases

    case = attention_cases()[0]
    real = checks.n_copy_attention

    def off_by_one(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        return out + 1.0, lse

    def nan_baseline(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        return out * float("nan"), lse

    rows = {r.quantity: r for r in checks.shared_prefix_check(case, dtype=torch.bfloat16, attention_fn=off_by_one,
                                                              with_grad=False)}
    assert not rows["out"].passed                       # caught by a finite bound ...
    monkeypatch.setattr(checks, "n_copy_attention", nan_baseline)
    rows = {r.quantity: r for r in checks.shared_prefix_check(case, dtype=torch.bfloat16, attention_fn=off_by_one,
                                                              with_grad=False)}
    assert not rows["out"].passed and "bound" in rows["out"].note    # ... and not passed by an infinite one


def test_the_tolerance_rule_refuses_broadcasting_and_infinite_bounds():
    """dualkv.testing compares only tensors of one shape ((3, 1) against (1, 4) used to broadcast, and a pair of
    tensors that line up only under broadcasting passed) and passes nothing under an infinite bound."""
    import math

    import pytest
    import torch

    from dualkv.testing import Comparison, compare, max_abs_err, rel_err

    col, row = torch.ones(3, 1, dtype=torch.float64), torch.ones(1, 4, dtype=torch.float64)
    for fn in (rel_err, max_abs_err):
        with pytest.raises(ValueError, match=r"differ in shape: \(3, 1\) against the reference's \(1, 4\)"):
            fn(col, row)
        assert fn(col, col.clone()) == 0.0                       # the same shape still compares
    with pytest.raises(ValueError, match="differ in shape"):
        compare(col, row, dtype=torch.float64)
    assert not Comparison(0.5, math.inf, "max_abs").passed        # known-wrong: an infinite bound
    assert not Comparison(math.nan, 1.0, "max_abs").passed
    assert Comparison(0.5, 1.0, "max_abs").passed


def test_a_report_without_cuda_rows_says_why(monkeypatch, tmp_path):
    """A machine with a GPU the kernels cannot serve (below sm_80, no NVRTC) still gets the reference's report, and
    the report says that no CUDA row ran and why, in its text and its JSON, instead of passing silently."""
    import io
    import json

    import dualkv.verify.runner as runner

    monkeypatch.setattr(runner.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner.torch.cuda, "get_device_name", lambda *a: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(runner, "kernels_unavailable_reason", lambda: "sm_70 is below sm_80")
    all_tasks = runner.build_tasks
    assert not any(" cuda " in t.label for t in all_tasks())              # no CUDA task is planned
    monkeypatch.setattr(runner, "build_tasks", lambda quick=False: [t for t in all_tasks(quick) if "fp32" in t.label][:1])
    out = io.StringIO()
    rows, ok = runner.run_verify(json_path=str(tmp_path / "v.json"), progress=False, stream=out)
    assert ok and "CUDA rows: none (a CUDA device, but the kernels cannot run on it: sm_70 is below sm_80)" \
        in out.getvalue()
    assert json.loads((tmp_path / "v.json").read_text())["cuda_rows"] == {
        "run": False, "reason": "a CUDA device, but the kernels cannot run on it: sm_70 is below sm_80"}


def test_a_bad_json_path_is_refused_before_the_matrix_runs(monkeypatch, tmp_path):
    """``--json`` naming a folder (or a path below a file) used to end a whole run in IsADirectoryError; it is now
    refused by name before any check runs."""
    import pytest

    import dualkv.verify.runner as runner

    def no_tasks(quick):
        raise AssertionError("the matrix started")

    monkeypatch.setattr(runner, "build_tasks", no_tasks)
    a_file = tmp_path / "report.txt"
    a_file.write_text("")
    for target, match in ((tmp_path, "is a folder"), (a_file / "v.json", "is a file, not a folder")):
        with pytest.raises(SystemExit, match=match) as exc:
            main(["verify", "--quick", "--json", str(target)])
        assert str(exc.value.code).startswith("dualkv verify: --json")
        with pytest.raises(ValueError, match=match):
            runner.run_verify(quick=True, json_path=str(target))
