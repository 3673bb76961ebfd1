"""Time the backward's preprocessing kernel (D = rowsum(dO * O), LSE in log2) against the same reduction in torch,
at a Table 1 shape's packed token count: CUDA events, warm-up, median of 50. Prints one line, writes JSON.

    python3 experiments/gpu/prep_bench.py --tokens 65536 --heads 32 --head-dim 128 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from dualkv.bench.harness import measure
from dualkv.cuda.launch import run_prep


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--out", default="out/bench")
    args = p.parse_args()
    t, h, d = args.tokens, args.heads, args.head_dim
    dout = torch.randn(t, h, d, device="cuda", dtype=torch.bfloat16)
    out = torch.randn(t, h, d, device="cuda", dtype=torch.bfloat16)
    lse = torch.randn(h, t, device="cuda")
    steps = {"dualkv_prep": lambda: run_prep(dout, out, lse),
             "torch_rowsum": lambda: ((dout.float() * out.float()).sum(-1).t().contiguous(), lse * 1.4426950408889634)}
    timings = {name: measure(step, dout.device, warmup=5, reps=50).ms_runs for name, step in steps.items()}
    rows = {name: (min(runs), statistics.median(runs), max(runs)) for name, runs in timings.items()}
    gbytes = 2 * t * h * d * 2 / 1e9
    record = {"benchmark": "bwd_prep", "tokens": t, "heads": h, "head_dim": d, "gpu": torch.cuda.get_device_name(),
              "rows": {k: {"min_ms": v[0], "median_ms": v[1], "max_ms": v[2], "read_GBps": gbytes / v[1] * 1e3}
                       for k, v in rows.items()}}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "prep_bench.json").write_text(json.dumps(record, indent=1))
    for k, v in record["rows"].items():
        print(f"{k}: median {v['median_ms']:.3f} ms (min {v['min_ms']:.3f}, max {v['max_ms']:.3f}), "
              f"{v['read_GBps']:.0f} GB/s of dO+O")


if __name__ == "__main__":
    main()
