"""GPU: check and time the Hopper wgmma kernels against the mma.sync kernels in one process.

Correctness: out and LSE of every forward variant, and dQ/dK/dV of the wgmma backward, against the float64
reference on awkward layouts (both dtypes, d = 64 / 128, windows), next to the mma.sync kernels' error on the same
inputs (a variant passes at <= 2x that error + 1e-6, FlashAttention's rule with the mma.sync kernels standing in for
"the same computation at this dtype"). Speed: per-kernel ms and useful TFLOP/s at Qwen3-8B attention dims,
R = 2048, for each kernel of both families, the stock cascade and FlexAttention in the same process. JSON to $OUT
(or --out).

    python experiments/gpu/wgmma_check.py --shapes 16:32768,28:4096
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from dualkv import GroupLayout  # noqa: E402
from dualkv.analysis import attention_flops, useful_pairs  # noqa: E402
from dualkv.bench.kernel import bench_shape, random_inputs, time_ms  # noqa: E402
import dualkv  # noqa: E402
from dualkv.cuda.configs import FWD_TILES, SM90_FWD_TILES, kernel_family, mma_backward  # noqa: E402
from dualkv.cuda.launch import make_plan, run_backward, run_forward  # noqa: E402
from dualkv.reference import shared_prefix_attention  # noqa: E402


def variants(head_dim: int) -> dict:
    base = SM90_FWD_TILES[head_dim]
    return {"mma": ("fwd", FWD_TILES[head_dim]), "wgmma": ("fwd_sm90", replace(base, overlap=False)),
            "wgmma_overlap": ("fwd_sm90", replace(base, overlap=True))}


def forward(q, k, v, layout, kernel, tile, window=-1, group=None):
    plan = make_plan(layout.segment_table, head_dim=q.shape[2], group_size=group or q.shape[1] // k.shape[1],
                     window_left=window, device=q.device, ctx_shared=True, fwd_kernel=kernel, fwd_tile=tile)
    return lambda: run_forward(q, k, v, k, v, plan.segments, plan.fwd_tiles, plan.fwd_pack,
                               scale=q.shape[2] ** -0.5, window_left=window, kernel=kernel, tile=tile)


LAYOUTS = [([129], [[1, 63, 64, 65, 127]]), ([1, 300], [[1], [129, 2, 257]]), ([1000], [[1000] * 3]),
           ([4097], [[128, 129, 1]]), ([63, 64, 65], [[1, 2], [127], [128, 256]])]


def cases():
    """(head_dim, dtype, layout index, window, layout, q, k, v) of the correctness sweep."""
    for head_dim in sorted(SM90_FWD_TILES):
        for dtype in (torch.bfloat16, torch.float16):
            for li, (prompts, resp) in enumerate(LAYOUTS):
                for window in (-1, 100):
                    layout = GroupLayout.from_lengths(prompts, resp)
                    yield (head_dim, dtype, li, window, layout, *random_inputs(layout, 8, 2, head_dim, dtype, li))


def check(errors: list) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    for head_dim, dtype, li, window, layout, q, k, v in cases():
        ref, ref_lse = shared_prefix_attention(q.double(), k.double(), v.double(), layout,
                                               window_size=(window, 0), return_lse=True)
        errs = {}
        for name, (kernel, tile) in variants(head_dim).items():
            out, lse = forward(q, k, v, layout, kernel, tile, window)()
            torch.cuda.synchronize()
            errs[name] = (float((out.double() - ref).abs().max()),
                          float((lse.double() - ref_lse).abs().max()),
                          bool(torch.isnan(out).any() or torch.isnan(lse).any()))
        for name, (eo, el, nan) in errs.items():
            ok = (not nan and eo <= 2 * errs["mma"][0] + 1e-6 and el <= 2 * errs["mma"][1] + 1e-6)
            errors.append({"head_dim": head_dim, "dtype": str(dtype), "layout": li, "window": window,
                           "variant": name, "out_err": eo, "lse_err": el, "nan": nan, "ok": ok})
    bad = [e for e in errors if not e["ok"]]
    return {"rows": len(errors), "failed": len(bad), "first_failures": bad[:12]}


def check_backward(errors: list) -> dict:
    """dQ, dK, dV of the public function (both families) against the float64 reference."""
    for head_dim, dtype, li, window, layout, q, k, v in cases():
        dout = torch.randn_like(q)
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        ref = shared_prefix_attention(*leaves, layout, window_size=(window, 0))
        ref_grads = torch.autograd.grad(ref, leaves, dout.double())
        errs = {}
        for family in ("mma", "auto"):
            with kernel_family(family):
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                out = dualkv.shared_prefix_attention(*leaves, layout, window_size=(window, 0))
                grads = torch.autograd.grad(out, leaves, dout)
                torch.cuda.synchronize()
            errs[family] = [float((g.double() - r).abs().max()) for g, r in zip(grads, ref_grads)]
            errs[family].append(any(bool(torch.isnan(g).any()) for g in grads))
        got, base = errs["auto"], errs["mma"]
        ok = not got[3] and all(got[i] <= 2 * base[i] + 1e-6 for i in range(3))
        errors.append({"head_dim": head_dim, "dtype": str(dtype), "layout": li, "window": window,
                       "variant": "bwd_sm90", "dq_err": got[0], "dk_err": got[1], "dv_err": got[2],
                       "mma_errs": base[:3], "nan": got[3], "ok": ok})
    bad = [e for e in errors if not e["ok"]]
    return {"rows": len(errors), "failed": len(bad), "first_failures": bad[:12]}


def backward_speed(shapes, reps: int) -> list:
    """Per-kernel backward ms (dQ, dK/dV) of both families at each shape (the mma.sync family's split backward, so
    that its dq + dkdv row is the two kernels timed apart)."""
    rows = []
    for n, p in shapes:
        layout = GroupLayout.single(p, [2048] * n)
        q, k, v = random_inputs(layout, 32, 8, 128, torch.bfloat16, 0)
        scale = 128 ** -0.5
        pairs = useful_pairs(layout)
        plan = make_plan(layout.segment_table, head_dim=128, group_size=4, window_left=-1, device=q.device,
                         ctx_shared=True)
        out, lse = run_forward(q, k, v, k, v, plan.segments, plan.fwd_tiles, plan.fwd_pack, scale=scale,
                               window_left=-1, kernel=plan.fwd_kernel)
        dout = torch.randn_like(q)
        for family in ("mma", "auto"):
            with kernel_family(family), mma_backward("split"):
                for kernels in (("dq",), ("dkdv",), ("dq", "dkdv")):
                    ms = time_ms(lambda: run_backward(dout, q, k, v, k, v, out, lse, plan.segments, plan.dq_tiles,
                                                      plan.key_tiles, plan.dq_pack, True, scale=scale,
                                                      window_left=-1, kernels=kernels,
                                                      dkdv_key_tiles_t=plan.dkdv_key_tiles,
                                                      ws_first_tiles=plan.ws_first_tiles), "cuda", reps)[0]
                    row = {"N": n, "P": p, "system": f"{family}:{'+'.join(kernels)}", "ms": round(ms, 2)}
                    if len(kernels) == 2:
                        row["tflops"] = round(attention_flops(pairs, 32, 128, "bwd") / ms / 1e9, 1)
                    rows.append(row)
                    print(row, flush=True)
    return rows


def speed(shapes, reps: int) -> list:
    rows = []
    for n, p in shapes:
        layout = GroupLayout.single(p, [2048] * n)
        q, k, v = random_inputs(layout, 32, 8, 128, torch.bfloat16, 0)
        flops = attention_flops(useful_pairs(layout), 32, 128, "fwd")
        for name, (kernel, tile) in variants(128).items():
            ms = time_ms(forward(q, k, v, layout, kernel, tile), "cuda", reps)[0]
            rows.append({"N": n, "P": p, "system": name, "ms": round(ms, 2), "tflops": round(flops / ms / 1e9, 1)})
            print(rows[-1], flush=True)
        for r in bench_shape(n, p, 2048, ["cascade", "flex"], modes=["fwd"], reps=reps):
            rows.append({"N": n, "P": p, "system": r.system, "ms": r.ms and round(r.ms, 2),
                         "tflops": r.tflops and round(r.tflops, 1)})
            print(rows[-1], flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16:32768,28:4096")
    ap.add_argument("--parts", default="check,check_bwd,speed,bwd_speed")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    parts = args.parts.split(",")
    shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",")]
    result = {"device": torch.cuda.get_device_name(0), "time": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())}
    errors: list = []
    for part, fn in (("check", check), ("check_bwd", check_backward)):
        if part not in parts:
            continue
        t0 = time.time()
        try:
            result[part] = fn(errors)
        except Exception as err:  # keep going to the timings: a crash here is itself the finding
            import traceback
            result[part] = {"crash": traceback.format_exc()[-3000:]}
        result[part + "_s"] = round(time.time() - t0, 1)
        print(part, json.dumps(result[part], indent=1)[:5000], flush=True)
    result["speed"] = []
    if "speed" in parts:
        result["speed"] += speed(shapes, args.reps)
    if "bwd_speed" in parts:
        result["speed"] += backward_speed(shapes, args.reps)
    Path(args.out, "wgmma_check.json").write_text(json.dumps({**result, "errors": errors}, indent=1))
    print("\n| N | P | system | ms | TFLOP/s |")
    for r in result["speed"]:
        print(f"| {r['N']} | {r['P']} | {r['system']} | {r['ms']} | {r.get('tflops')} |")


if __name__ == "__main__":
    main()
