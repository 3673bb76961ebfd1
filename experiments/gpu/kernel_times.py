"""Per-kernel GPU time of one benchmark system's forward and backward (torch.profiler, CUDA activity only).

Where `dualkv bench kernel` says that a system got slower, this says which of its kernels did. Run it from inside the
tree whose package it should import (``python -m`` and ``python -c`` put the working directory first on sys.path; the
script checks and prints the package it imported):

    cd TREE && python3 -c "import runpy; runpy.run_path('PATH/kernel_times.py', run_name='__main__')" \\
        --system dualkv_mma --shapes 8:8192,16:32768

Prints, per shape, each kernel's launches per iteration and its mean time, and writes the same as JSON with --out.
`ab_trees.sh` with TOOL=kernel_times runs it in two trees, alternating. (kernel_breakdown.py, by contrast, sets
dualkv and the cuDNN cascade side by side in one tree with CUDA-event times.) The profiler stretches long kernels a
little: compare trees or systems within one call, not with event times.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch


def kernel_times(system_name: str, n: int, p: int, r: int, heads: int, kv_heads: int, head_dim: int,
                 iters: int, profile: bool = True) -> dict[str, dict]:
    """{kernel name: {"per_iter": launches per iteration, "us": mean µs per launch, "us_per_iter": µs per
    iteration}} of ``iters`` forward(train) + backward passes of ``system_name`` at one group (n responses of r
    tokens after a p-token prompt), after two untimed passes."""
    from dualkv.bench.baselines import SYSTEMS
    from dualkv.layout import GroupLayout

    layout = GroupLayout((p,), ((r,) * n,))
    tokens = layout.total_tokens
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(tokens, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(tokens, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(tokens, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    dout = torch.randn(tokens, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    system = SYSTEMS[system_name](q, k, v, layout)
    system.prepare()
    for _ in range(2):
        system.forward(train=True)
        system.backward(dout)
    torch.cuda.synchronize()
    if not profile:
        for _ in range(iters):
            system.forward(train=True)
            system.backward(dout)
        torch.cuda.synchronize()
        return {}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            system.forward(train=True)
            system.backward(dout)
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = collections.defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name].append(event.device_time_total if hasattr(event, "device_time_total")
                                      else event.cuda_time_total)
    return {name: {"per_iter": len(ts) / iters, "us": sum(ts) / len(ts), "us_per_iter": sum(ts) / iters}
            for name, ts in sorted(totals.items(), key=lambda kv: -sum(kv[1]))}


def main(argv: list[str] | None = None) -> int:
    import dualkv

    print("package:", dualkv.__file__, flush=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="dualkv_mma")
    parser.add_argument("--shapes", default="8:8192,16:32768", help="comma list of N:P")
    parser.add_argument("--R", type=int, default=2048)
    parser.add_argument("--heads", default="32:8", help="query heads:KV heads")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", default=None, help="JSON file to write")
    parser.add_argument("--no-profile", action="store_true",
                        help="only run the passes (2 warm-up + --iters), for an outside profiler such as ncu")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_times.py: needs a CUDA GPU (none is visible)", file=sys.stderr)
        return 2
    heads, kv_heads = (int(x) for x in args.heads.split(":"))
    result = {"package": dualkv.__file__, "commit": os.environ.get("DUALKV_COMMIT", ""),
              "gpu": torch.cuda.get_device_name(), "system": args.system, "shapes": {}}
    for shape in args.shapes.split(","):
        n, p = (int(x) for x in shape.split(":"))
        times = kernel_times(args.system, n, p, args.R, heads, kv_heads, args.head_dim, args.iters, not args.no_profile)
        result["shapes"][shape] = times
        if args.no_profile:
            continue
        print(f"== {args.system} N={n} P={p} R={args.R}: {sum(t['us_per_iter'] for t in times.values()) / 1e3:.2f} "
              "ms of kernels per fwd+bwd")
        for name, t in times.items():
            if t["us_per_iter"] >= 20:
                print(f"  {t['us_per_iter'] / 1e3:9.3f} ms  {t['per_iter']:4.1f} x {t['us'] / 1e3:8.3f} ms  {name[:90]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
