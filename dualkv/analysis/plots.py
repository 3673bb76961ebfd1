"""Plots of the models, with measured points overlaid when result files exist.

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot (no global state, no display
needed); :func:`write_plots` saves the three as PNG files. Measured points come from
:func:`dualkv.analysis.results.load_results` rows; with none, the plots show the predictions alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from .memory import PAPER_LLAMA31_8B_LAW, MemoryLaw, fit_memory_law, memory_rows
from .models import step_speedup_bounds
from .pairs import attn_speedup_pairs, attn_speedup_theory
from .results import ResultRow, compare, load_results
from .tokens import group_layout, rho_equal, rho_limit_many_responses

__all__ = ["fig_rho", "fig_speedup", "fig_memory", "write_plots", "memory_law_for", "PAPER_SCENARIOS",
           "MEMORY_BENCHMARKS"]

#: (N, P, R) of the paper's "Token Reduction Ratio" scenario table.
PAPER_SCENARIOS = ((8, 2048, 2048), (8, 16384, 2048), (8, 65536, 512), (16, 16384, 2048), (32, 4096, 2048),
                   (32, 16384, 2048), (16, 32768, 2048), (16, 65536, 512))

_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")


def fig_rho(n_max: int = 128, ratio_range: tuple[float, float] = (0.05, 200.0)) -> Figure:
    """rho over (N, P/R): a filled contour map with the paper's scenarios marked, and rho against N for several
    P/R with each curve's N -> infinity ceiling 1 + P/R."""
    fig = Figure(figsize=(12, 5), layout="constrained")
    ax, ax2 = fig.subplots(1, 2)
    n = np.geomspace(1, n_max, 200)
    ratio = np.geomspace(*ratio_range, 200)
    nn, rr = np.meshgrid(n, ratio)
    z = rho_equal(nn, rr, 1.0)
    levels = np.geomspace(1, z.max(), 15)
    cs = ax.contourf(nn, rr, z, levels=levels, cmap="viridis")
    lines = ax.contour(nn, rr, z, levels=[1.5, 2, 3, 5, 8, 12, 20, 32, 64], colors="white", linewidths=0.7)
    ax.clabel(lines, fmt=lambda v: f"{v:g}×", fontsize=8)
    fig.colorbar(cs, ax=ax, label="ρ = T_std / T_dk  (token reduction, ×)", format="%.3g")
    for N, P, R in PAPER_SCENARIOS:
        ax.plot(N, P / R, "o", color="red", markersize=5, markeredgecolor="white")
        ax.annotate(f"{rho_equal(N, P, R):.1f}", (N, P / R), textcoords="offset points", xytext=(5, 4),
                    fontsize=8, color="white")
    ax.plot([], [], "o", color="red", label="paper's scenario table (ρ printed)")
    ax.set(xscale="log", yscale="log", xlabel="N (responses per prompt)", ylabel="P / R (prompt / response length)",
           title="Token reduction ratio ρ = N(P+R) / (P+NR)")
    ax.legend(loc="lower right", fontsize=8)

    for i, pr in enumerate((0.5, 2, 8, 32, 128)):
        color = _COLORS[i]
        ax2.plot(n, rho_equal(n, pr, 1.0), color=color, label=f"P/R = {pr:g}")
        ax2.axhline(rho_limit_many_responses(pr, 1.0), color=color, linestyle=":", linewidth=0.9)
    ax2.plot(n, n, color="gray", linestyle="--", linewidth=0.9, label="ρ = N (limit P → ∞)")
    ax2.plot([], [], color="black", linestyle=":", linewidth=0.9, label="1 + P/R (limit N → ∞)")
    ax2.set(xscale="log", yscale="log", xlabel="N (responses per prompt)", ylabel="ρ (×)",
            title="ρ against N: saturates at 1 + P/R", ylim=(0.9, 300))
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8)
    return fig


def _common_r(rows: Sequence[dict], default: int) -> int:
    values = [int(round(e["R"])) for e in rows if e.get("R")]
    return Counter(values).most_common(1)[0][0] if values else default


