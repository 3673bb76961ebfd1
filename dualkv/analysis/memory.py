"""Memory models: per-layer kernel savings, activation memory, and the peak-memory scaling law.

* Kernel level (appendix "Memory Savings"): per layer an N-copy attention call holds N copies of the prompt's
  K and V, of Q at prompt positions and of the prompt rows' softmax LSE; dualkv holds one. Savings per layer:
  ``2*(N-1)*P*Hk*d*b`` (K_c, V_c), ``(N-1)*P*H*d*b`` (Q), ``(N-1)*P*H*4`` (fp32 LSE), b bytes per element.
* Activations: every stored per-token activation scales with the token count (``T_std`` vs ``T_dk``); under
  gradient checkpointing the layer-boundary hidden states, ``layers * D * b`` bytes per token, are the floor.
* Peak memory of a training step (appendix "Context-Length Scaling Sweep"): dualkv follows
  ``M0 + c_P*P + c_mbR*mb*R``; the N-copy layout is projected as ``M0 + c_P*mb*(P+R)``. :func:`fit_memory_law`
  fits the law by least squares to measured rows (P, mb, R, peak).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from .._checks import check_int
from .models import ModelConfig, load_model

__all__ = [
    "kernel_memory_savings",
    "model_kernel_memory_savings",
    "checkpoint_bytes_per_token",
    "activation_memory",
    "MemoryLaw",
    "fit_memory_law",
    "read_memory_rows",
    "memory_rows",
    "PAPER_LLAMA31_8B_LAW",
]


def kernel_memory_savings(N: int, P: int, heads: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2,
                          lse_bytes: int = 4, k_eq_v: bool = False) -> dict[str, int]:
    """Bytes one attention layer saves by holding the prompt once instead of N times.

    Returns ``{"kv", "q", "lse", "total"}`` in bytes. ``k_eq_v``: K and V are one tensor (counted once).
    """
    n = check_int(N, "N", 1)
    p = check_int(P, "P", 1)
    h = check_int(heads, "heads", 1)
    hk = check_int(kv_heads, "kv_heads", 1)
    d = check_int(head_dim, "head_dim", 1)
    b = check_int(dtype_bytes, "dtype_bytes", 1)
    lb = check_int(lse_bytes, "lse_bytes", 1)
    kv = (1 if k_eq_v else 2) * (n - 1) * p * hk * d * b
    q = (n - 1) * p * h * d * b
    lse = (n - 1) * p * h * lb
    return {"kv": kv, "q": q, "lse": lse, "total": kv + q + lse}


def model_kernel_memory_savings(model: "str | ModelConfig", N: int, P: int, dtype_bytes: int = 2) -> dict[str, int]:
    """:func:`kernel_memory_savings` of the largest layer (``"per_layer"``; every layer when they are alike) and
    summed over all layers (``"all_layers"``), bytes."""
    cfg = load_model(model)
    per = [kernel_memory_savings(N, P, layer.heads, layer.kv_heads, layer.head_dim, dtype_bytes,
                                 k_eq_v=layer.k_eq_v)["total"] for layer in cfg.layers]
    return {"per_layer": max(per), "all_layers": sum(per)}


def checkpoint_bytes_per_token(model: "str | ModelConfig", dtype_bytes: int = 2) -> int:
    """Bytes per token kept at layer boundaries under gradient checkpointing: ``layers * hidden_size * b``."""
    cfg = load_model(model)
    return cfg.num_layers * cfg.hidden_size * check_int(dtype_bytes, "dtype_bytes", 1)


def activation_memory(tokens: int, bytes_per_token: float) -> float:
    """Activation bytes of a micro-batch: proportional to its token count."""
    if bytes_per_token < 0:
        raise ValueError(f"bytes_per_token = {bytes_per_token}: must be >= 0")
    return check_int(tokens, "tokens", 0) * float(bytes_per_token)


@dataclass(frozen=True)
class MemoryLaw:
    """``peak = M0 + c_P*P + c_mbR*mb*R`` (dualkv) in ``unit`` (e.g. GiB); coefficients per token.

    ``r2`` and ``n`` describe the fit (``n`` rows); ``source`` says where the coefficients come from.
    """

    M0: float
    c_P: float
    c_mbR: float
    r2: float = float("nan")
    n: int = 0
    unit: str = "GiB"
    source: str = "fit"

    def predict(self, P, mb, R):
        """dualkv peak memory (``unit``) for prompt length P, micro-batch size mb and response length R (tokens);
        numpy arrays broadcast."""
        return self.M0 + self.c_P * np.asarray(P, float) + self.c_mbR * np.asarray(mb, float) * np.asarray(R, float)

    def fa2_projection(self, P, mb, R):
        """The N-copy (FA2) projection ``M0 + c_P*mb*(P+R)``: every row carries its own prompt copy."""
        return self.M0 + self.c_P * np.asarray(mb, float) * (np.asarray(P, float) + np.asarray(R, float))


#: The paper's published fit (Llama-3.1-8B, N=32, R=2048, 16xH100, veRL + gradient checkpointing):
#: M0 = 41.1 GB, c_P = 0.475 GB per 1K tokens, c_mbR = 0.122 GB per 1K tokens, r^2 = 0.989, 18 rows. The paper
#: writes "GB/Ktoken"; K is taken as 1024 tokens (its P grid 8K..96K is in units of 1024).
PAPER_LLAMA31_8B_LAW = MemoryLaw(M0=41.1, c_P=0.475 / 1024, c_mbR=0.122 / 1024, r2=0.989, n=18, unit="GB",
                                 source="paper's fit (Llama-3.1-8B)")


def fit_memory_law(rows: Iterable, unit: str = "GiB") -> MemoryLaw:
    """Least-squares fit of ``M0 + c_P*P + c_mbR*mb*R`` to rows of (P, mb, R, peak).

    ``rows``: tuples ``(P, mb, R, peak)`` or mappings with those keys (``peak_mem_gib`` also accepted); rows with
    a missing or non-finite peak are skipped. Needs 3 or more rows whose P and mb*R vary independently.
    """
    data = [_memory_row(row, i) for i, row in enumerate(rows)]
    data = [r for r in data if r is not None]
    if len(data) < 3:
        raise ValueError(f"fit_memory_law needs at least 3 rows with a peak memory, got {len(data)}")
    arr = np.asarray(data, dtype=float)
    design = np.column_stack([np.ones(len(arr)), arr[:, 0], arr[:, 1] * arr[:, 2]])
    if np.linalg.matrix_rank(design) < 3:
        raise ValueError("fit_memory_law: the rows do not vary P and mb*R independently (rank-deficient design); "
                         "measure at least two prompt lengths and two values of mb*R")
    peak = arr[:, 3]
    coef, *_ = np.linalg.lstsq(design, peak, rcond=None)
    residual = peak - design @ coef
    ss_tot = float(np.sum((peak - peak.mean()) ** 2))
    r2 = 1.0 - float(np.sum(residual ** 2)) / ss_tot if ss_tot > 0 else 1.0
    return MemoryLaw(M0=float(coef[0]), c_P=float(coef[1]), c_mbR=float(coef[2]), r2=r2, n=len(arr), unit=unit)


_PEAK_KEYS = ("peak", "peak_mem_gib", "peak_mem", "mem")


def _memory_row(row: object, index: int) -> tuple[float, float, float, float] | None:
    if isinstance(row, Mapping):
        lower = {str(k).lower(): v for k, v in row.items()}
        try:
            values = [lower["p"], lower["mb"], lower["r"]]
        except KeyError as err:
            raise ValueError(f"memory row {index} has no {err.args[0]!r} column: {dict(row)}") from None
        peak = next((lower[k] for k in _PEAK_KEYS if k in lower), None)
        values.append(peak)
    elif isinstance(row, Sequence) and not isinstance(row, (str, bytes)) and len(row) == 4:
        values = list(row)
    else:
        raise ValueError(f"memory row {index} must be (P, mb, R, peak) or a mapping with those keys, got {row!r}")
    if values[3] in (None, "") or str(values[3]).upper() == "OOM":
        return None
    try:
        p, mb, r, peak = (float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"memory row {index} has a non-numeric entry: {values}") from None
    if not np.isfinite(peak):
        return None
    for name, v in (("P", p), ("mb", mb), ("R", r)):
        if not v >= 1:
            raise ValueError(f"memory row {index}: {name} = {v:g} must be >= 1")
    return p, mb, r, peak


def read_memory_rows(path: "str | Path", system: str = "dualkv") -> list[dict]:
    """Rows ``{"P", "mb", "R", "peak_mem_gib"}`` from a CSV file (header with P, mb, R and a peak column) or a
    JSON file (a benchmark result file — rows of ``system`` with status "ok" — or a list of row objects)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no memory measurement file at {path}")
    if path.suffix.lower() == ".csv":
        with path.open(newline="") as fh:
            raw = list(csv.DictReader(fh))
    elif path.suffix.lower() == ".json":
        from .results import read_result_file

        return memory_rows(read_result_file(path), system)
    else:
        raise ValueError(f"{path}: memory rows must be .csv or .json, not {path.suffix!r}")
    out = []
    for i, row in enumerate(raw):
        parsed = _memory_row(row, i)
        if parsed is not None:
            out.append(dict(zip(("P", "mb", "R", "peak_mem_gib"), parsed)))
    return out


