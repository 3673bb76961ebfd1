"""Time head dim 96 on one GPU: the default kernels (on sm_90 the warp-specialised ones; they were the first wgmma kernels when this was written) against the mma.sync kernels
(``kernel_family("mma")``), forward and forward + backward, bf16, one process, CUDA events; min / median / max ms
over ``--reps`` timed runs after a check that both families agree.

    python experiments/gpu/hd96_bench.py [--shapes 16:4096,8:8192] [--R 2048] [--heads 32:8,32:32] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import dualkv
from dualkv import GroupLayout
from dualkv.cuda.configs import dkdv_spec, dq_spec, fwd_spec, kernel_family
from dualkv.cuda.runtime import arch_of


def _time(fn, reps: int) -> dict:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return {"min": min(times), "median": statistics.median(times), "max": max(times)}


def bench(n: int, p: int, r: int, heads: int, kv_heads: int, reps: int) -> list[dict]:
    layout = GroupLayout.from_lengths([p], [[r] * n])
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(layout.total_tokens, h, 96, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h in (heads, kv_heads, kv_heads))
    dout = torch.randn_like(q)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def fwd():
        dualkv.shared_prefix_attention(q, k, v, layout)

    def fwdbwd():
        out = dualkv.shared_prefix_attention(qg, kg, vg, layout)
        torch.autograd.grad(out, (qg, kg, vg), dout)

    rows, outs = [], {}
    arch = arch_of(0)
    for family in ("auto", "mma"):
        with kernel_family(family):
            outs[family] = dualkv.shared_prefix_attention(q, k, v, layout).float()
            kernels = [fwd_spec(96, torch.bfloat16, heads // kv_heads, False, arch).kernel,
                       dq_spec(96, torch.bfloat16, heads // kv_heads, False, arch).kernel,
                       dkdv_spec(96, torch.bfloat16, False, arch).kernel]
            for mode, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
                rows.append({"N": n, "P": p, "R": r, "heads": heads, "kv_heads": kv_heads, "head_dim": 96,
                             "family": family, "kernels": kernels, "mode": mode, "ms": _time(fn, reps)})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    diff = (outs["auto"] - outs["mma"]).abs().max().item()
    if not diff < 2e-2:
        raise SystemExit(f"the two families disagree at N={n} P={p}: max |diff| {diff:.3e}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="16:4096,8:8192", help="comma list of N:P")
    ap.add_argument("--R", type=int, default=2048)
    ap.add_argument("--heads", default="32:8,32:32", help="comma list of query heads:kv heads")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        n, p = (int(x) for x in shape.split(":"))
        for hh in args.heads.split(","):
            h, hk = (int(x) for x in hh.split(":"))
            rows += bench(n, p, args.R, h, hk, args.reps)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
