"""Readers for benchmark result files (``experiments/results/*.json``) and the prediction-vs-measurement table.

A result file is ``{"environment": {...}, "benchmark": "kernel"|"layer"|"model"|"policy_update", "rows": [...]}``;
a row holds ``system``, ``N``, ``P``, ``R`` (an int or the list of R_i; :mod:`dualkv.bench.harness` writes the list
as ``R_list``), ``mb``, ``mode``, ``ms``, ``tflops``, ``peak_mem_gib`` and ``status`` ("ok" or "OOM"); kernel rows
may name their head geometry (``heads``, ``kv_heads``, ``head_dim``). The readers are tolerant: missing keys
become ``None``, OOM rows are kept (status "OOM", no time), rows that are not objects are skipped with a warning,
and unreadable files in a directory are skipped with a warning. Nothing here invents a number: a missing
measurement stays ``None``.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ..layout import GroupLayout
from .models import QWEN3_8B_ATTENTION, step_speedup_bounds
from .pairs import attention_flops, n_copy_pairs, useful_pairs
from .tokens import micro_batch_layouts

__all__ = [
    "ResultRow",
    "read_result_file",
    "load_results",
    "default_results_dir",
    "row_layout",
    "compare",
    "format_table",
    "BASELINE_SYSTEM",
]

#: The system every other one is compared against.
BASELINE_SYSTEM = "fa2_ncopy"

#: Environment variable naming the results directory (overrides the search for ``experiments/results``).
RESULTS_ENV = "DUALKV_RESULTS_DIR"


@dataclass(frozen=True)
class ResultRow:
    """One measured configuration. ``R`` is the mean response length (``R_list`` holds the R_i when given);
    ``ms`` milliseconds, ``tflops`` TFLOP/s as the writer counted them, ``peak_mem_gib`` GiB."""

    benchmark: str | None
    system: str | None
    N: int | None
    P: int | None
    R: float | None
    mb: int | None
    mode: str | None
    ms: float | None
    tflops: float | None
    peak_mem_gib: float | None
    status: str
    source: str = ""
    R_list: tuple[int, ...] | None = None
    gpu: str | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _int(value: object) -> int | None:
    out = _number(value)
    return int(out) if out is not None and out == int(out) else None


def _status(row: dict, ms: float | None, peak: float | None) -> str:
    raw = row.get("status")
    if raw is None:
        if any(str(row.get(k, "")).upper() == "OOM" for k in ("ms", "peak_mem_gib")):
            return "OOM"
        return "ok" if ms is not None or peak is not None else "missing"
    text = str(raw).strip()
    return "OOM" if text.upper() == "OOM" else text.lower()


_KNOWN = {"benchmark", "system", "N", "P", "R", "R_list", "mb", "mode", "ms", "tflops", "peak_mem_gib", "status"}


def _row(raw: dict, benchmark: str | None, source: str, gpu: str | None) -> ResultRow:
    r_value = raw.get("R") if raw.get("R") is not None else raw.get("R_list")
    r_list = None
    if isinstance(r_value, (list, tuple)):
        lens = [_int(x) for x in r_value]
        # an unreadable or non-positive entry: no R at all (dropping it would invent another batch)
        r_list = tuple(lens) if lens and None not in lens and min(lens) >= 1 else None
        r_mean = sum(r_list) / len(r_list) if r_list else None
    else:
        r_mean = _number(r_value)
    ms = _number(raw.get("ms"))
    peak = _number(raw.get("peak_mem_gib"))
    status = _status(raw, ms, peak)
    if status == "OOM":
        ms = None
    return ResultRow(benchmark=raw.get("benchmark", benchmark), system=raw.get("system"), N=_int(raw.get("N")),
                     P=_int(raw.get("P")), R=r_mean, mb=_int(raw.get("mb")), mode=raw.get("mode"), ms=ms,
                     tflops=_number(raw.get("tflops")), peak_mem_gib=peak, status=status, source=source,
                     R_list=r_list, gpu=gpu, extra={k: v for k, v in raw.items() if k not in _KNOWN})


def read_result_file(path: "str | Path") -> list[ResultRow]:
    """All rows of one result file (OOM rows included). Raises ``ValueError`` naming the file if it is not JSON
    or has no list of rows."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable JSON result file ({err})") from None
    if isinstance(doc, list):
        doc = {"rows": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError(f"{path}: a result file is an object with a list 'rows'")
    env = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
    gpu = env.get("gpu")
    rows = []
    for i, raw in enumerate(doc["rows"]):
        if not isinstance(raw, dict):
            warnings.warn(f"{path}: row {i} is not an object; skipped", stacklevel=2)
            continue
        rows.append(_row(raw, doc.get("benchmark"), str(path), gpu))
    return rows


def default_results_dir() -> Path | None:
    """``$DUALKV_RESULTS_DIR`` if set, else the nearest ``experiments/results`` above the working directory or
    above this package (a source checkout); ``None`` if there is none."""
    env = os.environ.get(RESULTS_ENV)
    if env:
        return Path(env)
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            candidate = folder / "experiments" / "results"
            if candidate.is_dir():
                return candidate
    return None


def load_results(path: "str | Path | None" = None, benchmark: str | None = None,
                 system: str | None = None) -> list[ResultRow]:
    """Rows of every ``*.json`` result file in a directory (or of one file), optionally only one benchmark or
    system. ``path=None``: :func:`default_results_dir`; no directory means no rows (an empty list)."""
    if path is None:
        path = default_results_dir()
        if path is None:
            return []
    path = Path(path)
    if path.is_file():
        rows = read_result_file(path)
    elif path.is_dir():
        rows = []
        for file in sorted(path.glob("*.json")):
            try:
                rows.extend(read_result_file(file))
            except ValueError as err:
                warnings.warn(f"skipped {err}", stacklevel=2)
    else:
        return []
    return [r for r in rows if (benchmark is None or r.benchmark == benchmark)
            and (system is None or r.system == system)]


def row_layout(row: ResultRow) -> GroupLayout | None:
    """The packed micro-batch a row measured: N responses of one prompt (the R_i if listed), or, with ``mb``,
    the first micro-batch of ``mb`` rows cut from prompt groups of N; ``None`` if N, P or R is missing."""
    if row.P is None or row.P < 1:
        return None
    if row.R_list:
        lens = list(row.R_list)
    elif row.N is not None and row.R is not None and row.N >= 1 and row.R >= 1:
        lens = [int(round(row.R))] * row.N
    else:
        return None
    if row.mb is None or row.mb < 1:
        return GroupLayout.single(row.P, lens)
    prompts = -(-row.mb // len(lens))
    return micro_batch_layouts(len(lens), row.P, lens, row.mb, prompts)[0]


def _heads(row: ResultRow, heads: int, head_dim: int) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim) a row names, each defaulting to ``heads`` / Qwen3-8B's KV heads / ``head_dim``."""
    named = [_int(row.extra.get(k)) for k in ("heads", "kv_heads", "head_dim")]
    return tuple(v if v is not None and v >= 1 else d
                 for v, d in zip(named, (heads, QWEN3_8B_ATTENTION.kv_heads, head_dim)))


def _key(row: ResultRow, heads: tuple[int, int, int]) -> tuple:
    """What a row measured: benchmark, mode, head geometry and the packed micro-batch (so mb = N and a missing mb
    match)."""
    layout = row_layout(row)
    shape = (layout.prompt_lens, layout.response_lens) if layout else (row.N, row.P, row.R_list or row.R, row.mb)
    return (row.benchmark, row.mode, heads, shape)


def compare(rows: Iterable[ResultRow], model: str = "qwen3-8b", heads: int = QWEN3_8B_ATTENTION.heads,
            head_dim: int = QWEN3_8B_ATTENTION.head_dim, baseline: str = BASELINE_SYSTEM) -> list[dict]:
    """One entry per (benchmark, N, P, R, mb, mode, head geometry) and non-baseline system: measured speedup over
    ``baseline`` (a row of the same configuration and head geometry) next to the prediction.

    Prediction: kernel rows, the exact causal attention-pair ratio; layer/model/policy_update rows, the
    whole-model FLOP ratio of ``model`` (:func:`step_speedup_bounds`). ``useful_tflops``: attention FLOPs of the
    useful pairs per measured second (kernel rows only), over the row's own ``heads`` x ``head_dim`` (``heads`` and
    ``head_dim`` here for rows that do not name theirs). OOM rows keep their status; their measured speedup is
    ``None``.
    """
    by_key: dict[tuple, dict[str, ResultRow]] = {}
    for row in rows:
        if row.system:
            by_key.setdefault(_key(row, _heads(row, heads, head_dim)), {})[row.system] = row
    out = []
    for key, systems in by_key.items():
        row_heads, row_kv_heads, row_head_dim = key[2]
        base = systems.get(baseline)
        for name, row in sorted(systems.items()):
            if name == baseline:
                continue
            layout = row_layout(row)
            mode = row.mode if row.mode in ("fwd", "bwd", "fwdbwd") else "fwdbwd"
            predicted = useful = None
            if layout is not None:
                if row.benchmark == "kernel":
                    predicted = n_copy_pairs(layout) / useful_pairs(layout)
                    if row.ms:
                        useful = (attention_flops(useful_pairs(layout), row_heads, row_head_dim, mode)
                                  / (row.ms * 1e-3) / 1e12)
                else:
                    predicted = step_speedup_bounds(model, layout, mode)["flop_ratio"]
            measured = base.ms / row.ms if base is not None and base.ms and row.ms else None
            out.append({"benchmark": row.benchmark, "system": name, "N": row.N, "P": row.P, "R": row.R,
                        "mb": row.mb, "responses_per_group": layout.group_sizes[0] if layout else None,
                        "mode": row.mode,
                        "heads": row_heads, "kv_heads": row_kv_heads, "head_dim": row_head_dim,
                        "ms": row.ms, "ms_baseline": base.ms if base else None,
                        "status": row.status, "status_baseline": base.status if base else "missing",
                        "speedup_measured": measured, "speedup_predicted": predicted,
                        "efficiency": measured / predicted if measured and predicted else None,
                        "useful_tflops": useful, "peak_mem_gib": row.peak_mem_gib,
                        "peak_mem_gib_baseline": base.peak_mem_gib if base else None, "gpu": row.gpu})
    out.sort(key=lambda e: tuple(str(e[k]) for k in ("benchmark", "system", "mode")) + (e["N"] or 0, e["P"] or 0))
    return out


def format_table(entries: list[dict], columns: list[str] | None = None) -> str:
    """A fixed-width text table of dicts (whole floats as integers, others to 4 significant digits, ``None`` as
    "-")."""
    if not entries:
        return "(no rows)"
    columns = columns or list(entries[0])

    def cell(v: object) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.0f}" if v.is_integer() and abs(v) < 1e7 else f"{v:.4g}"
        return str(v)

    table = [columns] + [[cell(e.get(c)) for c in columns] for e in entries]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
