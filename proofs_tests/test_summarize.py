"""The measured results in the docs come from the JSON: ``docs/RESULTS.md`` and the README's headline block are what
``experiments/summarize.py`` generates from ``experiments/results`` (a changed number in a result file makes them
stale: a known-wrong control), every ratio is within one run, every figure and result file the docs name exists,
and the README's Python examples run as written."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from experiment_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RESULTS_MD = (ROOT / "docs" / "RESULTS.md").read_text()


@pytest.fixture(scope="module")
def summarize():
    return load_script("experiments/summarize.py", "dualkv_summarize")


def test_results_and_readme_block_are_current():
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "summarize.py"), "--check"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_a_changed_measurement_makes_them_stale(summarize, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "experiments" / "results", results)
    # the last file of the run whose dualkv times the headline shows (so the README's block must change too)
    path = results / summarize.headline_run(summarize.kernel_runs(results)).files[-1].name
    data = json.loads(path.read_text())
    row = next(r for r in data["rows"] if r["system"] == "dualkv" and r["mode"] == "fwdbwd")
    row["ms"] *= 1.5
    path.write_text(json.dumps(data))
    assert summarize.results_markdown(results) != summarize.results_markdown(ROOT / "experiments" / "results")
    assert summarize.headline_block(results) not in README


def test_one_commit_on_two_gpus_is_two_runs(summarize):
    """Rows of one commit measured on an H100 and an H200 are never merged into one table."""
    for run in summarize.kernel_runs(ROOT / "experiments" / "results"):
        assert len({json.loads(f.read_text())["environment"]["gpu"] for f in run.files}) == 1, run.files
    runs = [r for r in summarize.kernel_runs(ROOT / "experiments" / "results") if r.commit == "672efaf"]
    assert sorted(r.env["gpu"] for r in runs) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]


def test_one_commit_under_two_nvrtc_releases_is_two_runs(summarize, tmp_path):
    """Rows of one commit on one GPU, one file compiled by the installed NVRTC and one by $DUALKV_NVRTC_LIB's, are two
    runs (not one table whose later file replaces the other's rows), and the second's title names its NVRTC."""
    results = tmp_path / "results"
    results.mkdir()
    row = {"system": "dualkv_mma", "N": 8, "P": 8192, "R": 2048, "mode": "fwdbwd", "ms": 35.0, "tflops": 300.0,
           "speedup_vs_fa2": None, "peak_mem_gib": 1.3, "status": "ok", "groups": 1, "r_range": None,
           "heads": 32, "kv_heads": 8, "head_dim": 128}
    for name, lib, nvrtc, ms in (("kernel-a.json", None, "13.0", 35.0), ("kernel-b.json", "/tmp/nv135", "13.5", 34.0)):
        env = {"commit": "abcdef0123", "gpu": "test GPU", "date": "2026-11-30T00:00Z", "nvrtc": nvrtc,
               "nvrtc_lib": lib}
        (results / name).write_text(json.dumps({"environment": env, "benchmark": "kernel",
                                                "rows": [{**row, "ms": ms}]}))
    runs = summarize.kernel_runs(results)
    assert sorted(r.rows[0]["ms"] for r in runs) == [34.0, 35.0]
    text = summarize.kernel_section(runs)
    assert text.count("NVRTC 13.5 (`DUALKV_NVRTC_LIB`)") == 1 and "NVRTC 13.0" not in text


def test_a_multi_group_kernel_file_among_the_results_is_left_out(summarize, tmp_path):
    """`dualkv bench kernel --groups G` files hold no Table 1 rows: summarize skips them instead of failing."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "experiments" / "results", results)
    shutil.copy(results / "checks" / "microbatch-4x8K-h100-20261127T0209Z.json", results / "kernel-groups4-x.json")
    assert summarize.results_markdown(results) and summarize.headline_block(results) in README


def test_other_attention_shapes_get_their_own_tables(summarize, tmp_path):
    """A `--head-dim 64` run is left out of Table 1 and shown in the other-shapes section, under its shape, its commit
    with the '+suffix' naming uncommitted work, and dualkv's time next to each peer's."""
    results = tmp_path / "results"
    results.mkdir()
    rows = [{"system": s, "N": 2, "P": 64, "R": 16, "mode": "fwdbwd", "ms": ms, "tflops": 1.0, "speedup_vs_fa2": None,
             "peak_mem_gib": 0.5, "status": "ok", "groups": 1, "heads": 8, "kv_heads": 2, "head_dim": 64}
            for s, ms in (("dualkv", 2.0), ("cudnn_cascade", 3.0))]
    env = {"commit": "abcdef0123+ws64", "gpu": "test GPU", "date": "2026-11-27T00:00Z"}
    (results / "kernel-h8-2-d64-x.json").write_text(json.dumps({"environment": env, "benchmark": "kernel",
                                                               "rows": rows}))
    assert summarize.kernel_runs(results) == []
    qwen = [dict(r, heads=32, kv_heads=8, head_dim=128) for r in rows]  # the same commit at Table 1's shape
    (results / "kernel-table1-x.json").write_text(json.dumps({"environment": env, "benchmark": "kernel", "rows": qwen}))
    [run] = summarize.kernel_runs(results)
    assert [f.name for f in run.files] == ["kernel-table1-x.json"]  # the head-dim-64 file is not listed there
    section = summarize.other_shapes_section(results)
    assert "### H=8, H_k=2, d=64: abcdef0+ws64 — test GPU" in section
    assert "**3.0** (1 TF, 0.5 GiB, 1.50×)" in section and "dualkv faster at 1 of 1 shapes" in section


def test_a_one_pass_run_shows_its_times(summarize, tmp_path):
    """A run of the backward alone (`--mode bwd`) shows its ms and peak memory, with no forward+backward total; a row
    that did not run shows its status."""
    results = tmp_path / "results"
    results.mkdir()
    base = {"N": 2, "P": 64, "R": 16, "tflops": 1.0, "speedup_vs_fa2": None, "groups": 1, "heads": 8,
            "kv_heads": 2, "head_dim": 64}
    rows = [dict(base, system="dualkv_mma_split", mode="bwd", ms=4.25, peak_mem_gib=0.5, status="ok"),
            dict(base, system="dualkv_mma_ordered", mode="bwd", ms=0.0, peak_mem_gib=None, status="oom")]
    env = {"commit": "abcdef0123", "gpu": "test GPU", "date": "2026-11-28T00:00Z"}
    (results / "kernel-h8-2-d64-x.json").write_text(json.dumps({"environment": env, "benchmark": "kernel",
                                                               "rows": rows}))
    section = summarize.other_shapes_section(results)
    assert "| – / 4.2 / – (0.5 GiB) | oom |" in section, section


def test_headline_ratios_are_within_one_run(summarize):
    """Each peer column of the headline: the peer's and dualkv's fwd+bwd times of the same run, the newest on the GPU
    of the run whose dualkv times the table shows where there is one (else the newest on any GPU)."""
    runs = summarize.kernel_runs(ROOT / "experiments" / "results")
    block = summarize.headline_block(ROOT / "experiments" / "results")
    newest = summarize.headline_run(runs)
    gpu = newest.env.get("gpu")
    for shape in newest.shapes:
        for peer in summarize.HEADLINE_PEERS:
            run = summarize.newest_with(runs, peer, shape, gpu=gpu)
            if run is None:
                run = summarize.newest_with(runs, peer, shape)
                assert all(r.env.get("gpu") != gpu for r in runs
                           if r.fwdbwd("dualkv", shape) and r.fwdbwd(peer, shape))
            if run is None:
                continue
            ratio = run.fwdbwd(peer, shape)["ms"] / run.fwdbwd("dualkv", shape)["ms"]
            assert f"{ratio:.2f}×" in block
            assert all(summarize._commit(r["environment"]) == run.commit
                       for r in map(lambda f: json.loads(f.read_text()), run.files))


def test_policy_update_mfu_within_100_percent():
    rows = re.findall(r"^\| (\d+) \| (\w+) \| [\d.]+ \([\d.]+, (\d+)%\) \| [\d.]+ \([\d.]+, (\d+)%\) \| ([\d.]+)× \|$",
                      RESULTS_MD, re.MULTILINE)
    assert any(n == "32" and phase == "update_actor" for n, phase, *_ in rows)
    for _, _, stock_mfu, dualkv_mfu, _ in rows:
        assert 0 < int(stock_mfu) <= 100 and 0 < int(dualkv_mfu) <= 100


@pytest.mark.parametrize("name, text", [("README.md", README), ("docs/RESULTS.md", RESULTS_MD)])
def test_every_figure_and_result_file_named_exists(name, text):
    base = (ROOT / name).parent
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images, f"{name} shows no figure"
    for image in images:
        assert (base / image).resolve().is_file(), image
    for result in set(re.findall(r"`((?:kernel|layer|model|policy_update|verify)-[\w.-]+\.json)`", text)):
        folder = ROOT / "experiments" / "results"
        assert (folder / result).is_file() or (folder / "checks" / result).is_file(), result


def test_figures_name_their_sources():
    """Every figure shown is followed by the files it was drawn from and the command that redraws it."""
    for text in (README, RESULTS_MD):
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text):
            caption = text.split(image, 1)[1][:2000]
            assert f"`{Path(image).name}`: drawn from" in caption and "dualkv bench plot" in caption, image


