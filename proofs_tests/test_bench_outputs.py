"""A newcomer's `dualkv bench` runs stay out of the tracked tree: results and figures go to ``out/bench`` (git-
ignored) unless ``--out`` says otherwise, and `dualkv bench plot experiments/results/...` never replaces the
committed figures beside those files (the README's), saying which files and commits a kernel figure merges."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dualkv.bench.cli import DEFAULT_OUT
from dualkv.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"


def test_default_output_is_ignored_by_git():
    ignored = [line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()]
    assert DEFAULT_OUT.split("/")[0] in {entry.strip("/") for entry in ignored}
    assert not DEFAULT_OUT.startswith("experiments")


@pytest.mark.parametrize("kind", ["kernel", "layer", "model"])
def test_bench_kinds_default_outside_the_tracked_results(kind, capsys):
    assert build_parser().parse_args(["bench", kind]).out == DEFAULT_OUT
    with pytest.raises(SystemExit):
        main(["bench", kind, "--help"])
    assert f"default {DEFAULT_OUT}" in " ".join(capsys.readouterr().out.split())


def test_a_tiny_layer_run_writes_under_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "layer", "--device", "cpu", "--tiny", "--P", "16", "--mb", "2", "--warmup", "0", "--reps", "1",
            "--no-plot"]
    assert main(argv) == 0
    assert len(list((tmp_path / DEFAULT_OUT).glob("layer-cpu-*.json"))) == 1
    assert not (tmp_path / "experiments").exists()


def _committed_copies(tmp_path: Path) -> tuple[list[Path], Path]:
    """Copies of the committed kernel runs behind the README's Table 1 figure, with that figure, in tmp_path."""
    folder = tmp_path / "experiments" / "results"
    folder.mkdir(parents=True)
    names = sorted(p.name for p in RESULTS.glob("kernel-*.json"))
    assert len(names) >= 2
    for name in names + [p.name for p in RESULTS.glob("kernel-*.png")]:
        shutil.copy(RESULTS / name, folder / name)
    return [folder / n for n in names], folder


def test_plot_of_committed_runs_leaves_their_figures_alone(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    files, folder = _committed_copies(tmp_path)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "plot", *map(str, files)]) == 0
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before      # nothing replaced, nothing added
    assert (tmp_path / DEFAULT_OUT / f"{files[-1].stem}.png").exists()
    out = capsys.readouterr().out
    assert f"merging {len(files)} kernel files" in out and "across runs" in out   # several commits: said so
    commits = {json.loads(f.read_text())["environment"]["commit"] for f in files}
    assert all(str(c) in out for c in commits)


def test_plot_replaces_a_figure_only_when_named(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    files, folder = _committed_copies(tmp_path)
    target = folder / f"{files[-1].stem}.png"
    target.write_bytes(b"old")
    assert main(["bench", "plot", *map(str, files), "--out", str(target)]) == 0
    assert target.read_bytes()[:4] == b"\x89PNG"
    layer = folder / "layer-x.json"
    layer.write_text(json.dumps({"environment": {}, "benchmark": "layer", "rows": []}))
    with pytest.raises(SystemExit, match="names one figure"):
        main(["bench", "plot", str(files[-1]), str(layer), "--out", str(target)])


def test_oom_markers_sit_above_the_panels_data(tmp_path, monkeypatch):
    """A sweep panel's out-of-memory markers go 1.3x above the highest value any system measured there (a system that
    ran out everywhere at that P used to draw its marker at 1.3, stretching the log axis over decades below the data),
    side by side where several systems ran out."""
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    from dualkv.bench import plot

    def row(system, mb, ms, status="ok"):
        return {"system": system, "P": 4096, "mb": mb, "ms": ms, "peak_mem_gib": None if ms is None else ms / 10,
                "status": status}

    rows = [row("dualkv", 8, 500.0), row("cudnn_ncopy", 8, None, "OOM"), row("fa2_ncopy", 8, None, "OOM")]
    assert plot.oom_marker_height(rows, 4096, "ms") == pytest.approx(650.0)
    assert plot.oom_marker_height(rows, 4096, "peak_mem_gib") == pytest.approx(65.0)
    assert plot.oom_marker_height(rows[1:], 4096, "ms") == pytest.approx(1.0)
    marks = []
    real = Axes.scatter
    monkeypatch.setattr(Axes, "scatter", lambda ax, x, y, **kw: marks.append((list(x), list(y))) or real(ax, x, y, **kw))
    path = tmp_path / "layer-x.json"
    path.write_text(json.dumps({"environment": {}, "benchmark": "layer", "rows": rows}))
    plot.plot_results(path)
    ms_marks = marks[:2]
    assert [y for _, ys in ms_marks for y in ys] == [pytest.approx(650.0)] * 2
    (x0,), (x1,) = (xs for xs, _ in ms_marks)
    assert x0 < 8 < x1                     # the two systems' markers do not cover each other
