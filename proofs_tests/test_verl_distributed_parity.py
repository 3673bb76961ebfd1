"""``experiments/verl/distributed_parity.py`` launched by torchrun: veRL's FSDP2 engine, stock vs dualkv, DP=2,
Ulysses SP=2 and DP=2 x SP=2. On the CPU over gloo at a tiny size (the program's whole logic: balancing check, both
precisions' comparisons, SP consistency, JSON), with the known-wrong variants it must catch; on 2 (4) GPUs over
NCCL with the CUDA kernels (marked gpu + multigpu; skipped with fewer devices)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl_fixtures.import_stubs import DEFAULT_STUBS

REPO = Path(__file__).resolve().parents[1]
PARITY = REPO / "experiments" / "verl" / "distributed_parity.py"


@pytest.fixture(autouse=True)
def _needs_verl():
    """Checked per test, not at import: the gpu tests must still be collected where veRL is not installed (the GPU
    hosts get it from carried wheels, experiments/verl/run_multigpu.sh). Found, not imported: veRL imports Ray,
    which those hosts lack; the launched program stubs it (``DUALKV_BENCH_HIDE_PACKAGES``)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:   # (origin None: a namespace package, e.g. experiments/verl on sys.path)
        pytest.skip("veRL is not installed")


def run_parity(mode: str, nproc: int, out: Path, *extra: str, device: str = "cpu",
               timeout: int = 600) -> tuple[subprocess.CompletedProcess, dict]:
    """torchrun the parity program; (process, the JSON rank 0 wrote). Its temporary files go under ``out/tmp``,
    which must hold no ``dualkv-parity-*`` folder (its saved random model) when it exits."""
    scratch = out / "tmp"
    scratch.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore", VERL_LOGGING_LEVEL="ERROR", TMPDIR=str(scratch),
               DUALKV_BENCH_HIDE_PACKAGES=",".join(DEFAULT_STUBS),     # as on the GPU hosts: no Ray, datasets, ...
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           str(PARITY), "--mode", mode, "--device", device, "--out", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    written = sorted(out.glob(f"distributed_parity-{mode}*.json"))
    assert written, proc.stdout[-3000:] + proc.stderr[-3000:]
    left = [p.name for p in scratch.glob("dualkv-parity-*")]
    assert not left, f"the parity program left its model folders behind: {left}"
    return proc, json.loads(written[-1].read_text())


def device_is_cpu(record: dict) -> bool:
    return record["environment"]["device"] == "cpu"


def fp32_rows_within(rows: dict) -> bool:
    """Every fp32 quantity within 1e-5 relative, a loss term also at <= 1e-6 absolute (on-policy ppo_kl is ~0)."""
    return all(row["error"] <= 1e-5 or (name.startswith("term:") and row["max_abs"] <= 1e-6)
               for name, row in rows.items())


def _assert_passed(proc, record, mode, world, precisions):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert record["passed"] and record["failed"] == []
    assert record["mode"] == mode and record["world_size"] == world and len(record["devices"]) == world
    assert record["partition"]["split_groups"] == []
    if device_is_cpu(record):
        assert set(record["environment"]["stubbed_packages"]) == set(DEFAULT_STUBS)
    for rank in record["ranks"]:
        assert set(rank["report"]) == set(precisions)
        for rows in rank["report"].values():
            assert {"log_probs", "entropy", "first_token_log_probs", "loss", "grads", "grad_norm",
                    "term:actor/pg_loss", "term:kl_loss"} <= set(rows)
    if record["sp"] > 1:
        assert record["sp_consistency"]["passed"] and record["sp_shared_rows_on_every_sp_rank"]


@pytest.mark.parametrize("mode,world", [("dp1", 1), ("dp2", 2), ("sp2", 2), ("dp2sp2", 4)])
def test_parity_cpu(mode, world, tmp_path):
    precisions = ["fp32", "bf16"] if mode != "dp2sp2" else ["fp32"]
    proc, record = run_parity(mode, world, tmp_path, "--precisions", ",".join(precisions))
    _assert_passed(proc, record, mode, world, precisions)
    assert fp32_rows_within(record["ranks"][0]["report"]["fp32"])
    assert record["tolerance"]["old_log_probs"] == "on-policy"
    if "bf16" in precisions:
        bf16 = record["ranks"][0]["report"]["bf16"]
        assert all(row["stock_bf16_spread"] > 0 for name, row in bf16.items() if name != "loss")
        assert 0 < bf16["grads"]["stock_bf16_rel_vs_stock_fp32"] < 1
        by_param = record["ranks"][0]["grads_by_param"]["bf16"]
        assert by_param and by_param[0]["max_abs"] == max(r["max_abs"] for r in by_param)
        assert by_param[0]["max_abs"] == pytest.approx(bf16["grads"]["error"])  # the flat max is some parameter's


@pytest.mark.parametrize("n", [1, 3])
def test_parity_cpu_responses_per_prompt(n, tmp_path):
    """--responses: one response per prompt (nothing shared) and an odd group size keep parity; the file names N."""
    proc, record = run_parity("dp1", 1, tmp_path, "--precisions", "fp32", "--responses", str(n))
    _assert_passed(proc, record, "dp1", 1, ["fp32"])
    assert record["N"] == n and all(len(rs) == n for _, rs in record["global_groups"][0])
    assert (tmp_path / f"distributed_parity-dp1-n{n}.json").exists()


