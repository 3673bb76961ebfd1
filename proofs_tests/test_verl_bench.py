"""``experiments/policy_update_bench.py`` at its CPU size, run as on the GPU machine: without Ray, datasets, pandas,
Pillow, uvicorn or fastapi (hidden from its processes, so the import stubs are exercised), float32 so that the
stock and dualkv old log-probs must agree to 1e-5, and the JSON schema the lead's tooling reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

from experiment_scripts import load_script  # noqa: E402
from verl_fixtures.import_stubs import DEFAULT_STUBS  # noqa: E402

BENCH = Path(__file__).resolve().parents[1] / "experiments" / "policy_update_bench.py"

def test_policy_update_bench_cpu_without_ray(tmp_path):
    args = ["--tiny", "--fp32", "--N", "2", "--mb", "1,2", "--out", str(tmp_path)]
    env = {"VERL_LOGGING_LEVEL": "ERROR", "PATH": "/usr/bin:/bin", "DUALKV_BENCH_HIDE_PACKAGES": ",".join(DEFAULT_STUBS)}
    proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("policy_update-cpu-*.json")
    result = json.loads(path.read_text())
    assert result["benchmark"] == "policy_update"
    assert set(result["environment"]["stubbed_packages"]) == set(DEFAULT_STUBS)
    rows = result["rows"]
    phases = ("old_log_prob", "ref_log_prob", "update_actor")
    assert sorted((r["system"], r["N"], r["mb"], r["phase"]) for r in rows) == sorted(
        (s, 2, mb, p) for s in ("stock", "dualkv") for mb in (1, 2) for p in phases)
    for row in rows:
        assert set(row) == {"system", "N", "P", "R", "mb", "phase", "seconds", "seconds_runs", "peak_mem_gib", "mfu",
                            "mfu_useful", "status"}
        assert row["status"] == "ok" and row["seconds"] > 0 and len(row["seconds_runs"]) == 1
    assert result["logprob_max_abs_diff"] <= 1e-5
    assert set(result["logprob_max_abs_diff_by_N"]) == {"2"}
    table = proc.stdout.strip().splitlines()[-7:]          # printed last: header + 2 mb x 3 phases
    assert table[0].split()[:3] == ["N", "mb", "phase"]
    assert [line.split()[1:3] for line in table[1:]] == [[mb, p] for mb in ("1", "2") for p in phases]


def load_bench():
    return load_script(BENCH, "policy_update_bench")


def test_time_budget_is_shared_and_results_survive_each_system(tmp_path, monkeypatch):
    """A slow first system must not starve the second (each gets an equal share of what is left), and the result
    file is written after every system."""
    bench = load_bench()
    budgets, clock = [], [0.0]

    def fake_system(argv, system, model_dir, budget_s, folder, args):
        budgets.append(budget_s)
        clock[0] += 300.0  # the first system overruns its share
        written = list(tmp_path.glob("policy_update-*.json"))
        assert (system == "stock") == (not written)  # written after the first system already
        return [{"system": system, "N": 2, "P": 8, "R": 4, "mb": 1, "phase": "old_log_prob", "seconds": 1.0,
                 "peak_mem_gib": None, "mfu": None, "mfu_useful": None, "status": "ok"}], {}

    monkeypatch.setattr(bench, "run_system_process", fake_system)
    monkeypatch.setattr(bench, "save_model", lambda args, path: (str(path), None))
    monkeypatch.setattr(bench.time, "monotonic", lambda: clock[0])
    assert bench.main(["--tiny", "--N", "2", "--mb", "1", "--time-budget-s", "400", "--out", str(tmp_path)]) == 0
    assert budgets[0] == 200.0                      # half of 400 for the first of two systems
    assert budgets[1] == 100.0                      # what is left (400 - 300) for the last one, not a negative value
    rows = json.loads(next(tmp_path.glob("policy_update-*.json")).read_text())["rows"]
    assert [r["system"] for r in rows] == ["stock", "dualkv"]


@pytest.mark.parametrize("phase", ["old_log_prob", "update_actor"])
def test_useful_mfu_counts_each_systems_own_flops(phase):
    """``mfu`` counts N-copy FLOPs for both systems; ``mfu_useful`` the FLOPs each executes: for dualkv the
    P+ΣR layout's (so it stays ≤ 100% where the N-copy count would exceed it)."""
    from transformers import Qwen3Config

    from dualkv.analysis.models import model_flops

    bench = load_bench()
    model = bench.analysis_model(Qwen3Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                             vocab_size=1000, tie_word_embeddings=True))
    n, mb, prompt, response, seconds, peak = 8, 4, 512, 64, 2.0, 1e12
    mode = "fwdbwd" if phase == "update_actor" else "fwd"
    layout = bench.phase_layout(prompt, response, mb)
    ncopy = model_flops(model, layout, mode, "ncopy")["total"] * n // mb
    own = model_flops(model, layout, mode, "dualkv")["total"] * n // mb
    row = {"system": "dualkv", "N": n, "P": prompt, "R": response, "mb": mb, "phase": phase,
           "mfu": ncopy / (seconds * peak)}
    assert bench.useful_mfu(model, row) == pytest.approx(own / (seconds * peak), rel=1e-12)
    assert bench.useful_mfu(model, row) < row["mfu"] / 2            # P=512 shared by 4 rows of 64: ρ > 2
    assert bench.useful_mfu(model, {**row, "system": "stock"}) == row["mfu"]
    assert bench.useful_mfu(model, {**row, "mfu": None}) is None
