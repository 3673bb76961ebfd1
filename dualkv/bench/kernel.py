"""``dualkv bench kernel``: shared-prompt attention vs FA2 N-copy, FlexAttention and the stock FA2 cascade.

One process, one GPU, the same activations for every system. CUDA events around each call, warm-up, median of
repeats; useful TFLOP/s counts only the (query, key) pairs shared-prompt attention needs
(:func:`dualkv.analysis.useful_pairs`); peak memory is ``torch.cuda.max_memory_allocated`` over the system's
inputs, preparation and calls. Out-of-memory is recorded as ``OOM``.

Modes: ``fwd`` (no grad), ``bwd`` (backward after one training forward), ``fwdbwd`` (both).
The varying-shape run times a sequence of micro-batches whose (P, R_i) all differ, including whatever per-shape
work each system needs (mask building, recompilation, schedule building) — the situation of a real RL step.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, astuple, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..analysis import QWEN3_8B_ATTENTION, attention_flops, useful_pairs
from ..layout import GroupLayout
from . import register_bench
from .baselines import SYSTEMS
from .harness import distinct_choices, environment, free_memory, is_oom_message, measure, parse_lo_hi

#: The seed's Table 1 shapes (N, P) with R = 2048, Qwen3-8B attention.
TABLE1 = ((28, 4096), (28, 16384), (16, 32768), (16, 65536), (8, 8192), (4, 131072))
MODES = ("fwd", "bwd", "fwdbwd")


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
    ms_min: float | None = None
    ms_max: float | None = None
    reps: int | None = None
    groups: int = 1  # groups of (P, N x R) in the micro-batch
    heads: int = QWEN3_8B_ATTENTION.heads
    kv_heads: int = QWEN3_8B_ATTENTION.kv_heads
    head_dim: int = QWEN3_8B_ATTENTION.head_dim
    r_range: str | None = None  # ragged responses (``--R-range``): "LO-HI", each R_i drawn in it; R is their mean


def response_lens(N: int, R: int, groups: int = 1, r_range: tuple[int, int] | None = None,
                  seed: int = 0) -> list[list[int]]:
    """Each group's N response lengths: all R, or with ``r_range`` = (LO, HI) each drawn uniformly from LO..HI (a
    generator seeded by ``seed``, so every system and every run of one shape sees the same micro-batch)."""
    if r_range is None:
        return [[R] * N for _ in range(groups)]
    lo, hi = r_range
    if not 1 <= lo <= hi:
        raise ValueError(f"a response-length range needs 1 <= LO <= HI, got {lo}:{hi}")
    rng = random.Random(seed)
    return [[rng.randint(lo, hi) for _ in range(N)] for _ in range(groups)]


def parse_r_range(text: str | None) -> tuple[int, int] | None:
    """``--R-range LO:HI`` as (LO, HI); None for no range."""
    if not text:
        return None
    try:
        return parse_lo_hi(text, "--R-range")
    except ValueError as err:
        raise SystemExit(str(err)) from None


def parse_shapes(text: str | None) -> list[tuple[int, int]]:
    """``--shapes N:P,...`` as [(N, P), ...]; the seed's Table 1 for none."""
    if not text:
        return list(TABLE1)
    shapes = []
    for item in text.split(","):
        try:
            n, p = (int(x) for x in item.split(":"))
        except ValueError:
            raise SystemExit(f"--shapes takes N:P pairs (two integers each), got {item!r} in {text!r}") from None
        if n < 1 or p < 1:
            raise SystemExit(f"--shapes needs N >= 1 and P >= 1, got {item!r} in {text!r}")
        shapes.append((n, p))
    return shapes


def _is_oom(err: Exception) -> bool:
    """Out of memory, also where it does not arrive as ``torch.OutOfMemoryError`` (cuDNN/cuBLAS, compiled kernels)."""
    return isinstance(err, torch.OutOfMemoryError) or is_oom_message(" ".join(str(err).split()))


def random_inputs(layout: GroupLayout, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int,
                  device: str = "cuda"):
    gen = torch.Generator(device=device).manual_seed(seed)
    make = lambda h: torch.randn(layout.total_tokens, h, head_dim, device=device, dtype=dtype, generator=gen)  # noqa
    return make(heads), make(kv_heads), make(kv_heads)


def time_runs(fn: Callable[[], object], device: str, reps: int):
    """:class:`harness.Timing` of ``fn`` (median and every run, peak GiB) after two warm-up calls."""
    return measure(fn, torch.device(device), warmup=2, reps=reps)


