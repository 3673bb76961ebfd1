"""``dualkv bench kernel``: shared-prompt attention vs FA2 N-copy, FlexAttention and the stock FA2 cascade.

One process, one GPU, the same activations for every system. CUDA events around each call, warm-up, median of
repeats; useful TFLOP/s counts only the (query, key) pairs shared-prompt attention needs
(:func:`dualkv.analysis.useful_pairs`); peak memory is ``torch.cuda.max_memory_allocated`` over the system's
preparation and calls (the packed activations included). Out-of-memory is recorded as ``OOM``.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..layout import GroupLayout
from .baselines import SYSTEMS

#: The seed's Table 1 shapes (N, P) with R = 2048, Qwen3-8B attention.
TABLE1 = ((28, 4096), (28, 16384), (16, 32768), (16, 65536), (8, 8192), (4, 131072))


@dataclass
class BenchRow:
    system: str
    N: int
    P: int
    R: int
    mode: str
    ms: float | None
    tflops: float | None
    speedup_vs_fa2: float | None
    peak_mem_gib: float | None
    status: str


def cuda_time_ms(fn: Callable[[], object], *, warmup: int = 2, reps: int = 10, budget_s: float = 4.0) -> float:
    """Median milliseconds of ``fn`` over CUDA events (repeats cut short once ``budget_s`` is spent)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times: list[float] = []
    start_wall = time.perf_counter()
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        if time.perf_counter() - start_wall > budget_s and len(times) >= 3:
            break
    return statistics.median(times)


def _inputs(layout: GroupLayout, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda h: torch.randn(layout.total_tokens, h, head_dim, device="cuda", dtype=dtype, generator=gen)  # noqa
    return make(heads), make(kv_heads), make(kv_heads)


def bench_shape(N: int, P: int, R: int, systems: Sequence[str], *, heads: int = 32, kv_heads: int = 8,
                head_dim: int = 128, dtype: torch.dtype = torch.bfloat16, modes: Sequence[str] = ("fwd",),
                reps: int = 10, seed: int = 0) -> list[BenchRow]:
    from ..analysis import attention_flops, useful_pairs

    layout = GroupLayout.single(P, [R] * N)
    rows: list[BenchRow] = []
    pairs = useful_pairs(layout)
    for mode in modes:
        if mode != "fwd":
            raise NotImplementedError(f"mode {mode!r} needs the dualkv backward (not built yet)")
        for name in systems:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            status, ms, peak = "ok", None, None
            try:
                q, k, v = _inputs(layout, heads, kv_heads, head_dim, dtype, seed)
                system = SYSTEMS[name](q, k, v, layout)
                with torch.no_grad():
                    system.prepare()
                    ms = cuda_time_ms(system.forward, reps=reps)
                peak = torch.cuda.max_memory_allocated() / 2**30
            except torch.OutOfMemoryError:
                status = "OOM"
            finally:
                system = q = k = v = None  # noqa: F841
            tflops = attention_flops(pairs, heads, head_dim, mode) / (ms * 1e-3) / 1e12 if ms else None
            rows.append(BenchRow(name, N, P, R, mode, ms, tflops, None, peak, status))
    for mode in modes:
        fa2 = next((r for r in rows if r.system == "fa2_ncopy" and r.mode == mode and r.ms), None)
        for r in rows:
            if fa2 and r.mode == mode and r.ms:
                r.speedup_vs_fa2 = fa2.ms / r.ms
    return rows


def check_systems_agree(systems: Sequence[str], *, heads=8, kv_heads=2, head_dim=128, dtype=torch.bfloat16) -> dict:
    """Max |out - dualkv out| of every baseline at a small shape (they must compute the same attention)."""
    layout = GroupLayout.single(1000, [300, 129, 64])
    q, k, v = _inputs(layout, heads, kv_heads, head_dim, dtype, 1)
    outs = {}
    with torch.no_grad():
        for name in systems:
            system = SYSTEMS[name](q, k, v, layout)
            system.prepare()
            outs[name] = system.to_packed(system.forward()).float()
    ref = outs.get("dualkv")
    return {name: (out - ref).abs().max().item() for name, out in outs.items()} if ref is not None else {}


def environment() -> dict:
    from ..verify.report import environment as env

    info = env()
    info["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return info


def write_results(rows: Sequence[BenchRow], path: str | Path, extra: dict | None = None) -> Path:
    payload = {"environment": environment(), "benchmark": "kernel", "rows": [asdict(r) for r in rows]}
    payload.update(extra or {})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    return path


def format_rows(rows: Sequence[BenchRow]) -> str:
    lines = [f"{'system':<10} {'N':>3} {'P':>7} {'mode':<6} {'ms':>9} {'TFLOP/s':>8} {'x FA2':>6} {'GiB':>6}"]
    for r in rows:
        ms = f"{r.ms:9.2f}" if r.ms else f"{r.status:>9}"
        tf = f"{r.tflops:8.1f}" if r.tflops else f"{'-':>8}"
        sp = f"{r.speedup_vs_fa2:6.2f}" if r.speedup_vs_fa2 else f"{'-':>6}"
        mem = f"{r.peak_mem_gib:6.1f}" if r.peak_mem_gib else f"{'-':>6}"
        lines.append(f"{r.system:<10} {r.N:>3} {r.P:>7} {r.mode:<6} {ms} {tf} {sp} {mem}")
    return "\n".join(lines)
