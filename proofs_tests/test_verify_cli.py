"""``dualkv verify``: rows, JSON, exit status — and a wrong implementation turns it red."""

import json
import subprocess
import sys

import dualkv.verify.checks as checks
from dualkv.cli import main
from dualkv.verify import mutants


def test_quick_verify_passes_and_writes_json(tmp_path):
    path = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "dualkv", "verify", "--quick", "--no-progress", "--json", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rows passed" in proc.stdout and "FAIL" not in proc.stdout
    data = json.loads(path.read_text())
    assert data["summary"]["failed"] == 0 and data["summary"]["rows"] == len(data["rows"]) > 20
    assert {"check", "config", "quantity", "error", "bound", "passed"} <= set(data["rows"][0])
    assert any(r["check"].startswith("control:") for r in data["rows"])
    assert data["environment"]["torch"]


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
    monkeypatch.setattr(runner, "cuda_backend_available", lambda: True)
    labels = [t.label for t in runner.build_tasks()]
    nondet = [label for label in labels if "deterministic=False" in label]
    small = [c for c in attention_cases() if c.head_dim <= runner.NON_DETERMINISTIC_MAX_HEAD_DIM]
    assert len(nondet) == 2 * len(small) > 0
    assert all(f"d{c.head_dim}" in label for c, label in zip(small, nondet))
    seen = {}
    monkeypatch.setattr(runner, "shared_prefix_attention", lambda *a, **kw: seen.update(kw))
    runner._non_deterministic(1, 2)
    assert seen == {"deterministic": False}