def time_ms(fn: Callable[[], object], device: str, reps: int) -> tuple[float, float | None]:
    """(median ms, peak GiB or None) of ``fn`` after two warm-up calls (see :func:`harness.measure`)."""
    timing = time_runs(fn, device, reps)
    return timing.ms, timing.peak_mem_gib


def _timed_call(system, mode: str, dout):
    if mode == "fwd":
        def call():
            with torch.no_grad():
                system.forward(False)
        return call
    if mode == "bwd":
        system.forward(True)
        return lambda: system.backward(dout)
    return lambda: (system.forward(True), system.backward(dout))


def bench_shape(N: int, P: int, R: int, systems: Sequence[str], *, heads: int = QWEN3_8B_ATTENTION.heads,
                kv_heads: int = QWEN3_8B_ATTENTION.kv_heads, head_dim: int = QWEN3_8B_ATTENTION.head_dim,
                dtype: torch.dtype = torch.bfloat16, modes: Sequence[str] = ("fwd",),
                reps: int = 10, seed: int = 0, device: str = "cuda", groups: int = 1,
                r_range: tuple[int, int] | None = None) -> list[BenchRow]:
    """Every system on one micro-batch of ``groups`` groups, each a P-token prompt with N responses of R tokens
    (packed P + NR per group, groups one after another), or with ``r_range`` = (LO, HI) responses of lengths drawn
    from LO..HI (:func:`response_lens`; the rows' R is their mean); a row per (system, mode)."""
    lens = response_lens(N, R, groups, r_range, seed)
    layout = GroupLayout.from_lengths([P] * groups, lens)
    if r_range is not None:
        R = round(sum(map(sum, lens)) / (N * groups))
    shape = {"groups": groups, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
             "r_range": None if r_range is None else f"{r_range[0]}-{r_range[1]}"}
    pairs = useful_pairs(layout)
    rows: list[BenchRow] = []
    for name in systems:
        system = q = k = v = dout = None
        free_memory(torch.device(device))
        try:
            q, k, v = random_inputs(layout, heads, kv_heads, head_dim, dtype, seed, device)
            system = SYSTEMS[name](q, k, v, layout)
            system.prepare()
            dout = torch.randn(system.output_rows(), heads, head_dim, device=device, dtype=dtype)
        except Exception as err:  # noqa: BLE001 - out-of-memory becomes the rows' status; anything else is raised
            if not _is_oom(err):
                raise
            rows += [BenchRow(name, N, P, R, m, None, None, None, None, "OOM", **shape) for m in modes]
            continue
        for mode in modes:
            try:
                timing = time_runs(_timed_call(system, mode, dout), device, reps)
                ms = timing.ms
                tflops = attention_flops(pairs, heads, head_dim, mode) / (ms * 1e-3) / 1e12 if pairs else None
                rows.append(BenchRow(name, N, P, R, mode, ms, tflops, None, timing.peak_mem_gib, "ok",
                                     min(timing.ms_runs), max(timing.ms_runs), len(timing.ms_runs), **shape))
            except Exception as err:  # noqa: BLE001 - out-of-memory becomes the row's status; anything else is raised
                if not _is_oom(err):
                    raise
                rows.append(BenchRow(name, N, P, R, mode, None, None, None, None, "OOM", **shape))
    for mode in modes:
        fa2 = next((r for r in rows if r.system == "fa2_ncopy" and r.mode == mode and r.ms), None)
        for r in rows:
            if fa2 and r.mode == mode and r.ms:
                r.speedup_vs_fa2 = fa2.ms / r.ms
    return rows


#: Systems that run as another variant in the varying-shape benchmark.
VARYING_VARIANT = {"flex": "flex_dynamic"}


def varying_layouts(count: int = 20, seed: int = 0) -> list[GroupLayout]:
    """Micro-batches whose (P, R_i) all differ, as an RL step produces them."""
    rng = random.Random(seed)
    return [GroupLayout.single(rng.randint(4096, 16384), [rng.randint(128, 2048) for _ in range(rng.choice([8, 16]))])
            for _ in range(count)]


