"""One backward (``--pass fwd``: one forward) of dualkv's kernels (``--family``: default or ``mma``), the cuDNN cascade
or the FA2 cascade at one shape, after a warm-up, between cudaProfilerStart and cudaProfilerStop (process-wide: the backward's kernels are launched from autograd's device
thread, which NVTX ranges pushed here would not cover), for Nsight Compute to profile:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
        python3 experiments/gpu/profile_bwd.py --systems dualkv --shape 16:32768

Qwen3-8B attention (H=32, H_k=8, d=128), bf16, R=2048.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402


def _system(name: str, q, k, v, dout, layout):
    """(forward, backward) of one system: ``backward(forward())`` runs one backward of a fresh forward."""
    import dualkv
    from dualkv import cascade

    if name == "fa2":  # the benchmark's FA2 cascade (three varlen FlashAttention-2 calls merged by LSE)
        from dualkv.bench.baselines import SYSTEMS

        system = SYSTEMS["cascade"](q.detach(), k.detach(), v.detach(), layout)
        system.prepare()
        return (lambda: system.forward(True)), (lambda _: system.backward(system.upstream(dout)))
    fn = {"dualkv": dualkv.shared_prefix_attention, "cudnn": cascade.shared_prefix_attention}[name]
    return (lambda: fn(q, k, v, layout)), (lambda out: torch.autograd.grad(out, (q, k, v), dout))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="16:32768", help="N:P")
    ap.add_argument("--systems", default="dualkv,cudnn", help="comma list of dualkv, cudnn, fa2")
    ap.add_argument("--family", default="auto", help="dualkv's kernel family (configs.kernel_family)")
    ap.add_argument("--pass", dest="which", choices=("bwd", "fwd"), default="bwd", help="the pass between start and stop")
    args = ap.parse_args()
    import dualkv
    from dualkv.bench.kernel import random_inputs

    n, p = (int(x) for x in args.shape.split(":"))
    layout = dualkv.GroupLayout.single(p, [2048] * n)
    q, k, v = (t.requires_grad_() for t in random_inputs(layout, 32, 8, 128, torch.bfloat16, 0))
    dout = torch.randn_like(q)
    from dualkv.cuda.configs import kernel_family

    kernel_family(args.family)
    for name in args.systems.split(","):
        forward, backward = _system(name, q, k, v, dout, layout)
        for rep in range(3):  # two warm-ups, then the third pass alone between start and stop
            if rep == 2 and args.which == "fwd":
                torch.cuda.synchronize()
                torch.cuda.cudart().cudaProfilerStart()
            state = forward()
            if rep == 2:
                torch.cuda.synchronize()
                if args.which == "fwd":
                    torch.cuda.cudart().cudaProfilerStop()
                    break
                torch.cuda.cudart().cudaProfilerStart()
            backward(state)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    print("profiled", args.which, args.systems, args.shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
