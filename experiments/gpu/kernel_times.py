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
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(1, str(Path(__file__).resolve().parent))  # kernel_breakdown.py, its sibling


def kernel_times(system_name: str, n: int, p: int, r: int, heads: int, kv_heads: int, head_dim: int,
                 iters: int, profile: bool = True) -> dict[str, dict]:
    """{kernel name: {"per_iter": launches per iteration, "us": mean µs per launch, "us_per_iter": µs per
    iteration}} of ``iters`` forward(train) + backward passes of ``system_name`` at one group (n responses of r
    tokens after a p-token prompt), after two untimed passes (``profile=False``: the passes alone, {})."""
    # (imported here, after the caller's `import dualkv`: kernel_breakdown puts its own tree first on sys.path)
    from kernel_breakdown import gpu_activities

    from dualkv.bench.baselines import SYSTEMS
    from dualkv.bench.kernel import random_inputs
    from dualkv.layout import GroupLayout

    layout = GroupLayout((p,), ((r,) * n,))
    q, k, v = random_inputs(layout, heads, kv_heads, head_dim, torch.bfloat16, 0)
    dout = torch.randn_like(q)
    system = SYSTEMS[system_name](q, k, v, layout)
    system.prepare()

    def passes(count: int) -> None:
        for _ in range(count):
            system.forward(train=True)
            system.backward(dout)

    passes(2)
    if not profile:
        passes(iters)
        torch.cuda.synchronize()
        return {}
    return {a["name"]: {"per_iter": a["count"] / iters, "us": a["ms"] * 1e3 / a["count"],
                        "us_per_iter": a["ms"] * 1e3 / iters} for a in gpu_activities(lambda: passes(iters), None)}


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
