"""What every dualkv benchmark shares: the sweep arguments, response-length sampling, timing with CUDA events,
peak memory, out-of-memory rows, and the JSON result file.

Result file (one per run, ``experiments/results/<benchmark>-<device>-<UTC time>.json``, rewritten after every row
so a killed run keeps what it measured)::

    {"environment": {"gpu", "date", "commit", "torch", "cuda", ...},
     "benchmark": "layer" | "model" | ...,
     "config": {...what was run...},
     "rows": [{"system", "P", "mb", "R_list", "R_total", "tokens", "ms", "ms_min", "ms_max", "ms_runs", "peak_mem_gib",
               "status"}, ...]}

``status`` is ``"ok"``, ``"OOM"`` (``torch.OutOfMemoryError`` anywhere in the row), ``"skipped"`` (time budget)
or ``"error"`` (with ``"error"`` holding the message). ``ms`` is the median of the timed runs (CUDA events on a
GPU, ``perf_counter`` on a CPU), ``ms_min`` / ``ms_max`` their spread (as ``dualkv bench kernel`` reports it); ``peak_mem_gib`` is ``torch.cuda.max_memory_allocated`` over the timed runs after a
reset (null on a CPU).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Sequence

import numpy as np
import torch

from .._provenance import git_commit

__all__ = ["RunRecorder", "Timing", "add_sweep_arguments", "environment", "measure", "parse_dtype",
           "resolve_sweep", "run_sweep", "sample_response_lens", "smoke_threads", "sweep_command", "sweep_config",
           "sweep_configs",
           "synthetic_packed"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}

#: The paper's appendix sweep (Table "Comparison with Prefix Grouper").
PAPER_P = (5059, 8192, 16384, 32768, 65536)
PAPER_MB = (4, 8, 16, 32)
PAPER_EXTRA = ((131072, 8),)


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise argparse.ArgumentTypeError(f"dtype must be one of {', '.join(DTYPES)}; got {name!r}") from None


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers; got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers; got {text!r}")
    return values


def _pairs(text: str) -> list[tuple[int, int]]:
    """'131072x8,65536x16' -> [(131072, 8), (65536, 16)]."""
    out = []
    for item in (x for x in text.split(",") if x.strip()):
        try:
            p, mb = item.lower().split("x")
            out.append((int(p), int(mb)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected PxMB pairs like 131072x8; got {item!r}") from None
        if min(out[-1]) < 1:
            raise argparse.ArgumentTypeError(f"expected positive P and MB; got {item!r}")
    return out


def parse_lo_hi(text: str, flag: str = "--r-range") -> tuple[int, int]:
    """``LO:HI`` (or ``LO,HI``) as (LO, HI) with 1 <= LO <= HI; ValueError naming ``flag`` otherwise. The one
    spelling of a response-length range for every bench kind."""
    parts = text.replace(",", ":").split(":")
    try:
        lo, hi = (int(x) for x in parts)
    except ValueError:
        raise ValueError(f"{flag} takes LO:HI (two integers), got {text!r}") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"{flag} needs 1 <= LO <= HI, got {text!r}")
    return lo, hi


def _lo_hi_arg(text: str) -> list[int]:
    try:
        return list(parse_lo_hi(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


#: What --tiny changes (unless given explicitly): small lengths, few runs.
TINY_SWEEP = {"prompts": [24, 40], "mb": [2, 3], "extra": [], "r_range": [3, 9], "warmup": 1, "reps": 2}
PAPER_SWEEP = {"prompts": list(PAPER_P), "mb": list(PAPER_MB), "extra": list(PAPER_EXTRA), "r_range": [131, 2048],
               "warmup": 2, "reps": 5}


def distinct_choices(text: str, choices: Sequence[str], what: str) -> list[str]:
    """A comma list of distinct ``choices`` (at least one), in the order given; ValueError naming the problem."""
    chosen = [x for x in text.split(",") if x]
    if not chosen:
        raise ValueError(f"needs at least one {what}; choose from {', '.join(choices)}")
    unknown = [x for x in chosen if x not in choices]
    if unknown:
        raise ValueError(f"unknown {what}(s) {unknown}; choose from {', '.join(choices)}")
    repeated = sorted({x for x in chosen if chosen.count(x) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} named more than once in {text!r}")
    return chosen


def add_sweep_arguments(p: argparse.ArgumentParser, *, systems: Sequence[str]) -> None:
    """The arguments every sweep benchmark takes (device, dtype, grid, repetitions, output)."""
    p.add_argument("--device", default=None,
                   help="torch device (default cuda; without a GPU only --tiny runs on the CPU by default, as a full "
                        "sweep there would take hours: give --device cpu to run one anyway)")
    p.add_argument("--dtype", type=parse_dtype, default=None,
                   help="bf16 (default on a GPU), fp16, fp32 (default on a CPU), fp64")
    p.add_argument("--P", dest="prompts", type=_int_list, default=None,
                   help="prompt lengths (default: the paper's 5059,8192,16384,32768,65536)")
    p.add_argument("--mb", type=_int_list, default=None, help="responses per prompt (default 4,8,16,32)")
    p.add_argument("--extra", type=_pairs, default=None,
                   help="extra (P, mb) pairs as PxMB,... (default 131072x8); '' for none")
    p.add_argument("--r-range", "--R-range", dest="r_range", type=_lo_hi_arg, default=None, metavar="LO:HI",
                   help="response lengths R ~ U(LO, HI), seeded per (P, mb) (default 131:2048; LO,HI also read)")
    def system_list(text: str) -> list[str]:
        try:
            return distinct_choices(text, systems, "system")
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    p.add_argument("--systems", type=system_list, default=list(systems),
                   help=f"which systems to run (default {','.join(systems)})")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs per row (default 2)")
    p.add_argument("--reps", type=int, default=None, help="timed runs per row; the median is reported (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true",
                   help="tiny dimensions and lengths (P 24,40; mb 2,3; R 3..9): a smoke run of every code path")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="stop starting rows after this many seconds (the rest are recorded as skipped)")
    p.add_argument("--out", default="experiments/results", help="output folder (default experiments/results)")
    p.add_argument("--no-plot", action="store_true", help="write the JSON only")


def resolve_sweep(args: argparse.Namespace) -> tuple[torch.device, torch.dtype, list[tuple[int, int]]]:
    """Fill unset sweep arguments from the paper's sweep (or --tiny's); return (device, dtype, (P, mb) list)."""
    defaults = TINY_SWEEP if args.tiny else PAPER_SWEEP
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.reps < 1 or args.warmup < 0:
        raise SystemExit(f"--reps must be at least 1 and --warmup at least 0; got --reps {args.reps}, "
                         f"--warmup {args.warmup}")
    if args.device is None and not torch.cuda.is_available() and not args.tiny:
        raise SystemExit("no CUDA device is available, and the full sweep on the CPU would take hours: use --tiny "
                         "for a smoke run on the CPU, or --device cpu to run the sweep there anyway")
    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as err:
        raise SystemExit(f"--device {args.device!r} is not a torch device: {err}") from None
    if device.type not in ("cuda", "cpu"):
        raise SystemExit(f"--device {args.device!r}: the benchmarks run on cuda or cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no CUDA device is available (use --device cpu --tiny for a smoke run)")
    dtype = args.dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    return device, dtype, sweep_configs(args.prompts, args.mb, args.extra)


@contextmanager
def smoke_threads(args: argparse.Namespace, device: torch.device) -> Iterator[None]:
    """One CPU thread during a --tiny CPU run (threads only add contention there; its timings mean nothing)."""
    previous = torch.get_num_threads()
    if args.tiny and device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def sweep_configs(prompts: Sequence[int], mbs: Sequence[int], extra: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (P, mb) grid plus extra pairs, without repeats, in order."""
    out: list[tuple[int, int]] = []
    for pair in [(p, mb) for p in prompts for mb in mbs] + list(extra):
        if pair not in out:
            out.append(pair)
    return out