def test_parity_cpu_over_several_batches(tmp_path):
    """--batches 2: two batches (seeds 0 and 1) on the same model; fp32 rows are the worse batch's, a bf16 row's
    error and spread are the means of its batches' (BF16_RULE)."""
    proc, record = run_parity("dp1", 1, tmp_path, "--precisions", "fp32,bf16", "--batches", "2")
    _assert_passed(proc, record, "dp1", 1, ["fp32", "bf16"])
    assert record["batch_seeds"] == [0, 1] and record["tolerance"]["batches"] == 2
    assert len(record["global_groups"]) == 2 and record["global_groups"][0] != record["global_groups"][1]
    assert len(record["ranks"][0]["groups"]) == 2
    for row in record["ranks"][0]["report"]["bf16"].values():
        assert len(row["batch_errors"]) == 2 and row["error"] == pytest.approx(sum(row["batch_errors"]) / 2)
        assert row["passed"] == (row["error"] <= row["bound"])


def _bf16_row(error: float, spread: float) -> dict:
    return {"error": error, "stock_bf16_spread": spread, "factor": 2.0, "fa_atol": 1e-4,
            "bound": 2.0 * spread + 1e-4, "passed": error <= 2.0 * spread + 1e-4, "rel_vs_stock_bf16": 0.0,
            "rel_vs_stock_fp32": error, "stock_bf16_rel_vs_stock_fp32": spread}


def test_bf16_rule_averages_batches():
    """One unlucky batch does not decide (the batch over its bound, the mean under), a systematic excess does, and the
    fp32 rule still needs every batch."""
    from experiment_scripts import load_script

    parity = load_script("experiments/verl/distributed_parity.py", "distributed_parity")
    lucky = parity.over_batches([{"q": _bf16_row(3.0e-3, 1.0e-3)}, {"q": _bf16_row(1.0e-3, 1.5e-3)}])["q"]
    assert lucky["batch_passed"] == [False, True] and lucky["passed"]
    assert lucky["error"] == pytest.approx(2.0e-3) and lucky["bound"] == pytest.approx(2.0 * 1.25e-3 + 1e-4)
    worse = parity.over_batches([{"q": _bf16_row(3.0e-3, 1.0e-3)}, {"q": _bf16_row(2.5e-3, 1.0e-3)}])["q"]
    assert not worse["passed"] and worse["batch_passed"] == [False, False]
    fp32 = [{"q": {"error": 1e-6, "bound": 1e-5, "passed": True}}, {"q": {"error": 2e-5, "bound": 1e-5, "passed": False}}]
    assert not parity.worst_over_batches(fp32)["q"]["passed"]
    assert parity.worst_over_batches(fp32)["q"]["batch_passed"] == [True, False]


def test_fp32_rule_sees_a_nan_on_any_batch():
    """A NaN compares false both ways, so a max over margins kept the finite batch's passing row; the verdict must
    still be every batch's, and the worst row the NaN one."""
    from experiment_scripts import load_script

    parity = load_script("experiments/verl/distributed_parity.py", "distributed_parity")
    nan = float("nan")
    batches = [{"q": {"error": 1e-6, "bound": 1e-5, "passed": True}},
               {"q": {"error": nan, "bound": 1e-5, "passed": nan <= 1e-5}}]
    for order in (batches, batches[::-1]):
        row = parity.worst_over_batches(order)["q"]
        assert not row["passed"] and row["error"] != row["error"]


def test_precisions_run_fp32_first():
    """bf16 trains on stock fp32's log-probs (ON_POLICY_NOTE), so fp32 runs first whatever order is given."""
    from experiment_scripts import load_script

    parity = load_script("experiments/verl/distributed_parity.py", "distributed_parity")
    args = parity.parse_args(["--mode", "dp1", "--device", "cpu", "--precisions", "bf16,fp32"])
    assert args.precisions == ["fp32", "bf16"] and args.batches == 1


@pytest.mark.parametrize("batches", ["0", "-1"])
def test_batches_below_one_are_refused(batches, capsys):
    """--batches 0 is refused, not read as "the default"."""
    from experiment_scripts import load_script

    parity = load_script("experiments/verl/distributed_parity.py", "distributed_parity")
    with pytest.raises(SystemExit):
        parity.parse_args(["--mode", "dp1", "--device", "cpu", "--batches", batches])
    assert "--batches must be >= 1" in capsys.readouterr().err


def test_parity_cpu_random_old_log_probs(tmp_path):
    """The off-policy variant (random old log-probs: PPO clipping active) keeps fp32 parity."""
    proc, record = run_parity("dp2", 2, tmp_path, "--precisions", "fp32", "--old-log-probs", "random")
    _assert_passed(proc, record, "dp2", 2, ["fp32"])
    assert record["tolerance"]["old_log_probs"] == "random"


def test_group_splitting_balance_is_caught(tmp_path):
    """Known-wrong variant: stock veRL's row balancing scatters a group's rows over the DP ranks."""
    proc, record = run_parity("dp2", 2, tmp_path, "--mutant", "split-groups", "--precisions", "fp32")
    assert proc.returncode != 0
    assert not record["passed"] and "split prompt groups" in record["error"]


def test_dropped_shared_row_all_reduce_is_caught(tmp_path):
    """Known-wrong variant: the SP all-reduce of the shared last-prompt rows removed (each rank keeps its own)."""
    proc, record = run_parity("sp2", 2, tmp_path, "--mutant", "no-sp-allreduce", "--precisions", "fp32")
    assert proc.returncode != 0 and not record["passed"]
    assert "fp32:first_token_log_probs" in record["failed"]


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("mode,world", [("dp2", 2), ("sp2", 2), ("dp2sp2", 4)])
def test_parity_gpus(mode, world, tmp_path):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs")
    proc, record = run_parity(mode, world, tmp_path, device="cuda")
    _assert_passed(proc, record, mode, world, ["fp32", "bf16"])
    assert record["environment"]["dualkv_backend_bf16"] == "cuda"
