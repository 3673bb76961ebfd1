"""``dualkv model``: print the predictions for one configuration, or write the plots."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..cli import subcommand


def _lengths(text: str) -> "int | list[int]":
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--R {text!r}: expected an integer or comma-separated integers") from None
    if not values:
        raise argparse.ArgumentTypeError("--R is empty")
    return values[0] if len(values) == 1 and "," not in text else values


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--N", type=int, help="responses per prompt (optional when --R lists every length)")
    p.add_argument("--P", type=int, help="prompt length (tokens)")
    p.add_argument("--R", type=_lengths, help="response length (tokens), or comma-separated lengths R_1,...,R_N")
    p.add_argument("--model", default="qwen3-8b", help="model configuration (default qwen3-8b); --list-models")
    p.add_argument("--mb", type=int, help="micro-batch size in rows: also report the micro-batched rho")
    p.add_argument("--mode", default="fwdbwd", choices=("fwd", "bwd", "fwdbwd"), help="pass(es) to count FLOPs for")
    p.add_argument("--recompute", action="store_true", help="gradient checkpointing: one more forward")
    p.add_argument("--memory-rows", metavar="FILE",
                   help="CSV/JSON rows (P, mb, R, peak_mem_gib) to fit the memory law to (needs --mb)")
    p.add_argument("--seconds", type=float, help="a measured time of the --mode pass(es) for the group: report MFU")
    p.add_argument("--gpu", default="H100", help="GPU kind for MFU peak (A100, H100, H200; default H100)")
    p.add_argument("--num-gpus", type=int, default=1, help="GPUs the measured time ran on (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--plot", metavar="DIR", help="write rho.png, speedup.png and memory.png to DIR")
    p.add_argument("--results", metavar="DIR", help="result files to overlay (default: experiments/results)")
    p.add_argument("--list-models", action="store_true", help="list the shipped model configurations")


def _run(args: argparse.Namespace) -> int:
    from .memory import fit_memory_law, read_memory_rows
    from .models import available_models, load_model
    from .report import format_report, model_report

    if args.list_models:
        for name in available_models():
            print(f"{name:<18} {load_model(name).description}")
        return 0
    if args.results and not args.plot:
        raise SystemExit("dualkv model: --results only applies with --plot DIR (the measured points it overlays)")
    try:
        load_model(args.model)
    except (TypeError, ValueError) as err:
        raise SystemExit(f"dualkv model: {err}") from None
    if args.P is None and args.R is None and args.N is None:
        if not args.plot:
            raise SystemExit("dualkv model: give --N, --P and --R (or --plot DIR, or --list-models)")
    else:
        missing = [f"--{k}" for k in ("P", "R") if getattr(args, k) is None]
        if missing:
            raise SystemExit(f"dualkv model: missing {' and '.join(missing)}")
        if args.memory_rows and args.mb is None:
            raise SystemExit("dualkv model: --memory-rows needs --mb (the law predicts peak memory at (P, mb, R))")
        try:
            law = fit_memory_law(read_memory_rows(args.memory_rows)) if args.memory_rows else None
            rep = model_report(args.N, args.P, args.R, model=args.model, mb=args.mb, mode=args.mode,
                               recompute=args.recompute, memory_law=law, seconds=args.seconds, gpu=args.gpu,
                               num_gpus=args.num_gpus)
        except (OSError, TypeError, ValueError) as err:
            raise SystemExit(f"dualkv model: {err}") from None
        print(json.dumps(rep, indent=2) if args.json else format_report(rep))
    if args.plot:
        from .plots import write_plots

        if args.results and not Path(args.results).exists():
            raise SystemExit(f"dualkv model: no result files at {args.results}")

        for path in write_plots(args.plot, args.results, model=args.model):
            if not args.json:
                print(f"wrote {path}")
    return 0


subcommand("model", "rho, FLOP, speedup and memory predictions for (N, P, R); --plot writes the plots")(
    (_add_arguments, _run))