def sample_response_lens(prompt_len: int, mb: int, seed: int, lo: int, hi: int) -> list[int]:
    """mb response lengths R ~ U(lo, hi) (inclusive), seeded by (seed, P, mb) so every system sees the same."""
    if not 1 <= lo <= hi:
        raise ValueError(f"response length range must satisfy 1 <= lo <= hi; got ({lo}, {hi})")
    rng = np.random.default_rng([seed, prompt_len, mb])
    return [int(r) for r in rng.integers(lo, hi + 1, size=mb)]


def environment(device: torch.device) -> dict:
    """GPU name, date, commit, torch/CUDA/transformers versions and the attention backend dualkv dispatches to."""
    from .. import backend_name

    commit, dirty = git_commit()
    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    is_cuda = device.type == "cuda"
    probe = torch.zeros(1, dtype=torch.bfloat16, device=device)
    return {
        "gpu": torch.cuda.get_device_name(device) if is_cuda else f"none (cpu: {platform.processor() or 'unknown'})",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": tf_version,
        "python": platform.python_version(),
        "device": str(device),
        "dualkv_backend_bf16": backend_name(probe),
        **kernel_settings(),
    }


def kernel_settings() -> dict:
    """The process-wide kernel settings (read once, at import) a timing depends on: the tree and two-level dQ orders,
    the key-tile launch order, the warp-specialised backward's and the ordered mma.sync backward's CTA orders, the
    mma.sync dK/dV layout switch
    (``DUALKV_MMA_BWD_QWARPS``), any debug macros, and the NVRTC the kernels compile with (its version moves ptxas's
    register allocation; ``DUALKV_NVRTC_LIB``). (The kernel family and mma.sync backward are per benchmark system.)"""
    from ..cuda.build import nvrtc_version
    from ..cuda.configs import (KEY_TILES_NODE_MAJOR, MMA_BWD_QWARPS, MMA_HEAD_MAJOR, TREE_DQ_ORDER,
                                TWO_LEVEL_SHARED_FIRST, WS_HEAD_MAJOR)

    return {"tree_dq_order": TREE_DQ_ORDER, "key_tile_order": "node" if KEY_TILES_NODE_MAJOR else "heaviest",
            "two_level_dq_order": "shared" if TWO_LEVEL_SHARED_FIRST else "own",
            "ws_cta_order": "head" if WS_HEAD_MAJOR else "tile", "mma_cta_order": "head" if MMA_HEAD_MAJOR else "tile",
            "mma_bwd_qwarps": MMA_BWD_QWARPS,
            "extra_defines": os.environ.get("DUALKV_EXTRA_DEFINES") or None,
            "nvrtc": nvrtc_version(), "nvrtc_lib": os.environ.get("DUALKV_NVRTC_LIB") or None}


