"""``dualkv model`` and the plots it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dualkv.analysis.results import load_results
from dualkv.cli import main

DATA = Path(__file__).resolve().parent / "data"
ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *args):
    code = main(["model", *args])
    return code, capsys.readouterr().out


def test_done_when_json(capsys):
    code, out = run(capsys, "--N", "16", "--P", "65536", "--R", "512", "--json")
    rep = json.loads(out)
    assert code == 0
    assert abs(rep["rho"] - 14.33) <= 0.01
    assert rep["tokens_std"] == 1_056_768 and rep["tokens_dualkv"] == 73_728
    assert rep["attn_speedup_theory"] == pytest.approx(14.4328, abs=1e-4)
    assert {"attn_pairs_std", "attn_pairs_dualkv", "flops_std", "flops_dualkv", "speedup", "memory"} <= set(rep)


def test_subcommand_is_registered_in_a_fresh_process():
    out = subprocess.run([sys.executable, "-m", "dualkv", "model", "--N", "16", "--P", "65536", "--R", "512",
                          "--json"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert abs(json.loads(out)["rho"] - 14.33) <= 0.01


def test_text_report_and_options(capsys):
    _, out = run(capsys, "--N", "8", "--P", "16384", "--R", "2048", "--model", "llama-3.1-8b", "--mb", "4")
    assert "rho = 4.50" in out and "micro-batches of 4 rows: 2 per group, rho = 3.00" in out
    assert "paper's fit (Llama-3.1-8B)" in out
    _, out = run(capsys, "--P", "4096", "--R", "100,300,700,900", "--json")
    rep = json.loads(out)
    assert rep["N"] == 4 and rep["R"] == [100, 300, 700, 900]
    _, out = run(capsys, "--N", "4", "--P", "4096", "--R", "512", "--mb", "4", "--memory-rows",
                 str(DATA / "synthetic_memory.csv"), "--json")
    law = json.loads(out)["memory"]["law"]
    assert law["source"] == "fit" and law["dualkv"] < law["fa2_projection"]
    _, out = run(capsys, "--N", "8", "--P", "8192", "--R", "2048", "--seconds", "2", "--num-gpus", "2", "--json")
    rep = json.loads(out)
    assert rep["mfu"]["dualkv_flops"] == pytest.approx(rep["flops_dualkv"]["total"] / (2 * 989e12 * 2))
    assert rep["mfu"]["ncopy_equivalent"] / rep["mfu"]["dualkv_flops"] == pytest.approx(rep["speedup"]["flop_ratio"])
    _, out = run(capsys, "--list-models")
    assert "gemma4-31b-style" in out


@pytest.mark.parametrize("args,match", [
    (["--N", "0", "--P", "10", "--R", "5"], "N = 0"),
    (["--N", "2", "--P", "-10", "--R", "5"], "P = -10"),
    (["--N", "2", "--P", "10", "--R", "5", "--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["--N", "3", "--P", "10", "--R", "5,6"], "N = 3 but R lists 2"),
    (["--N", "3", "--R", "5"], "missing --P"),
    ([], "give --N, --P and --R"),
    (["--plot", "out", "--results", "/nonexistent/results"], "no result files at /nonexistent/results"),
    (["--N", "2", "--P", "10", "--R", "5", "--seconds", "-1"], "seconds = -1"),
    (["--N", "2", "--P", "10", "--R", "5", "--seconds", "1", "--gpu", "V100"], "unknown gpu 'V100'"),
    (["--N", "2", "--P", "10", "--R", "5", "--seconds", "nan"], "seconds = nan"),
    (["--N", "2", "--P", "10", "--R", "5", "--seconds", "inf"], "seconds = inf"),
    (["--N", "2", "--P", "10", "--R", "5", "--memory-rows", str(DATA / "synthetic_memory.csv")],
     "--memory-rows needs --mb"),
    (["--N", "2", "--P", "10", "--R", "5", "--mb", "2", "--memory-rows", "/nonexistent/mem.csv"],
     "no memory measurement file at /nonexistent/mem.csv"),
    (["--N", "2", "--P", "10", "--R", "5", "--mb", "2", "--memory-rows", str(DATA / "broken" / "truncated.json")],
     "truncated.json: not a readable JSON result file"),
    (["--plot", "out", "--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["--N", "2", "--P", "10", "--R", "5", "--results", str(DATA)], "--results only applies with --plot"),
])
def test_bad_arguments_name_the_problem(args, match):
    with pytest.raises(SystemExit, match=match):
        main(["model", *args])


def _check_readable(fig):
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    for ax in axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title(), "every panel needs axis labels and a title"
    assert any(ax.get_legend() for ax in axes) or fig.legends, "no legend"


def test_figures_are_labelled():
    with pytest.warns(UserWarning):
        results = load_results(DATA)
    pytest.importorskip("matplotlib")   # not on the GPU machine; the dev extra has it
    from dualkv.analysis import plots

    for fig in (plots.fig_rho(), plots.fig_speedup(), plots.fig_speedup(results), plots.fig_memory(),
                plots.fig_memory(results)):
        _check_readable(fig)
    law, rows = plots.memory_law_for(results)
    assert law.source == "fit to measured layer rows" and len(rows) == 12
    assert plots.memory_law_for([])[0].source.startswith("paper's fit")


def test_plot_command_writes_pngs(tmp_path, capsys):
    with pytest.warns(UserWarning):
        code, out = run(capsys, "--plot", str(tmp_path), "--results", str(DATA))
    assert code == 0
    for name in ("rho", "speedup", "memory"):
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
        assert str(png) in out
