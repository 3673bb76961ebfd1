"""Where a forward and a backward spend their GPU time: every kernel (and memset / copy) of one pass, from
torch.profiler, next to the pass's CUDA-event time, for dualkv and the cuDNN cascade at one shape.

    python3 experiments/gpu/kernel_breakdown.py --shape 16:32768 --out $OUT

Qwen3-8B attention (H=32, H_k=8, d=128), bf16, R=2048. Each pass is warmed up twice, timed with CUDA events over
``--reps`` runs (median), then profiled once more; the JSON lists each GPU activity's total ms in that pass
(``fwd`` / ``bwd``), their sum (``*_gpu_ms``) and the event time (``*_ms``). The profiler stretches long kernels
(the warp-specialised backward: 145.5 ms profiled against 131.4 by events at (16, 32K)): read the activities as
shares, not times.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402


def gpu_activities(fn, name_chars: int | None = 120) -> list[dict]:
    """Each GPU activity of one call of ``fn``: name (its first ``name_chars`` characters; None: whole), count, total
    ms (sorted, heaviest first)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals.setdefault(event.name, [0, 0.0])
            entry[0] += 1
            entry[1] += event.device_time_total / 1e3
    rows = [{"name": name[:name_chars], "count": c, "ms": round(ms, 3)} for name, (c, ms) in totals.items()]
    return sorted(rows, key=lambda r: -r["ms"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="16:32768", help="N:P")
    ap.add_argument("--systems", default="dualkv,cudnn")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="/tmp")
    args = ap.parse_args()
    import dualkv
    from dualkv import cascade
    from dualkv.bench.harness import measure
    from dualkv.bench.kernel import random_inputs

    n, p = (int(x) for x in args.shape.split(":"))
    layout = dualkv.GroupLayout.single(p, [2048] * n)
    q, k, v = (t.requires_grad_() for t in random_inputs(layout, 32, 8, 128, torch.bfloat16, 0))
    dout = torch.randn_like(q)
    fns = {"dualkv": dualkv.shared_prefix_attention, "cudnn": cascade.shared_prefix_attention}
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": [n, p], "systems": {}}
    for name in args.systems.split(","):
        fn = fns[name]
        with torch.no_grad():
            forward = lambda: fn(q, k, v, layout)  # noqa: E731
            fwd_ms = measure(forward, q.device, warmup=2, reps=args.reps).ms
            fwd_acts = gpu_activities(forward)
        out = fn(q, k, v, layout)
        backward = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
        bwd_ms = measure(backward, q.device, warmup=2, reps=args.reps).ms
        bwd_acts = gpu_activities(backward)
        result["systems"][name] = {
            "fwd_ms": round(fwd_ms, 3), "fwd_gpu_ms": round(sum(a["ms"] for a in fwd_acts), 3), "fwd": fwd_acts,
            "bwd_ms": round(bwd_ms, 3), "bwd_gpu_ms": round(sum(a["ms"] for a in bwd_acts), 3), "bwd": bwd_acts}
        del out
        torch.cuda.empty_cache()
    Path(args.out, f"kernel_breakdown_{n}_{p}.json").write_text(json.dumps(result, indent=1))
    for name, r in result["systems"].items():
        for phase in ("fwd", "bwd"):
            print(f"{name} {phase}: events {r[phase + '_ms']:.2f} ms, GPU activities {r[phase + '_gpu_ms']:.2f} ms")
            for a in r[phase][:8]:
                print(f"    {a['ms']:9.3f} ms  x{a['count']:<3d} {a['name'][:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