@dataclass
class Timing:
    """Median and every timed run (ms), and the peak memory of the timed runs (GiB; None on a CPU)."""

    ms: float
    ms_runs: list[float]
    peak_mem_gib: float | None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(step: Callable[[], None], device: torch.device, *, warmup: int, reps: int) -> Timing:
    """Run ``step`` ``warmup`` times untimed, then ``reps`` times timed (CUDA events on a GPU)."""
    if reps < 1 or warmup < 0:
        raise ValueError(f"need reps >= 1 and warmup >= 0; got reps={reps}, warmup={warmup}")
    for _ in range(warmup):
        step()
    _sync(device)
    runs: list[float] = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            runs.append(start.elapsed_time(end))
        peak = torch.cuda.max_memory_allocated(device) / 2**30
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            step()
            runs.append((time.perf_counter() - t0) * 1e3)
        peak = None
    return Timing(statistics.median(runs), runs, peak)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def synthetic_packed(prompt_len: int, response_lens: Sequence[int], vocab: int, seed: int):
    """One prompt group of random tokens: PackedBatch of [P; R_1; ...; R_N] (built through pack_varlen)."""
    from ..integration.packing import pack_varlen

    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (prompt_len,), generator=gen)
    rows = [torch.cat([prompt, torch.randint(0, vocab, (r,), generator=gen)]) for r in response_lens]
    cu = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
    return pack_varlen(torch.cat(rows), cu, [prompt_len] * len(rows), ["g"] * len(rows))


def sweep_config(args: argparse.Namespace, dtype: torch.dtype, **extra) -> dict:
    """The run description stored in the result file: what the sweep arguments were, plus ``extra``."""
    return {**extra, "dtype": str(dtype).replace("torch.", ""), "pass": "forward+backward", "warmup": args.warmup,
            "reps": args.reps, "seed": args.seed, "r_range": args.r_range, "systems": args.systems}


def sweep_command(body: Callable[[argparse.Namespace, torch.device, torch.dtype, list[tuple[int, int]]], None]
                  ) -> Callable[[argparse.Namespace], int]:
    """A bench kind's run function: resolve the sweep arguments, then ``body(args, device, dtype, configs)``."""

    def run(args: argparse.Namespace) -> int:
        device, dtype, configs = resolve_sweep(args)
        with smoke_threads(args, device):
            body(args, device, dtype, configs)
        return 0

    run.__doc__ = body.__doc__
    return run


