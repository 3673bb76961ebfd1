"""Plots and tables derived from benchmark result files (never hand-entered numbers).

``dualkv bench plot FILE.json ...`` redraws the PNG next to each file (e.g. on a machine with matplotlib when the
GPU machine has none).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

from . import register_bench

__all__ = ["plot_results", "speedup_table"]

REFERENCE_SYSTEM = "dualkv"


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


def plot_results(path: str | Path) -> Path | None:
    """Draw time and peak memory per (P, mb) and system next to the JSON file; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (run `dualkv bench plot FILE` where it is)")
        return None
    path = Path(path)
    data = json.loads(path.read_text())
    rows = data["rows"]
    prompts = sorted({r["P"] for r in rows})
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, axes = plt.subplots(2, len(prompts), figsize=(3.2 * len(prompts), 6), squeeze=False)
    for col, p in enumerate(prompts):
        for metric, ax in (("ms", axes[0][col]), ("peak_mem_gib", axes[1][col])):
            plotted = False
            for s in systems:
                pts = sorted((r["mb"], r) for r in rows if r["P"] == p and r["system"] == s)
                good = [(mb, r[metric]) for mb, r in pts if _ok(r) and r.get(metric) is not None]
                oom = [mb for mb, r in pts if r["status"] == "OOM"]
                line = ax.plot([m for m, _ in good], [v for _, v in good], marker="o", label=s)[0]
                plotted = plotted or bool(good)
                if oom:
                    top = max([v for _, v in good], default=1.0)
                    ax.scatter(oom, [top * 1.3] * len(oom), marker="x", color=line.get_color())
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
    png = path.with_suffix(".png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _plot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", help="result JSON files written by dualkv bench")


def _plot_run(args: argparse.Namespace) -> int:
    for f in args.files:
        rows = json.loads(Path(f).read_text())["rows"]
        print(speedup_table(rows))
        png = plot_results(f)
        if png is None:
            return 1
        print(f"plot: {png}")
    return 0


register_bench("plot", "redraw the plot and table of benchmark result files", _plot_args, _plot_run)
