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