def run_sweep(args: argparse.Namespace, recorder: "RunRecorder", configs: Sequence[tuple[int, int]], vocab: int,
              build_row: Callable[[str, object], Callable[[], tuple[Callable[[], None], int]]],
              around: Callable[[str], ContextManager] = lambda system: nullcontext()) -> None:
    """For every (P, mb) — R ~ U(r_range) seeded, random tokens — and every system: one measured row.

    ``build_row(system, packed)`` returns the row's ``build`` (see :meth:`RunRecorder.run_row`); ``around(system)``
    is entered around each row (e.g. to switch a model's attention).
    """
    for prompt_len, mb in configs:
        lens = sample_response_lens(prompt_len, mb, args.seed, *args.r_range)
        packed = synthetic_packed(prompt_len, lens, vocab, args.seed)
        for system in args.systems:
            with around(system):
                recorder.run_row(system, prompt_len, lens, build_row(system, packed), warmup=args.warmup,
                                 reps=args.reps)
    recorder.finish(plot=not args.no_plot)


def is_oom_message(message: str) -> bool:
    """Allocation failures that do not arrive as ``torch.OutOfMemoryError`` (cuBLAS/cuDNN, compiled kernels)."""
    lowered = message.lower()
    return "out of memory" in lowered or "alloc_failed" in lowered


@dataclass
class RunRecorder:
    """Collects rows and keeps the JSON file (and, at the end, the plot) up to date."""

    benchmark: str
    device: torch.device
    config: dict
    out_dir: str
    time_budget_s: float | None = None
    rows: list[dict] = field(default_factory=list)
    path: Path | None = None
    _start: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.env = environment(self.device)
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        slug = "".join(c if c.isalnum() else "-" for c in (self.env["gpu"] if self.device.type == "cuda" else "cpu"))
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(self.out_dir) / f"{self.benchmark}-{slug.strip('-').lower()}-{stamp}.json"

    def over_budget(self) -> bool:
        return self.time_budget_s is not None and time.monotonic() - self._start > self.time_budget_s

    def run_row(self, system: str, prompt_len: int, response_lens: Sequence[int],
                build: Callable[[], tuple[Callable[[], None], int]], *, warmup: int, reps: int, **extra) -> dict:
        """Build the step (untimed; ``build() -> (step, tokens processed)``), measure it, and record one row; an
        out-of-memory error anywhere becomes ``status: OOM``."""
        row = {"system": system, "P": prompt_len, "mb": len(response_lens), "R_list": list(response_lens),
               "R_total": int(sum(response_lens)), "tokens": None, "ms": None, "ms_min": None, "ms_max": None,
               "ms_runs": None,
               "peak_mem_gib": None, "status": "ok", **extra}
        if self.over_budget():
            row["status"] = "skipped"
            row["error"] = "time budget exhausted"
            return self._add(row)
        oom = False
        try:
            step, row["tokens"] = build()
            timing = measure(step, self.device, warmup=warmup, reps=reps)
            row.update(ms=round(timing.ms, 3), ms_min=round(min(timing.ms_runs), 3),
                       ms_max=round(max(timing.ms_runs), 3), ms_runs=[round(x, 3) for x in timing.ms_runs],
                       peak_mem_gib=None if timing.peak_mem_gib is None else round(timing.peak_mem_gib, 3))
        except torch.OutOfMemoryError:
            oom = True
        except Exception as err:  # noqa: BLE001 - a benchmark row must not end the sweep; the error is recorded
            message = " ".join(str(err).split())
            if is_oom_message(message):
                oom = True
            else:
                row["status"] = "error"
                row["error"] = f"{type(err).__name__}: {message[:300]}"
        if oom:   # outside the except block, so the traceback's frames (and their tensors) are gone
            row["status"] = "OOM"
        step = None  # noqa: F841 - drop the step's closures before freeing
        free_memory(self.device)
        return self._add(row)

    def _add(self, row: dict) -> dict:
        self.rows.append(row)
        self.write()
        status = row["status"] if row["status"] != "ok" else f"{row['ms']:.2f} ms" + (
            f", {row['peak_mem_gib']:.2f} GiB" if row["peak_mem_gib"] is not None else "")
        print(f"  {row['system']:>12}  P={row['P']:<6} mb={row['mb']:<3} {status}"
              + (f"  ({row['error']})" if row.get("error") else ""), flush=True)
        return row

    def write(self) -> Path:
        payload = {"environment": self.env, "benchmark": self.benchmark, "config": self.config, "rows": self.rows}
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        os.replace(tmp, self.path)
        return self.path

    def finish(self, plot: bool = True) -> Path | None:
        """Write the JSON, print the speedup table, draw the plot (None if matplotlib is missing)."""
        self.write()
        from .plot import plot_results, speedup_table

        print(speedup_table(self.rows))
        print(f"results: {self.path}")
        if not plot:
            return None
        png = plot_results(self.path)
        if png is not None:
            print(f"plot: {png}")
        return png