@pytest.mark.parametrize("index", [0, 1])
def test_readme_python_examples_run(index, tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    assert len(blocks) == 2
    script = tmp_path / "example.py"
    script.write_text(blocks[index])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_api_own_forward_example_runs(tmp_path):
    """docs/api.md's example for trainers that own the forward, on the README's model and batch: the log-probs equal
    model_response_logprobs' (a README walkthrough found both functions named there but documented nowhere)."""
    api = (ROOT / "docs" / "api.md").read_text()
    section = api.split("### Trainers that own the forward", 1)[1]
    example = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]
    readme = re.findall(r"```python\n(.*?)```", README, re.DOTALL)[1]
    check = ("\nwith apply_dualkv(model):\n    want, _ = model_response_logprobs(model, packed)\n"
             "assert logp.shape == want.shape == entropy.shape, (logp.shape, want.shape)\n"
             "assert torch.equal(logp, want), (logp - want).abs().max()\n")
    script = tmp_path / "example.py"
    script.write_text(readme + "\n" + example + check)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_every_setting_the_package_reads_is_documented():
    """Each ``DUALKV_*`` environment setting read under dualkv/ (a string literal there) is named in the README or
    docs/ (a README walkthrough found DUALKV_DEBUG and DUALKV_RESULTS_DIR read but documented nowhere)."""
    names = set()
    for path in (ROOT / "dualkv").rglob("*.py"):
        names |= set(re.findall(r"[\"'](DUALKV_[A-Z0-9_]+)[\"']", path.read_text()))
    names -= {"DUALKV_TARGET"}  # an __all__ entry (a Python constant), not a setting
    assert {"DUALKV_BACKEND", "DUALKV_DEBUG", "DUALKV_NVRTC_LIB"} <= names
    docs = README + "".join(p.read_text() for p in (ROOT / "docs").glob("*.md") if p.name != "RESULTS.md")
    assert sorted(n for n in names if n not in docs) == []