def fig_speedup(results: Sequence[ResultRow] = (), N_values: Sequence[int] = (4, 8, 16, 32), R: int | None = None,
                model: str = "qwen3-8b", P_range: tuple[int, int] = (1024, 262144)) -> Figure:
    """Predicted speedup against prompt length for several N: attention alone (exact causal pair ratio, and the
    paper's closed form) and the whole model's FLOP ratio with rho. Measured speedups over the N-copy baseline
    (``results``: kernel rows on the left, layer/model/policy_update rows on the right) are overlaid as markers
    where their R matches the plotted R (default: the most common measured R, else 2048), coloured by the
    responses per prompt group in the measured micro-batch (gray: an N not plotted)."""
    entries = [e for e in compare(results, model=model) if e["speedup_measured"] and e["mode"] in (None, "fwdbwd")]
    R = R or _common_r(entries, 2048)
    P = np.unique(np.geomspace(*P_range, 40).astype(int))
    fig = Figure(figsize=(12, 5), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, sharey=True)
    ax2.yaxis.set_tick_params(labelleft=True)
    for i, N in enumerate(N_values):
        c = _COLORS[i % len(_COLORS)]
        ax.plot(P, [attn_speedup_pairs(N, int(p), R) for p in P], color=c, label=f"N = {N}")
        ax.plot(P, attn_speedup_theory(N, P, R), color=c, linestyle="--", linewidth=0.9)
        flop = [step_speedup_bounds(model, group_layout(N, int(p), R))["flop_ratio"] for p in P]
        ax2.plot(P, flop, color=c, label=f"N = {N}")
        ax2.plot(P, rho_equal(N, P, R), color=c, linestyle=":", linewidth=0.9)
    ax.plot([], [], color="black", linestyle="--", linewidth=0.9, label="paper formula N(P+R)²/(P²+NR(P+R))")
    ax2.plot([], [], color="black", linestyle=":", linewidth=0.9, label="ρ (per-token ops)")
    for target, kinds in ((ax, ("kernel",)), (ax2, ("layer", "model", "policy_update"))):
        shown = False
        for e in entries:
            if e["benchmark"] not in kinds or e["R"] is None or abs(e["R"] - R) > 0.5 or e["P"] is None:
                continue
            n = e["responses_per_group"]
            color = _COLORS[list(N_values).index(n) % len(_COLORS)] if n in N_values else "gray"
            target.plot(e["P"], e["speedup_measured"], marker="o" if e["system"] == "dualkv" else "^",
                        color=color, markeredgecolor="black", linestyle="none")
            shown = True
        if shown:
            target.plot([], [], "o", color="white", markeredgecolor="black", label="measured dualkv (fwd+bwd)")
            target.plot([], [], "^", color="white", markeredgecolor="black", label="measured other system")
    ax.set(xscale="log", yscale="log", xlabel="prompt length P (tokens)", ylabel="speedup over N-copy (×)",
           title=f"Attention fwd+bwd: exact causal pair ratio (R = {R})")
    ax2.set(xscale="log", xlabel="prompt length P (tokens)", ylabel="FLOP ratio / measured speedup (×)",
            title=f"Whole model ({model}) FLOP ratio, fwd+bwd (R = {R})")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    return fig


#: Benchmarks whose peak memory is a training step's (or a layer's), in order of preference for the memory law.
MEMORY_BENCHMARKS = ("policy_update", "model", "layer")


def memory_law_for(results: Sequence[ResultRow] = ()) -> tuple[MemoryLaw, list[dict]]:
    """The memory law fitted to the measured dualkv rows of the first benchmark in :data:`MEMORY_BENCHMARKS` whose
    rows determine one, with those rows; else the paper's published fit and no rows."""
    for benchmark in MEMORY_BENCHMARKS:
        rows = memory_rows(results, benchmark=benchmark)
        try:
            law = fit_memory_law(rows)
        except ValueError:
            continue
        return replace(law, source=f"fit to measured {benchmark} rows"), rows
    return PAPER_LLAMA31_8B_LAW, []


def fig_memory(results: Sequence[ResultRow] = (), law: MemoryLaw | None = None, mb_values: Sequence[int] = (4, 8, 16),
               R: int = 2048, P_range: tuple[int, int] = (8192, 98304), capacity: float | None = 80.0) -> Figure:
    """Peak memory against prompt length for several micro-batch sizes: dualkv's law ``M0 + c_P*P + c_mbR*mb*R``
    (solid) and the N-copy projection ``M0 + c_P*mb*(P+R)`` (dashed), measured dualkv points overlaid.
    ``law`` defaults to :func:`memory_law_for` the results; ``capacity`` draws one device's memory (in the law's
    unit)."""
    fitted, measured = memory_law_for(results)
    law = law or fitted
    P = np.linspace(*P_range, 100)
    fig = Figure(figsize=(12, 6), layout="constrained")
    ax, ax2 = fig.subplots(1, 2)
    for i, mb in enumerate(mb_values):
        c = _COLORS[i % len(_COLORS)]
        for a in (ax, ax2):
            a.plot(P / 1024, law.predict(P, mb, R), color=c, label=f"dualkv mb = {mb}")
            a.plot(P / 1024, law.fa2_projection(P, mb, R), color=c, linestyle="--", label=f"N-copy projection mb = {mb}")
        pts = [m for m in measured if m["mb"] == mb and abs(m["R"] - R) < 0.5]
        if pts:
            ax.plot([m["P"] / 1024 for m in pts], [m["peak_mem_gib"] for m in pts], "o", color=c,
                    markeredgecolor="black", label=f"measured dualkv mb = {mb}")
    if capacity:
        for a in (ax, ax2):
            a.axhline(capacity, color="black", linewidth=0.8, linestyle="-.", label=f"{capacity:g} {law.unit} device")
    fit = f"r² = {law.r2:.3f}, {law.n} rows" if law.n else "no fit statistics"
    ax.set(xlabel="prompt length P (K tokens, 1K = 1024)", ylabel=f"peak memory ({law.unit})",
           title=f"Peak memory, R = {R} — {law.source} ({fit})")
    ax2.set(xlabel="prompt length P (K tokens, 1K = 1024)", ylabel=f"peak memory ({law.unit}, log scale)",
            yscale="log", title="Same, log scale: dualkv's mb curves stay together")
    for a in (ax, ax2):
        a.grid(True, alpha=0.3)
    ax.set_ylim(0, max(2 * capacity if capacity else 0, float(law.predict(P_range[1], max(mb_values), R)) * 1.3))
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=len(mb_values) + 1, fontsize=8)
    return fig


def write_plots(outdir: "str | Path", results_dir: "str | Path | None" = None, model: str = "qwen3-8b") -> list[Path]:
    """Write ``rho.png``, ``speedup.png`` and ``memory.png`` to ``outdir`` (created), overlaying the rows of the
    result files in ``results_dir`` (default: :func:`~dualkv.analysis.results.default_results_dir`)."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    results = load_results(results_dir)
    paths = []
    for name, fig in (("rho", fig_rho()), ("speedup", fig_speedup(results, model=model)),
                      ("memory", fig_memory(results))):
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths
