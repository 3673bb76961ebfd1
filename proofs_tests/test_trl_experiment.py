"""The end-to-end GRPO script (experiments/trl_grpo/grpo_e2e.py) on the CPU: tiny fp32 models, both systems, 2 steps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "trl_grpo"))
import grpo_e2e  # noqa: E402


def test_tiny_run_writes_results_and_both_systems_agree(tmp_path, capsys):
    assert grpo_e2e.main(["--tiny", "--settings", "fp32", "--steps", "2", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("trl_grpo-cpu-tiny-*.json")
    data = json.loads(path.read_text())
    rows = data["rows"]
    assert {(r["system"], r["step"]) for r in rows} == {(s, i) for s in grpo_e2e.SYSTEMS for i in (1, 2)}
    for r in rows:
        assert r["generation_s"] > 0 and r["update_s"] > 0 and r["logprobs_s"] > 0 and 0 <= r["reward"] <= 1
    cmp = data["comparisons"]["fp32"]
    assert cmp["same_rows"] and cmp["logprob_max_rel"] < 1e-5
    assert max(cmp["grad_max_rel_per_step"]) < 1e-5
    assert set(data["summary"]["fp32"]["speedup"]) == {"generation", "logprobs", "update", "training", "step"}
    assert data["environment"]["trl"].startswith("1.16")
    assert "setting  system" in capsys.readouterr().out


def test_reward_counts_target_residue():
    assert grpo_e2e.target_residue_reward(["t8 t3 t16 t5", "", "t1 <eos>"]) == [0.5, 0.0, 0.0]


def test_controls_measure_the_stock_vs_stock_spread(tmp_path):
    systems = ",".join((*grpo_e2e.SYSTEMS, *grpo_e2e.CONTROLS))
    assert grpo_e2e.main(["--tiny", "--settings", "curves", "--steps", "2", "--systems", systems,
                          "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("trl_grpo-cpu-tiny-*.json")
    data = json.loads(path.read_text())
    assert {r["system"] for r in data["rows"]} == {*grpo_e2e.SYSTEMS, *grpo_e2e.CONTROLS}
    spread = data["summary"]["curves"]["curve_spread"]
    assert set(spread) == {*grpo_e2e.SYSTEMS, *grpo_e2e.CONTROLS}
    assert spread["stock"]["reward_max_abs_diff"] == 0.0  # stock against itself
    for entry in spread.values():
        assert entry["steps"] == 2 and entry["reward_mean_abs_diff"] is not None


def test_curve_spread_sees_a_different_curve():
    rows = lambda rewards: {"rows": [{"step": i + 1, "reward": r, "loss": 0.0} for i, r in enumerate(rewards)]}  # noqa: E731
    spread = grpo_e2e.curve_spread({"stock": rows([0.1, 0.2]), "stock_seed1": rows([0.1, 0.5])})
    assert spread["stock_seed1"]["reward_max_abs_diff"] == pytest.approx(0.3)
    assert spread["stock_seed1"]["reward_mean_abs_diff"] == pytest.approx(0.15)


def test_install_wheels_help_and_missing_folder(tmp_path):
    """``install_wheels.py --help`` took "--help" for the wheel folder ("no wheels in --help", exit 1)."""
    import subprocess

    script = Path(__file__).resolve().parents[1] / "experiments" / "trl_grpo" / "install_wheels.py"
    shown = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "usage:" in shown.stdout and "WHEEL_DIR" in shown.stdout, shown.stderr
    empty = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True)
    assert empty.returncode == 1 and f"no wheels in {tmp_path}" in empty.stderr