def test_readme_is_a_users_document():
    lines = README.splitlines()
    assert len(lines) <= 240
    assert "pip install dualkv" not in README and "pip install 'dualkv[" not in README
    assert "pip install -e '.[cu13]'" in README and "+actor_rollout_ref.actor.use_dualkv=true" in README
    for doc in ("docs/api.md", "docs/trl.md", "docs/trees.md", "docs/RESULTS.md"):
        assert f"]({doc})" in README
    assert "fastest at every shape" not in README and "cuDNN" in README


def test_worst_check_is_a_failing_or_nan_one(summarize):
    """The distributed table's "worst" column (dualkv.testing.bound_margin): a loss term passing on its absolute
    floor is not worst, a NaN error is (NaN compares false both ways, so a plain ratio would never be the max)."""
    from dualkv.testing import bound_margin

    floor = {"error": 5e-5, "bound": 1e-5, "atol": 1e-6, "max_abs": 1e-7, "passed": True}
    close = {"error": 9e-6, "bound": 1e-5, "passed": True}
    nan = {"error": float("nan"), "bound": 1e-5, "passed": False}
    assert bound_margin(floor) == pytest.approx(0.1) and bound_margin(nan) == float("inf")
    assert summarize._worst({"floor": floor, "close": close})[0] == "close"
    assert summarize._worst({"nan": nan, "close": close})[0] == "nan"
    assert summarize._worst({"close": close, "nan": nan})[0] == "nan"


