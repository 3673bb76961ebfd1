"""Plots and tables derived from benchmark result files (never hand-entered numbers).

``dualkv bench plot FILE.json ...`` draws the figures of result files (e.g. on a machine with matplotlib when the
GPU machine has none) into ``out/bench/`` (or ``--out``), never next to the files: the committed figures beside
``experiments/results/*.json`` are only replaced by naming them with ``--out``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple, Sequence, Union

from ..analysis.models import QWEN3_8B_ATTENTION
from . import register_bench
from .cli import DEFAULT_OUT

__all__ = ["ResultFile", "latest_kernel_rows", "plot_kernel_results", "plot_results", "speedup_table"]

REFERENCE_SYSTEM = "dualkv"


class ResultFile(NamedTuple):
    """A benchmark result file read once: its path (for messages and figure names) and its JSON."""

    path: str
    data: dict


#: What the functions below take for a result file: its path (read there) or a :class:`ResultFile` already read.
ResultSource = Union[str, Path, ResultFile]


def _loaded(source: ResultSource) -> ResultFile:
    return source if isinstance(source, ResultFile) else ResultFile(str(source), json.loads(Path(source).read_text()))


def _kernel_files(sources: Sequence[ResultSource]) -> list[ResultFile]:
    """Each source read (once, if it is a path); ValueError naming one that is not a ``dualkv bench kernel`` result."""
    files = [_loaded(source) for source in sources]
    for f in files:
        if f.data.get("benchmark") != "kernel":
            raise ValueError(f"{f.path} is not a `dualkv bench kernel` result (benchmark={f.data.get('benchmark')!r})")
    return files


def _ok(row: dict) -> bool:
    return row.get("status") == "ok" and row.get("ms") is not None


def speedup_table(rows: Sequence[dict], reference: str = REFERENCE_SYSTEM) -> str:
    """Text table: per (P, mb) each system's ms and peak GiB, and the reference's speedup over it."""
    systems = list(dict.fromkeys(r["system"] for r in rows))
    configs = list(dict.fromkeys((r["P"], r["mb"]) for r in rows))
    by_key = {(r["system"], r["P"], r["mb"]): r for r in rows}
    header = f"{'P':>7} {'mb':>3} | " + " | ".join(f"{s:>26}" for s in systems)
    lines = [header, "-" * len(header)]
    for p, mb in configs:
        ref = by_key.get((reference, p, mb))
        cells = []
        for s in systems:
            r = by_key.get((s, p, mb))
            if r is None:
                cells.append(f"{'-':>26}")
            elif not _ok(r):
                cells.append(f"{r['status']:>26}")
            else:
                mem = f"{r['peak_mem_gib']:.1f}G" if r.get("peak_mem_gib") is not None else "-"
                ratio = ""
                if s != reference and ref is not None and _ok(ref):
                    ratio = f" {r['ms'] / ref['ms']:.2f}x"
                cells.append(f"{r['ms']:>10.1f}ms {mem:>6}{ratio:>7}")
        lines.append(f"{p:>7} {mb:>3} | " + " | ".join(cells))
    lines.append(f"(Nx = that system's time / {reference}'s time, i.e. {reference}'s speedup over it)")
    return "\n".join(lines)


def oom_marker_height(rows: list[dict], prompt_len: int, metric: str) -> float:
    """Where a panel (one P, one metric) draws its out-of-memory markers: 1.3x the highest value measured there by
    any system (1.0 where nothing was measured), so a marker never stretches the log axis below the data."""
    values = [r[metric] for r in rows if r["P"] == prompt_len and _ok(r) and r.get(metric) is not None]
    return 1.3 * max(values, default=1.0 / 1.3)


def plot_results(source: ResultSource, out: str | Path | None = None) -> Path | None:
    """Draw time and peak memory per (P, mb) and system into ``out`` (default: next to the JSON file, what a
    benchmark run does with its own file); None without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    path, data = _loaded(source)
    path = Path(path)
    rows = data["rows"]
    prompts = sorted({r["P"] for r in rows})
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, axes = plt.subplots(2, len(prompts), figsize=(3.2 * len(prompts), 6), squeeze=False)
    for col, p in enumerate(prompts):
        for metric, ax in (("ms", axes[0][col]), ("peak_mem_gib", axes[1][col])):
            plotted = False
            oom_y = oom_marker_height(rows, p, metric)
            oom_systems = [s for s in systems if any(r["P"] == p and r["system"] == s and r["status"] == "OOM"
                                                     for r in rows)]
            for s in systems:
                pts = sorted((r["mb"], r) for r in rows if r["P"] == p and r["system"] == s)
                good = [(mb, r[metric]) for mb, r in pts if _ok(r) and r.get(metric) is not None]
                oom = [mb for mb, r in pts if r["status"] == "OOM"]
                line = ax.plot([m for m, _ in good], [v for _, v in good], marker="o", label=s)[0]
                plotted = plotted or bool(good)
                if oom:
                    # above every measured point of the panel, side by side where several systems ran out
                    shift = 2 ** (0.08 * (oom_systems.index(s) - (len(oom_systems) - 1) / 2))
                    ax.scatter([mb * shift for mb in oom], [oom_y] * len(oom), marker="x", color=line.get_color())
            ax.set_xscale("log", base=2)
            mbs = sorted({r["mb"] for r in rows if r["P"] == p})
            ax.set_xticks(mbs, [str(m) for m in mbs])
            ax.xaxis.set_minor_locator(plt.NullLocator())
            if plotted:
                ax.set_yscale("log")
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(f"P={p}" if metric == "ms" else "")
            ax.set_xlabel("mb (responses per prompt)")
            ax.set_ylabel("fwd+bwd ms" if metric == "ms" else "peak GiB")
    env = data["environment"]
    fig.suptitle(f"dualkv bench {data['benchmark']} — {env.get('gpu')} — {env.get('date')} (x = OOM)", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    png = Path(out) if out is not None else path.with_suffix(".png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (run `dualkv bench plot FILE` where it is)")
        return None
    return plt


#: The attention shape of rows written before ``dualkv bench kernel`` recorded it (Qwen3-8B's, one group, every
#: response R tokens long).
_ROW_DEFAULTS = {"groups": 1, "r_range": None, **asdict(QWEN3_8B_ATTENTION)}


def row_shape(row: dict) -> dict:
    """A ``dualkv bench kernel`` row's micro-batch and attention shape: groups, r_range (ragged responses), heads,
    kv_heads, head_dim (rows that do not say have :data:`_ROW_DEFAULTS`'s)."""
    return {key: row.get(key, default) for key, default in _ROW_DEFAULTS.items()}


def latest_kernel_rows(paths: Sequence[ResultSource], groups: int = 1, heads: int = QWEN3_8B_ATTENTION.heads,
                       kv_heads: int = QWEN3_8B_ATTENTION.kv_heads,
                       head_dim: int = QWEN3_8B_ATTENTION.head_dim,
                       r_range: str | None = None) -> tuple[list[dict], dict]:
    """Rows of ``dualkv bench kernel`` files on micro-batches of ``groups`` groups (``--groups``) at one attention
    shape (default Qwen3-8B's, the seed's Table 1; rows written before those options are single-group at that
    shape), responses of equal length unless ``r_range`` names the ragged rows' range ("LO-HI", ``--R-range``), a
    later file replacing an earlier one's (system, N, P, mode) row, and the last file's environment."""
    want = {"groups": groups, "r_range": r_range, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim}
    latest, env = {}, {}
    for _, data in _kernel_files(paths):
        env = data["environment"]
        for r in data["rows"]:
            if row_shape(r) == want:
                latest[(r["system"], r["N"], r["P"], r["mode"])] = r
    return list(latest.values()), env


def kernel_file_shape(paths: Sequence[ResultSource]) -> dict:
    """The micro-batch / attention shape (:func:`row_shape`) a figure of these ``dualkv bench kernel`` files draws:
    the default one (Table 1's) where any row has it, else the only one present; ValueError when the files hold no
    rows or several other shapes (a figure compares systems at one shape)."""
    shapes = []
    for _, data in _kernel_files(paths):
        for r in data["rows"]:
            if row_shape(r) not in shapes:
                shapes.append(row_shape(r))
    if not shapes:
        raise ValueError("these kernel files hold no rows")
    if _ROW_DEFAULTS in shapes or len(shapes) == 1:
        return dict(_ROW_DEFAULTS) if _ROW_DEFAULTS in shapes else shapes[0]
    raise ValueError(f"these kernel files hold rows of {len(shapes)} shapes ({shapes}); plot one shape's files at a "
                     "time")


def plot_kernel_results(paths: Sequence[ResultSource], out: str | Path,
                        systems: Sequence[str] | None = None) -> Path | None:
    """``dualkv bench kernel`` files (later files replace earlier rows of the same system, shape and mode): per
    (N, P), each system's fwd / bwd / fwd+bwd ms (log scale) and fwd+bwd useful TFLOP/s, as grouped bars;
    ``systems`` picks and orders the systems drawn (default: all, in file order)."""
    plt = _pyplot()
    if plt is None:
        return None
    paths = _kernel_files(paths)  # (each file read once)
    shape = kernel_file_shape(paths)
    rows, env = latest_kernel_rows(paths, **shape)
    present = list(dict.fromkeys(r["system"] for r in rows))
    if systems:
        missing = [s for s in systems if s not in present]
        if missing:
            raise ValueError(f"no rows for system(s) {missing} in these files (present: {present})")
        rows = [r for r in rows if r["system"] in systems]
    systems = list(systems or present)
    if not any(r["mode"] == "fwdbwd" and _ok(r) for r in rows):
        raise ValueError("these kernel files hold no measured fwd+bwd rows, which the figure draws (run bench kernel "
                         "with --mode including fwdbwd)")
    shapes = sorted({(r["N"], r["P"]) for r in rows}, key=lambda s: (s[1], s[0]))
    fig, axes = plt.subplots(2, 1, figsize=(max(6.0, 1.6 * len(shapes)), 7))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        x = [j + (i - (len(systems) - 1) / 2) * width for j in range(len(shapes))]
        got = {(r["N"], r["P"], r["mode"]): r for r in rows if r["system"] == system and _ok(r)}
        fb = [got.get((n, p, "fwdbwd")) for n, p in shapes]
        fwd = [got.get((n, p, "fwd")) for n, p in shapes]
        bars = axes[0].bar(x, [r["ms"] if r else 0 for r in fb], width, label=system)
        axes[0].bar(x, [r["ms"] if r else 0 for r in fwd], width, color="white", alpha=0.45)  # forward share
        axes[1].bar(x, [r["tflops"] if r and r.get("tflops") else 0 for r in fb], width,
                    color=bars.patches[0].get_facecolor() if bars.patches else None)
    labels = [f"N={n}\nP={p // 1024}K" for n, p in shapes]
    for ax in axes:
        ax.set_xticks(range(len(shapes)), labels)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("fwd+bwd ms (light: forward part)")
    axes[1].set_ylabel("fwd+bwd useful TFLOP/s")
    axes[0].legend(fontsize=7, ncol=len(systems))
    what = "" if shape == _ROW_DEFAULTS else (f"\n{shape['groups']} group(s), R {shape['r_range'] or 'equal'}, "
                                              f"H {shape['heads']} / {shape['kv_heads']}, d {shape['head_dim']}")
    fig.suptitle(f"dualkv bench kernel — {env.get('gpu')} — {env.get('date')}{what}", fontsize=9)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _plot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", help="result JSON files written by dualkv bench")
    p.add_argument("--systems", default=None,
                   help="kernel files: comma list of the systems to draw, in this order (default: all)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"a .png (when one figure is drawn) or a folder (default {DEFAULT_OUT}); figures are never "
                        "written next to the result files unless named here")


def _figure_paths(out: str, names: list[str]) -> list[Path]:
    """Where each figure goes: ``out`` itself if it is a .png (one figure only), else ``out/<name>.png``."""
    target = Path(out)
    if target.suffix == ".png":
        if len(names) != 1:
            raise SystemExit(f"--out {out} names one figure, but these files make {len(names)} "
                             "(a kernel figure over all kernel files, one per other file): give a folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        return [target]
    target.mkdir(parents=True, exist_ok=True)
    return [target / f"{name}.png" for name in names]


def _describe_merge(files: Sequence[ResultFile]) -> str:
    """What a kernel figure over several files merges: the files and the commits they were measured at."""
    commits = list(dict.fromkeys(f.data["environment"].get("commit") for f in files))
    note = f"merging {len(files)} kernel files (a later file's row replaces an earlier one's): " + ", ".join(
        Path(f.path).name for f in files)
    if len(commits) > 1:
        note += f"\nnote: measured at {len(commits)} commits ({', '.join(map(str, commits))}): the figure compares " \
                "across runs"
    return note


def _read_result(path: str) -> ResultFile:
    """One result file, read; SystemExit naming the file if it is missing, not JSON or not a bench result."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise SystemExit(f"dualkv bench plot: cannot read {path}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SystemExit(f"dualkv bench plot: {path} is not JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise SystemExit(f"dualkv bench plot: {path} is not a `dualkv bench` result (no 'rows' list)")
    return ResultFile(path, data)


def _plot_run(args: argparse.Namespace) -> int:
    try:
        return _plot_files(args)
    except ValueError as err:  # e.g. --systems naming a system without rows
        raise SystemExit(f"dualkv bench plot: {err}") from None


def _plot_files(args: argparse.Namespace) -> int:
    files = [_read_result(f) for f in args.files]  # (every file read once, here)
    kernel_files = [f for f in files if f.data.get("benchmark") == "kernel"]
    others = [f for f in files if f.data.get("benchmark") != "kernel"]
    names = ([Path(kernel_files[-1].path).stem] if kernel_files else []) + [Path(f.path).stem for f in others]
    figures = _figure_paths(args.out, names)
    if kernel_files:  # one figure for all of them (a table is often split over several runs)
        if len(kernel_files) > 1:
            print(_describe_merge(kernel_files))
        systems = args.systems.split(",") if args.systems else None
        png = plot_kernel_results(kernel_files, figures.pop(0), systems)
        if png is None:
            return 1
        print(f"plot: {png}")
    for f, png in zip(others, figures):
        print(speedup_table(f.data["rows"]))
        if plot_results(f, png) is None:
            return 1
        print(f"plot: {png}")
    return 0


register_bench("plot", "redraw the plot and table of benchmark result files", _plot_args, _plot_run)
