"""``experiments/verl/multigpu_bench.py`` at a tiny size on the CPU over gloo (torchrun, 1 and 2 processes, Ray and
datasets hidden as on the GPU hosts): the launches' JSON and the summary (DP scaling, longest prompt per SP size,
dualkv vs stock); and the summary's reading of out-of-memory rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

from experiment_scripts import load_script  # noqa: E402
from verl_fixtures.import_stubs import DEFAULT_STUBS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "experiments" / "verl" / "multigpu_bench.py"


def _env() -> dict:
    return dict(os.environ, PYTHONWARNINGS="ignore", VERL_LOGGING_LEVEL="ERROR",
                DUALKV_BENCH_HIDE_PACKAGES=",".join(DEFAULT_STUBS),
                PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def _run(args: list[str], nproc: int | None = None) -> subprocess.CompletedProcess:
    launcher = [] if nproc is None else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    proc = subprocess.run([sys.executable, *launcher, str(BENCH), *args], capture_output=True, text=True,
                          timeout=600, env=_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def load_bench():
    return load_script(BENCH, "multigpu_bench")


def test_multigpu_bench_cpu(tmp_path):
    model = tmp_path / "tiny"
    out = tmp_path / "out"
    _run(["--save-model", str(model), "--model", "tiny", "--max-positions", "256", "--R", "4"])
    common = ["--model-dir", str(model), "--R", "4", "--N", "2", "--out", str(out), "--warmup", "0", "--reps", "1"]
    _run(["--task", "throughput", "--systems", "dualkv", "--P", "12", *common], nproc=1)
    _run(["--task", "throughput", "--systems", "dualkv", "--P", "12", *common], nproc=2)
    _run(["--task", "maxp", "--sp", "1", "--P", "8,16", *common], nproc=1)
    _run(["--task", "maxp", "--sp", "2", "--P", "8,16,32", "--max-p", "16", "--stock-mb", "1", "--tag", "speed",
          *common], nproc=2)
    _run(["--summarize", str(out)])
    launch = json.loads((out / "multigpu-maxp-w2-sp2-tiny-speed.json").read_text())
    assert launch["stock_mb"] == 1 and launch["mb"] == 2            # stock one row per micro-batch, dualkv the group
    assert launch["dp"] == 1 and launch["sp"] == 2 and len(launch["environment"]["devices"]) == 2
    assert sorted({r["P"] for r in launch["rows"]}) == [8, 16]            # --max-p stops the grid
    assert all(len(r["peak_mem_gib_per_rank"]) == 2 for r in launch["rows"])
    summary = json.loads((out / "multigpu_summary.json").read_text())
    assert {(r["system"], r["phase"]) for r in summary["dp_scaling"]} == {("dualkv", "old_log_prob"),
                                                                          ("dualkv", "update_actor")}
    assert all(r["throughput_ratio"] > 0 for r in summary["dp_scaling"])
    assert summary["max_prompt"]["dualkv_sp1"]["max_p"] == 16 and summary["max_prompt"]["dualkv_sp2"]["max_p"] == 16
    assert {(r["sp"], r["P"]) for r in summary["dualkv_vs_stock_update"]} == {(1, 8), (1, 16), (2, 8), (2, 16)}


def test_summary_reads_out_of_memory_rows(tmp_path):
    bench = load_bench()

    def row(system, p, status, seconds=None, reps=1):
        return {"system": system, "phase": "update_actor", "P": p, "status": status, "seconds": seconds,
                "reps": reps, "peak_mem_gib_per_rank": [None]}

    for sp, rows in {1: [row("stock", 8, "OOM"), row("dualkv", 8, "ok", 2.0), row("dualkv", 16, "ok", 4.0),
                         row("dualkv", 32, "OOM")],
                     2: [row("stock", 8, "ok", 9.0), row("dualkv", 8, "ok", 3.0), row("stock", 16, "OOM"),
                         row("dualkv", 16, "ok", 5.0), row("dualkv", 32, "ok", 8.0, reps=1)]}.items():
        (tmp_path / f"multigpu-maxp-w{sp}-sp{sp}-m.json").write_text(json.dumps(
            {"task": "maxp", "sp": sp, "world_size": sp, "rows": rows}))
    summary = bench.summarize(tmp_path)
    assert summary["max_prompt"]["stock_sp1"] == {"max_p": None, "first_oom_p": 8, "bounded_by_oom": True}
    assert summary["max_prompt"]["dualkv_sp1"] == {"max_p": 16, "first_oom_p": 32, "bounded_by_oom": True}
    assert summary["max_prompt"]["dualkv_sp2"] == {"max_p": 32, "first_oom_p": None, "bounded_by_oom": False}
    assert summary["dualkv_sp2_over_sp1_max_p"] == 2.0
    assert summary["dualkv_vs_stock_update"] == [{"sp": 2, "P": 8, "stock_s": 9.0, "dualkv_s": 3.0, "speedup": 3.0,
                                                  "stock_mb": None, "mb": None}]


def test_summary_merges_launches_of_one_sp(tmp_path):
    """A longest-prompt search and a tagged speed run at the same SP: one max_prompt entry over both."""
    bench = load_bench()

    def row(system, p, status, seconds=None):
        return {"system": system, "phase": "update_actor", "P": p, "status": status, "seconds": seconds,
                "reps": 1, "peak_mem_gib_per_rank": [None, None]}

    launches = {"fit": [row("dualkv", 64, "ok", 5.0), row("dualkv", 96, "OOM")],
                "speed": [row("stock", 8, "ok", 6.0), row("dualkv", 8, "ok", 2.0)]}
    for tag, rows in launches.items():
        (tmp_path / f"multigpu-maxp-w2-sp2-m-{tag}.json").write_text(json.dumps(
            {"task": "maxp", "sp": 2, "world_size": 2, "mb": 4, "stock_mb": 1, "rows": rows}))
    summary = bench.summarize(tmp_path)
    assert summary["max_prompt"]["dualkv_sp2"] == {"max_p": 64, "first_oom_p": 96, "bounded_by_oom": True}
    assert summary["max_prompt"]["stock_sp2_mb1"]["max_p"] == 8 and "stock_sp2" not in summary["max_prompt"]
    assert summary["dualkv_vs_stock_update"] == [{"sp": 2, "P": 8, "stock_s": 6.0, "dualkv_s": 2.0, "speedup": 3.0,
                                                  "stock_mb": 1, "mb": 4}]


def test_the_launch_programs_name_a_missing_verl(monkeypatch, tmp_path):
    """Without veRL, distributed_parity.py and multigpu_bench.py stop with the supported range and the install line
    (they ended in a ModuleNotFoundError deep inside the run)."""
    import dualkv.integration.verl.compat as compat

    monkeypatch.setattr(compat, "installed_verl_version", lambda: None)
    parity = load_script("experiments/verl/distributed_parity.py", "distributed_parity")
    with pytest.raises(SystemExit, match=r"distributed_parity\.py: .*veRL is not installed"):
        parity.main(["--mode", "dp1", "--device", "cpu", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"multigpu_bench\.py: .*pip install -e '\.\[verl\]'"):
        load_bench().main(["--model-dir", str(tmp_path), "--device", "cpu", "--out", str(tmp_path)])