def test_ragged_kernel_files_are_left_out_of_every_table(summarize, tmp_path):
    """`dualkv bench kernel --R-range` rows (ragged responses) belong to no equal-length table: neither Table 1 nor
    the other-shapes section lists them (at Qwen3-8B's shape or another), and summarize does not fail on them."""
    results = tmp_path / "results"
    results.mkdir()
    env = {"commit": "abcdef0123", "gpu": "test GPU", "date": "2026-11-27T00:00Z"}
    for name, shape in (("kernel-R1-9-x.json", {"heads": 32, "kv_heads": 8, "head_dim": 128}),
                        ("kernel-R1-9-h8-2-d64-x.json", {"heads": 8, "kv_heads": 2, "head_dim": 64})):
        rows = [{"system": "dualkv", "N": 2, "P": 64, "R": 5, "mode": "fwdbwd", "ms": 2.0, "tflops": 1.0,
                 "speedup_vs_fa2": None, "peak_mem_gib": 0.5, "status": "ok", "groups": 1, "r_range": "1-9", **shape}]
        (results / name).write_text(json.dumps({"environment": env, "benchmark": "kernel", "rows": rows}))
    assert summarize.kernel_runs(results) == []
    assert "d=64" not in summarize.other_shapes_section(results)


def test_headline_shows_each_ratios_spread(summarize, tmp_path):
    """The headline's ratio brackets pair the peer's fastest run with dualkv's slowest and the reverse; a shape where
    the ranges overlap is not counted as faster in every timed run (a known-wrong spread, the medians' ratio repeated,
    would print 1.50 (1.50-1.50) and count both)."""
    results = tmp_path / "results"
    results.mkdir()
    base = {"R": 2048, "mode": "fwdbwd", "tflops": 300.0, "speedup_vs_fa2": None, "peak_mem_gib": 1.0, "status": "ok",
            "groups": 1, "r_range": None, "reps": 10}
    rows = [dict(base, system="dualkv", N=8, P=8192, ms=10.0, ms_min=9.0, ms_max=11.0),
            dict(base, system="cudnn_cascade", N=8, P=8192, ms=15.0, ms_min=12.0, ms_max=18.0),
            dict(base, system="dualkv", N=16, P=32768, ms=100.0, ms_min=99.0, ms_max=101.0),
            dict(base, system="cudnn_cascade", N=16, P=32768, ms=103.0, ms_min=100.0, ms_max=106.0)]
    env = {"commit": "abcdef0123", "gpu": "test GPU", "date": "2026-12-01T00:00Z"}
    (results / "kernel-20261201-000000.json").write_text(json.dumps({"environment": env, "benchmark": "kernel",
                                                                    "rows": rows}))
    block = "\n".join(summarize.headline_kernel_table(summarize.kernel_runs(results)))
    assert "| (8, 8K) | 10.0 ms (9.0–11.0, 300 TF/s) | 1.50× (1.09–2.00) |" in block, block
    assert "| (16, 32K) | 100.0 ms (99.0–101.0, 300 TF/s) | 1.03× (0.99–1.07) |" in block, block
    assert "cuDNN cascade at 2 of 2 shapes (1 with every timed run faster)" in block


