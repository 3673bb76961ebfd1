"""Bisect a failure of the warp-specialised backward on a GPU: each variant (debug macros through
``DUALKV_EXTRA_DEFINES``) runs one small case in its own process (a fault poisons the CUDA context), reporting
whether it ran, its error, and its gradients' error against float64. Optionally the base variant under
compute-sanitizer.

    python experiments/gpu/debug_ws_bwd.py [--sanitizer] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

VARIANTS = {
    "v1": "FAMILY=wgmma_v1",  # the first wgmma backward (with the new preprocessing kernel): isolates bwd_prep
    "base": "",
    "nodq": "DKV_DBG_NODQ=1",
    "nosem": "DKV_DBG_NOSEM=1",
    "serial_dq": "DKV_DQ_INFLIGHT=0",  # the dQ warp waits for each add to complete before the next
    "serial_nosem": "DKV_DQ_INFLIGHT=0,DKV_DBG_NOSEM=1",
    "regs24": "DKV_PRODUCER_REGS=24",
    "regs40_216": "DKV_PRODUCER_REGS=40,DKV_CONSUMER_REGS=216",
    "nolimit": "DKV_WAIT_LIMIT=1000000000",
    "dq2": "TILE=dq_buffers=2",
    "dq2_nosem": "TILE=dq_buffers=2;DKV_DBG_NOSEM=1",
    "dq2_nodq": "TILE=dq_buffers=2;DKV_DBG_NODQ=1",
    "stages3": "TILE=stages=3",
    "nored": "DKV_DBG_NORED=1",  # wrong dQ: the dQ warp's counters without the reduce-adds
    "halfred": "DKV_DBG_HALFRED=1",  # wrong dQ: reduce-adds of half the rows (half the dQ traffic)
    "halfqdo": "DKV_DBG_HALFQDO=1",  # wrong gradients: half of Q's and dO's atoms loaded (half the Q / dO bytes)
    "halfqdo_shared": "DKV_DBG_HALFQDO=2",  # the same on the steps whose queries see the key block fully only
    "nobar": "DKV_DBG_NOBAR=1",  # wrong dQ: no barrier of the two consumer warpgroups before dQ_step
}

CASES = {
    "one_tile": ([64], [[65]], 4, 1),
    "two_keys": ([300], [[129, 2]], 4, 2),
    "multi": ([64, 127, 65], [[65, 127, 1], [64, 127], [1, 65, 129]], 4, 1),
}


def _apply_tile_env() -> None:
    """DUALKV_WS_TILE="dq_buffers=2,stages=2": override the warp-specialised backward's tile (its smem follows)."""
    from with_tiles import apply

    text = os.environ.get("DUALKV_WS_TILE", "")
    if text:
        apply(f"SM90_WS_BWD_TILES:128:{text}")


def timing_child(shapes: str) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    _apply_tile_env()
    import dualkv
    from dualkv.analysis import attention_flops, useful_pairs
    from dualkv.bench.kernel import random_inputs, time_runs

    res = {"rows": []}
    for item in shapes.split(","):
        n, p = (int(x) for x in item.split(":"))
        layout = dualkv.GroupLayout.single(p, [2048] * n)
        q, k, v = (t.requires_grad_() for t in random_inputs(layout, 32, 8, 128, torch.bfloat16, 0))
        dout = torch.randn_like(q)
        out = dualkv.shared_prefix_attention(q, k, v, layout)
        reps = int(os.environ.get("DEBUG_WS_REPS", "10"))
        t = time_runs(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), "cuda", reps)
        res["rows"].append({"N": n, "P": p, "ms": t.ms, "ms_min": min(t.ms_runs), "ms_max": max(t.ms_runs),
                            "tflops": attention_flops(useful_pairs(layout), 32, 128, "bwd") / t.ms / 1e9})
    print("RESULT " + json.dumps(res), flush=True)


def child(case: str) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    _apply_tile_env()
    from dualkv import GroupLayout, shared_prefix_attention
    from dualkv.reference import shared_prefix_attention as reference

    prompts, resp, heads, kv = CASES[case]
    layout = GroupLayout.from_lengths(prompts, resp)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(layout.total_tokens, heads, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(layout.total_tokens, kv, 128, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    dout = torch.randn_like(q)
    res = {"case": case}
    try:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = shared_prefix_attention(*leaves, layout)
        grads = torch.autograd.grad(out, leaves, dout)
        torch.cuda.synchronize()
        leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
        ref = torch.autograd.grad(reference(*leaves64, layout), leaves64, dout.double())
        for name, a, b in zip(("dq", "dk", "dv"), grads, ref):
            res[name] = (a.double() - b).abs().max().item() / (b.abs().max().item() or 1.0)
        res["ok"] = True
    except Exception as err:  # report, do not raise: the parent collects
        res["ok"] = False
        res["error"] = repr(err)[:300]
    print("RESULT " + json.dumps(res), flush=True)


def run(variant: str, defines: str, case: str, sanitizer: bool, timeout: int, timing: str = "") -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if not timing:
        env["CUDA_LAUNCH_BLOCKING"] = "1"
    for item in defines.split(";"):
        if item.startswith("FAMILY="):
            env["DUALKV_KERNELS"] = item.split("=", 1)[1]
        elif item.startswith("TILE="):
            env["DUALKV_WS_TILE"] = item.split("=", 1)[1]
        elif item:
            env["DUALKV_EXTRA_DEFINES"] = item
    cmd = [sys.executable, __file__, "--timing-child", timing] if timing else [sys.executable, __file__, "--child", case]
    if sanitizer:
        cmd = ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "10"] + cmd
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        text = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        return {"variant": variant, "case": case, "ok": False, "error": f"timeout after {timeout}s (hang)",
                "log": ((err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or ""))[-500:]}
    line = next((ln for ln in text.splitlines() if ln.startswith("RESULT ")), None)
    res = json.loads(line[7:]) if line else {"ok": False, "error": "no result"}
    res.update(variant=variant, sanitizer=sanitizer)
    if sanitizer or not res.get("ok"):
        res["log"] = text[-1500:]
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", default=None)
    ap.add_argument("--timing-child", default=None)
    ap.add_argument("--timing", default="", help="N:P,... : time the backward of each variant instead")
    ap.add_argument("--sanitizer", action="store_true")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return 0
    if args.timing_child:
        timing_child(args.timing_child)
        return 0
    results = []
    if args.timing:
        for variant in args.variants.split(","):
            res = run(variant, VARIANTS[variant], "", False, 240, timing=args.timing)
            results.append(res)
            print(json.dumps({k: v for k, v in res.items() if k != "log"}), flush=True)
        Path(args.out, "debug_ws_bwd_timing.json").write_text(json.dumps(results, indent=1))
        return 0
    for case in args.cases.split(","):
        for variant in args.variants.split(","):
            res = run(variant, VARIANTS[variant], case, False, 60)
            results.append(res)
            print(json.dumps({k: v for k, v in res.items() if k != "log"}), flush=True)
    if args.sanitizer:
        res = run("base", "", "one_tile", True, 240)
        results.append(res)
        print(json.dumps(res)[:3000], flush=True)
    Path(args.out, "debug_ws_bwd.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