def memory_rows(results: Iterable, system: str = "dualkv", benchmark: str | None = None) -> list[dict]:
    """``{"P", "mb", "R", "peak_mem_gib"}`` of the measured rows (:class:`~dualkv.analysis.results.ResultRow`) of
    ``system`` (rows naming no system count as it) and, if given, ``benchmark``, with status "ok" and a peak
    memory. ``mb`` defaults to N (one group per micro-batch); ``R`` is the mean response length. Rows that name a
    ``phase`` (a policy_update file: one row per phase, each with that phase's own peak) give one row per
    configuration: the step's peak, the largest over its phases (none if a phase is not "ok" or has no peak)."""
    out: list[dict] = []
    steps: dict[tuple, list[dict | None]] = {}   # a configuration's phase rows (None: not "ok" or no peak)
    for r in results:
        if (r.system or system) != system or r.P is None or r.R is None:
            continue
        if benchmark is not None and r.benchmark != benchmark:
            continue
        mb = r.mb if r.mb is not None else r.N
        if mb is None:
            continue
        ok = r.ok and r.peak_mem_gib is not None
        row = {"P": float(r.P), "mb": float(mb), "R": float(r.R), "peak_mem_gib": r.peak_mem_gib} if ok else None
        if r.extra.get("phase") is not None:
            steps.setdefault((r.source, r.benchmark, r.N, r.P, r.R_list or r.R, mb), []).append(row)
        elif row is not None:
            out.append(row)
    for phases in steps.values():
        if all(phase is not None for phase in phases):
            out.append(max(phases, key=lambda x: x["peak_mem_gib"]))
    return out