def test_layer_headline_takes_the_faster_ncopy_peer_and_the_cascade(summarize):
    """The layer rows: per (P, mb) the faster of FA2 / cuDNN N-copy (named), each ratio with the runs' spread, the
    cuDNN cascade in its own row, and N-copy out of memory only where every N-copy peer ran out (a known-wrong pick,
    the slower peer, would print 3.00x at (8192, 8))."""
    def row(system, p, mb, runs, status="ok"):
        return {"system": system, "P": p, "mb": mb, "status": status, "ms": sorted(runs)[len(runs) // 2] if runs
                else None, "ms_runs": runs}

    rows = [row("dualkv", 8192, 8, [9.0, 10.0, 11.0]), row("fa2_ncopy", 8192, 8, [29.0, 30.0, 31.0]),
            row("cudnn_ncopy", 8192, 8, [24.0, 25.0, 26.0]), row("cudnn_cascade", 8192, 8, [10.0, 11.0, 12.0]),
            row("dualkv", 131072, 8, [90.0, 100.0, 110.0]), row("fa2_ncopy", 131072, 8, [], "OOM"),
            row("cudnn_ncopy", 131072, 8, [], "OOM"), row("cudnn_cascade", 131072, 8, [100.0, 105.0, 110.0])]
    d = {"environment": {"commit": "abcdef0123"}, "rows": rows}
    (ncopy, cascade) = summarize.sweep_headline_rows(d, "layer-x.json")
    assert ncopy[0].startswith("one Qwen3-8B decoder layer, fwd+bwd, vs the faster N-copy (FA2 or cuDNN attention)")
    assert ncopy[1] == "2.50× (2.18–2.89) cuDNN at (8192, 8); N-copy out of memory at (131072, 8)", ncopy[1]
    assert cascade[1] == "1.10× (0.91–1.33) at (8192, 8), 1.05× (0.91–1.22) at (131072, 8)", cascade[1]
    fa2_only = {"environment": d["environment"], "rows": [r for r in rows if r["system"] in ("dualkv", "fa2_ncopy")]}
    (only,) = summarize.sweep_headline_rows(fa2_only, "layer-y.json")
    assert "vs FA2 N-copy" in only[0] and only[1].startswith("3.00× (2.64–3.44) at (8192, 8)"), only
    model = dict(d, benchmark="model", config={"model": "qwen3-1.7b", "layers": 28})
    (ncopy_m, cascade_m) = summarize.sweep_headline_rows(model, "model-x.json")
    assert ncopy_m[0].startswith("the whole Qwen3-1.7B model (28 layers, log-prob head), fwd+bwd, vs the faster")
    assert cascade_m[1] == cascade[1], cascade_m


def test_kernel_and_sweep_spreads_agree_on_one_rule(summarize):
    """The kernel table's spread (rows with ms_min / ms_max) and the sweeps' (rows with their run lists) are one
    rule: the peer's fastest run over dualkv's slowest, to the reverse; a row with neither has no spread."""
    mine_runs, theirs_runs = {"ms_runs": [9.0, 10.0, 11.0]}, {"ms_runs": [12.0, 15.0, 18.0]}
    mine_minmax, theirs_minmax = {"ms_min": 9.0, "ms_max": 11.0}, {"ms_min": 12.0, "ms_max": 18.0}
    expected = (12.0 / 11.0, 18.0 / 9.0)
    assert summarize._ratio_bounds(mine_runs, theirs_runs) == expected
    assert summarize._ratio_bounds(mine_minmax, theirs_minmax) == expected
    assert summarize._ratio_bounds(mine_runs, theirs_minmax) == expected
    assert summarize._ratio_bounds({"ms": 10.0}, theirs_runs) is None
    assert summarize._runs_spread(mine_runs, theirs_runs) == " (1.09–2.00)"
    assert summarize._runs_spread({"ms_runs": [10.0]}, theirs_runs) == ""


def test_policy_rows_show_the_runs_spread(summarize, tmp_path):
    """A veRL policy-update file with every timed run (seconds_runs) gives each phase's speedup its spread (stock's
    fastest over dualkv's slowest to the reverse); a file without the runs gives the ratio alone, and a newer file
    replaces the older one's phases of its N while the phases it lacks keep the older ratio."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "experiments" / "results", results)
    for old_file in results.glob("policy_update-*.json"):
        old_file.unlink()

    def row(system, phase, runs, with_runs=True):
        return {"system": system, "N": 8, "P": 8192, "R": 2048, "mb": 8, "phase": phase, "seconds": sorted(runs)[1],
                "seconds_runs": runs if with_runs else None, "peak_mem_gib": 1.0, "mfu": None, "mfu_useful": None,
                "status": "ok"}

    def write(name, commit, rows):
        cfg = {"model": "qwen3-1.7b", "P": 8192, "R": 2048, "N": [8], "mb": [8], "reps": 3}
        (results / name).write_text(json.dumps({"environment": {"commit": commit, "gpu": "test GPU"},
                                                "benchmark": "policy_update", "config": cfg, "rows": rows}))

    write("policy_update-cuda-20990101T000000Z.json", "1111111",
          [row("stock", "old_log_prob", [9.0, 9.0, 9.0], False), row("dualkv", "old_log_prob", [1.0, 1.0, 1.0], False),
           row("stock", "update_actor", [5.8, 5.8, 5.8], False), row("dualkv", "update_actor", [2.0, 2.0, 2.0], False)])
    write("policy_update-cuda-20990102T000000Z.json", "2222222",
          [row("stock", "old_log_prob", [3.0, 3.2, 3.1]), row("dualkv", "old_log_prob", [1.0, 1.1, 0.9])])
    block = summarize.headline_block(results)
    line = next(x for x in block.splitlines() if "N=8 " in x and "policy update" in x)
    assert "old log prob 3.10× (2.73–3.56)" in line and "2222222" in line, line
    assert "update actor 2.90× |" in line and "1111111" in line, line  # the older file (no runs) supplies this one


def test_trl_row_spread_skips_the_warm_up_step(summarize):
    """The TRL row's spread comes from the timed steps after the first (the warm-up the file's medians skip too);
    'training' is each step's log-probs + update. A known-wrong version counting the warm-up step (stock 9.0 s)
    would print an upper bound of 9.00 for log-probs."""
    def row(system, step, logprobs, update):
        return {"setting": "long", "system": system, "step": step, "logprobs_s": logprobs, "update_s": update,
                "generation_s": 1.0, "step_s": 1.0 + logprobs + update}

    d = {"rows": [row("stock", 1, 9.0, 9.0), row("stock", 2, 2.0, 4.0), row("stock", 3, 3.0, 5.0),
                  row("dualkv", 1, 5.0, 5.0), row("dualkv", 2, 1.0, 1.0), row("dualkv", 3, 0.5, 2.0)]}
    assert summarize.trl_phase_runs(d, "long", "stock", "training") == [6.0, 8.0]
    assert summarize.trl_spread(d, "long", "logprobs") == " (2.00–6.00)"
    assert summarize.trl_spread(d, "long", "training") == " (2.40–4.00)"
    assert summarize.trl_spread(d, "fp32", "logprobs") == ""


def test_other_kernel_lines_pick_default_builds_and_carry_spreads(summarize, tmp_path):
    """The headline's mma.sync and H100 sentences come from the newest default-build runs (a newer '+variant' build
    must not be picked: it would print 9.00×), the other-NVRTC run in its own clause, each ratio with its spread."""
    results = tmp_path / "results"
    results.mkdir()
    base = {"R": 2048, "mode": "fwdbwd", "tflops": 300.0, "speedup_vs_fa2": None, "peak_mem_gib": 1.0, "status": "ok",
            "groups": 1, "r_range": None, "reps": 10, "N": 8, "P": 8192}

    def write(name, commit, gpu, rows, **env):
        env = {"commit": commit, "gpu": gpu, "date": name[7:22], "nvrtc": "13.0", **env}
        (results / f"{name}.json").write_text(json.dumps({"environment": env, "benchmark": "kernel", "rows": rows}))

    def row(system, ms, lo, hi):
        return dict(base, system=system, ms=ms, ms_min=lo, ms_max=hi)

    write("kernel-20990101-000000", "aaaaaaa", "NVIDIA H200",
          [row("dualkv_mma", 10.0, 9.0, 11.0), row("dualkv_mma_atomic", 9.0, 9.0, 9.0), row("cascade", 11.0, 10.0, 12.0)])
    write("kernel-20990102-000000", "bbbbbbb+variant", "NVIDIA H200",
          [row("dualkv_mma", 1.0, 1.0, 1.0), row("cascade", 9.0, 9.0, 9.0)])
    write("kernel-20990103-000000", "ccccccc", "NVIDIA H200",
          [row("dualkv_mma", 8.0, 8.0, 8.0), row("cascade", 11.0, 11.0, 11.0)], nvrtc="13.5", nvrtc_lib="/x")
    write("kernel-20990104-000000", "ddddddd", "NVIDIA H100 80GB HBM3",
          [row("dualkv", 10.0, 10.0, 10.0), row("cudnn_cascade", 9.5, 9.0, 10.0)])
    mma, h100 = summarize.other_kernel_lines(summarize.kernel_runs(results))
    assert "NVRTC 13.0) the deterministic fwd+bwd is 1.10× (0.91–1.33) the FA2 cascade's speed at (8, 8K)" in mma, mma
    assert "`deterministic=False` (atomic dQ, as in FA2's backward) 1.22× (1.11–1.33)" in mma, mma
    assert "deterministic under NVRTC 13.5 1.38× (1.38–1.38) at (8, 8K)" in mma and "9.00" not in mma, mma
    assert "0.95× (0.90–1.00) as fast as the cuDNN cascade at (8, 8K)" in h100 and "ddddddd" in h100, h100


def test_figure_names_every_commit_a_system_is_drawn_from(summarize, tmp_path):
    """A figure merged from several files names, per system, every commit whose rows it draws (a later file's row
    replaces an earlier one's): the FA2 cascade's shapes from two runs show both commits, and a row fully replaced
    by a later file does not name its commit."""
    def write(name, commit, rows):
        (tmp_path / name).write_text(json.dumps({"environment": {"commit": commit}, "rows": rows}))

    def row(system, p):
        return {"system": system, "N": 8, "P": p, "mode": "fwdbwd"}

    write("a.json", "aaaaaaa", [row("cascade", 4096), row("cascade", 8192), row("dualkv", 4096)])
    write("b.json", "bbbbbbb", [row("cascade", 8192), row("dualkv", 4096)])
    fig = summarize.Figure("f.png", ("a.json", "b.json"), ("dualkv", "cascade"))
    text = summarize.figure_block(fig, tmp_path, "")
    assert "FA2 cascade at aaaaaaa / bbbbbbb" in text and "dualkv at bbbbbbb;" in text, text
