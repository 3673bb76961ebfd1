"""``experiments/policy_update_bench.py`` at its CPU size, run as on the GPU machine: without Ray, datasets, pandas,
Pillow, uvicorn or fastapi (blocked in the child process, so the import stubs are exercised), float32 so that the
stock and dualkv old log-probs must agree to 1e-5, and the JSON schema the lead's tooling reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

from dualkv.integration.verl.import_stubs import DEFAULT_STUBS  # noqa: E402

BENCH = Path(__file__).resolve().parents[1] / "experiments" / "policy_update_bench.py"

_LAUNCH = """
import runpy, sys
for name in {blocked!r}:
    sys.modules[name] = None            # as if not installed
sys.argv = [{bench!r}] + {args!r}
runpy.run_path({bench!r}, run_name="__main__")
"""


def test_policy_update_bench_cpu_without_ray(tmp_path):
    args = ["--tiny", "--fp32", "--N", "2,4", "--mb", "1,2", "--out", str(tmp_path)]
    code = _LAUNCH.format(blocked=list(DEFAULT_STUBS), bench=str(BENCH), args=args)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={"VERL_LOGGING_LEVEL": "ERROR", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("policy_update-cpu-*.json")
    result = json.loads(path.read_text())
    assert result["benchmark"] == "policy_update"
    assert set(result["environment"]["stubbed_packages"]) == set(DEFAULT_STUBS)
    rows = result["rows"]
    phases = ("old_log_prob", "ref_log_prob", "update_actor")
    assert sorted((r["system"], r["N"], r["mb"], r["phase"]) for r in rows) == sorted(
        (s, n, mb, p) for s in ("stock", "dualkv") for n in (2, 4) for mb in (1, 2) for p in phases)
    for row in rows:
        assert set(row) == {"system", "N", "P", "R", "mb", "phase", "seconds", "peak_mem_gib", "mfu", "status"}
        assert row["status"] == "ok" and row["seconds"] > 0
    assert result["logprob_max_abs_diff"] <= 1e-5
    assert set(result["logprob_max_abs_diff_by_N"]) == {"2", "4"}
    table = proc.stdout.strip().splitlines()[-13:]         # printed last: header + (2 N x 2 mb) x 3 phases
    assert table[0].split()[:3] == ["N", "mb", "phase"]
    assert [line.split()[2] for line in table[1:]] == list(phases) * 4