def bench_varying(systems: Sequence[str], *, count: int = 20, heads: int = QWEN3_8B_ATTENTION.heads,
                  kv_heads: int = QWEN3_8B_ATTENTION.kv_heads, head_dim: int = QWEN3_8B_ATTENTION.head_dim,
                  dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> list[dict]:
    """Wall time of forward + backward over ``count`` differently shaped micro-batches, per-shape work included.

    ``flex`` runs as ``flex_dynamic`` here (torch.compile's default): a static compile per shape would recompile
    every micro-batch. Each system starts from an empty torch.compile cache (its compiles are counted, and entries an
    earlier static benchmark left in the same process do not steer its dynamic-shape decisions)."""
    layouts = varying_layouts(count, seed)
    results = []
    for name in dict.fromkeys(VARYING_VARIANT.get(s, s) for s in systems):
        torch._dynamo.reset()
        torch.cuda.synchronize()
        start = time.perf_counter()
        status = "ok"
        try:
            for i, layout in enumerate(layouts):
                q, k, v = random_inputs(layout, heads, kv_heads, head_dim, dtype, seed + i)
                system = SYSTEMS[name](q, k, v, layout)
                system.prepare()
                dout = torch.randn(system.output_rows(), heads, head_dim, device="cuda", dtype=dtype)
                system.forward(True)
                system.backward(dout)
                del system, q, k, v, dout
            torch.cuda.synchronize()
        except Exception as err:  # noqa: BLE001 - out-of-memory becomes the status; anything else is raised
            if not _is_oom(err):
                raise
            status = "OOM"
        results.append({"system": name, "batches": count, "seconds": time.perf_counter() - start, "status": status})
    return results


def check_systems_agree(systems: Sequence[str], *, heads=8, kv_heads=2, head_dim=128, dtype=torch.bfloat16,
                        device: str = "cuda", layout: GroupLayout | None = None, reference: str = "dualkv") -> dict:
    """Max |x - reference x| of every system's output and (dq, dk, dv) at a small shape: they must compute the
    same thing. The reference is ``reference`` when it is among ``systems``, else the first of them."""
    if reference not in systems:
        reference = systems[0]
    layout = layout or GroupLayout.from_lengths([1000], [[300, 129, 64]])
    q, k, v = random_inputs(layout, heads, kv_heads, head_dim, dtype, 1, device)
    dout = torch.randn_like(q)
    results = {}
    for name in systems:
        system = SYSTEMS[name](q, k, v, layout)
        system.prepare()
        out = system.to_packed(system.forward(True)).float()
        # N-copy systems: each packed row's upstream gradient on its first copy only, gradients summed over copies
        grads = system.packed_grads(system.backward(system.upstream(dout)))
        results[name] = [out] + grads
    ref = results[reference]
    return {name: [round((a - b).abs().max().item(), 5) for a, b in zip(vals, ref)] for name, vals in results.items()}


def write_results(rows: Sequence[BenchRow], path: str | Path, extra: dict | None = None) -> Path:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    payload = {"environment": environment(device), "benchmark": "kernel", "rows": [asdict(r) for r in rows]}
    payload.update(extra or {})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    return path


def format_rows(rows: Sequence[BenchRow]) -> str:
    lines = [f"{'system':<14} {'G':>2} {'N':>3} {'P':>7} {'R':>9} {'mode':<6} {'ms':>9} {'min-max':>17} {'TFLOP/s':>8} "
             f"{'x FA2':>6} {'GiB':>6}"]
    for r in rows:
        ms = f"{r.ms:9.2f}" if r.ms else f"{r.status:>9}"
        spread = f"{r.ms_min:8.2f}-{r.ms_max:<8.2f}" if r.ms_min is not None else f"{'-':>17}"
        tf = f"{r.tflops:8.1f}" if r.tflops else f"{'-':>8}"
        sp = f"{r.speedup_vs_fa2:6.2f}" if r.speedup_vs_fa2 else f"{'-':>6}"
        mem = f"{r.peak_mem_gib:6.1f}" if r.peak_mem_gib else f"{'-':>6}"
        responses = r.r_range or str(r.R)  # ragged responses: their range
        lines.append(f"{r.system:<14} {r.groups:>2} {r.N:>3} {r.P:>7} {responses:>9} {r.mode:<6} {ms} {spread} {tf} "
                     f"{sp} {mem}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", default="fwd,bwd,fwdbwd", help="comma list of fwd, bwd, fwdbwd")
    p.add_argument("--systems", default="dualkv,cudnn_cascade,cascade,flex,cudnn_ncopy,fa2_ncopy",
                   help="comma list of " + ",".join(SYSTEMS))
    p.add_argument("--shapes", default=None, help="comma list of N:P (default: the seed's Table 1)")
    p.add_argument("--R", type=int, default=2048)
    p.add_argument("--R-range", "--r-range", dest="R_range", default=None, metavar="LO:HI",
                   help="ragged responses, as an RL step makes them: each length drawn uniformly from LO..HI "
                        "(seeded: every system sees the same micro-batch); replaces --R, the rows' R is the mean")
    p.add_argument("--groups", type=int, default=1,
                   help="groups per micro-batch: each shape N:P becomes GROUPS prompts of P tokens with N responses")
    qwen = QWEN3_8B_ATTENTION
    p.add_argument("--heads", type=int, default=qwen.heads, help=f"query heads (default: Qwen3-8B's {qwen.heads})")
    p.add_argument("--kv-heads", type=int, default=qwen.kv_heads, help=f"key/value heads (default {qwen.kv_heads})")
    p.add_argument("--head-dim", type=int, default=qwen.head_dim, help=f"head dim (default {qwen.head_dim})")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--varying", type=int, default=0, help="also time this many differently shaped micro-batches")
    p.add_argument("--out", default="experiments/results", help="directory for the JSON result")


def _comma_list(option: str, what: str, text: str, choices: Sequence[str]) -> list[str]:
    """``text`` as a comma list of distinct ``choices`` (:func:`~dualkv.bench.harness.distinct_choices`), else a
    message naming ``option``."""
    try:
        return distinct_choices(text, choices, what)
    except ValueError as err:
        raise SystemExit(f"{option}: {err}") from None


def run(args: argparse.Namespace) -> int:
    modes = _comma_list("--mode", "mode", args.mode, MODES)
    systems = _comma_list("--systems", "system", args.systems, tuple(SYSTEMS))
    shapes = parse_shapes(args.shapes)
    if args.groups < 1:
        raise SystemExit(f"--groups must be at least 1, got {args.groups}")
    r_range = parse_r_range(args.R_range)
    if r_range is None and args.R < 1:
        raise SystemExit(f"--R must be at least 1, got {args.R}")
    if args.reps < 1:
        raise SystemExit(f"--reps must be at least 1, got {args.reps}")
    if args.varying < 0:
        raise SystemExit(f"--varying must be at least 0, got {args.varying}")
    if args.heads < 1 or args.kv_heads < 1 or args.heads % args.kv_heads:
        raise SystemExit(f"--heads ({args.heads}) must be a positive multiple of --kv-heads ({args.kv_heads})")
    if args.head_dim < 1:
        raise SystemExit(f"--head-dim must be at least 1, got {args.head_dim}")
    if not torch.cuda.is_available():
        print("dualkv bench kernel needs a CUDA GPU", file=sys.stderr)
        return 2
    rows: list[BenchRow] = []
    for n, p in shapes:
        print(f"{args.groups}x N={n} P={p} ..." if args.groups > 1 else f"N={n} P={p} ...", file=sys.stderr,
              flush=True)
        rows += bench_shape(n, p, args.R, systems, modes=modes, reps=args.reps, groups=args.groups,
                            heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, r_range=r_range)
    # the agreement check at a small shape with the run's head dim and GQA ratio (the kernels it names are the ones
    # timed); the varying micro-batches at the run's attention shape
    agreement_shape = {"heads": 2 * (args.heads // args.kv_heads), "kv_heads": 2, "head_dim": args.head_dim}
    extra = {"agreement": check_systems_agree(systems, **agreement_shape), "agreement_shape": agreement_shape}
    if args.varying:
        extra["varying"] = bench_varying(systems, count=args.varying, heads=args.heads, kv_heads=args.kv_heads,
                                         head_dim=args.head_dim)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tags = ([f"groups{args.groups}"] if args.groups > 1 else []) + \
        ([f"R{r_range[0]}-{r_range[1]}"] if r_range else []) + \
        ([f"h{args.heads}-{args.kv_heads}-d{args.head_dim}"]
         if (args.heads, args.kv_heads, args.head_dim) != astuple(QWEN3_8B_ATTENTION) else [])
    name = "-".join(["kernel", *tags, stamp]) + ".json"
    path = write_results(rows, Path(args.out) / name, extra)
    print(format_rows(rows))
    print(f"results: {path}")
    return 0


register_bench("kernel", "attention kernels: dualkv vs the cuDNN and FA2 cascades (cudnn_cascade, cascade), cuDNN / "
               "FA2 N-copy and FlexAttention (fwd/bwd)",
               add_arguments, run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m dualkv.bench.kernel")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
