"""One warp-specialised tree backward (DKV_TREE=1 bwd_sm90_ws) on an issue #14 workload, for `ncu` to measure
where the dQ hand-off's time goes (DRAM and L2 reduction traffic, the dQ warp's waits):

    ncu --clock-control none --profile-from-start off -k regex:bwd_sm90_ws --section MemoryWorkloadAnalysis \
        python3 experiments/gpu/profile_tree_dq.py --workload a

A forward and one warm-up backward run first (compiles and loads every kernel); only the second backward runs
between cudaProfilerStart and cudaProfilerStop. DUALKV_EXTRA_DEFINES picks a bisection variant (DKV_DBG_NOSEM=1,
DKV_DBG_NODQ=1, DKV_DQ_INFLIGHT=0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import dualkv  # noqa: E402
from dualkv import GroupLayout  # noqa: E402
from dualkv.analysis.trees import branching_workload, multi_turn_workload, system_prompt_workload  # noqa: E402

WORKLOADS = {"a": system_prompt_workload, "b": branching_workload, "c": multi_turn_workload}  # as tree_bench's


def layout_for(name: str):
    """``a``/``b``/``c``: tree_bench's workloads; ``two-level``: one 32K prompt with 16 responses of 2K."""
    if name == "two-level":
        return GroupLayout.single(32768, [2048] * 16)
    return WORKLOADS[name]()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="a", choices=["a", "b", "c", "two-level"])
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    args = p.parse_args(argv)
    layout = layout_for(args.workload)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(layout.total_tokens, h, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
               .requires_grad_() for h in (args.heads, args.kv_heads, args.kv_heads))
    out = dualkv.shared_prefix_attention(q, k, v, layout)
    dout = torch.randn_like(out)
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # compiles and loads
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"{args.workload}: {layout.total_tokens} tokens, done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
