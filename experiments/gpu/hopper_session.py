"""GPU session for the Hopper kernel issue: checks and times the warp-specialised kernels, the cuDNN cascade and the
other exact peers in ONE process, and writes one JSON file.

Sections (``--sections``, comma list):
  cudnn    the cuDNN parts' conventions the cascade relies on: natural-log LSE (against float64), the backward with
           a supplied (merged) LSE, and whether its backward is bitwise deterministic run to run;
  variants the warp-specialised forward's variants (stages, ping-pong) against the default one, bitwise and timed;
  fwd      forward ms of every forward kernel and of the cascades at ``--shapes``;
  table    fwd / bwd / fwd+bwd of ``--systems`` at ``--shapes`` (min / median / max of ``--reps`` runs).

    python experiments/gpu/hopper_session.py --sections cudnn,variants,fwd,table --shapes 16:32768,8:8192
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from dualkv import GroupLayout  # noqa: E402
from dualkv.analysis import attention_flops, useful_pairs  # noqa: E402
from dualkv.bench.harness import environment  # noqa: E402
from dualkv.bench.kernel import bench_shape, format_rows, random_inputs, time_runs  # noqa: E402
from dualkv.cuda.configs import FWD_TILES, SM90_FWD_TILES, SM90_WS_FWD_TILES  # noqa: E402
from dualkv.cuda.launch import make_plan, run_forward  # noqa: E402


def _shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in s.split(":")) for s in text.split(",") if s]


def cudnn_section(out: dict) -> None:
    from dualkv.cascade import CudnnEngine, ReferenceEngine

    eng, ref = CudnnEngine(), ReferenceEngine()
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 8, 300, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(2, 2, 300, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    res = {}
    for causal in (True, False):
        o, lse, st = eng.forward(q, k, v, causal, 128 ** -0.5)
        o64, lse64, _ = ref.forward(q.double(), k.double(), v.double(), causal, 128 ** -0.5)
        res[f"lse_max_abs_err_causal{int(causal)}"] = (eng.rows(lse).double() - lse64).abs().max().item()
        res[f"out_max_abs_err_causal{int(causal)}"] = (o.double() - o64).abs().max().item()
        res["lse_shape"] = list(lse.shape)
        dout = torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=g)
        runs = [eng.backward(dout, q, k, v, o, lse, st, causal, 128 ** -0.5) for _ in range(3)]
        res[f"bwd_bitwise_deterministic_causal{int(causal)}"] = all(
            torch.equal(a, b) for r in runs[1:] for a, b in zip(r, runs[0]))
        g64 = ref.backward(dout.double(), q.double(), k.double(), v.double(), o.double(), lse64, None, causal,
                           128 ** -0.5)
        res[f"bwd_max_abs_err_causal{int(causal)}"] = [(a.double() - b).abs().max().item()
                                                       for a, b in zip(runs[0], g64)]
    out["cudnn"] = res
    print("cudnn:", json.dumps(res), flush=True)


def _forward_fn(q, k, v, layout, kernel, tile):
    plan = make_plan(layout.segment_table, head_dim=q.shape[2], group_size=q.shape[1] // k.shape[1], window_left=-1,
                     device=q.device, ctx_shared=True, fwd_kernel=kernel, fwd_tile=tile)
    return lambda: run_forward(q, k, v, k, v, plan.segments, plan.fwd_tiles, plan.fwd_pack, scale=q.shape[2] ** -0.5,
                               window_left=-1, kernel=kernel, tile=tile)


def forward_kernels(head_dim: int) -> dict:
    ws = SM90_WS_FWD_TILES[head_dim]
    kinds = {"mma": ("fwd", FWD_TILES[head_dim]), "wgmma_v1": ("fwd_sm90", SM90_FWD_TILES[head_dim])}
    for stages in (2, 3):
        for pp in (False, True):
            kinds[f"ws_s{stages}{'_pp' if pp else ''}"] = ("fwd_sm90_ws", replace(ws, stages=stages, pingpong=pp))
    return kinds


def variants_section(out: dict, shapes) -> None:
    """Every warp-specialised variant against the default forward on the same inputs, plus odd layouts."""
    rows = []
    layouts = [GroupLayout.from_lengths([129], [[1, 63, 64, 65, 127]]), GroupLayout.from_lengths([1, 300], [[1], [129, 2, 257]]),
               GroupLayout.from_lengths([4097], [[128, 129, 1]])]
    for head_dim in sorted(SM90_WS_FWD_TILES):
        for group in (1, 4, 8):
            for li, layout in enumerate(layouts):
                q, k, v = random_inputs(layout, 8, 8 // group, head_dim, torch.bfloat16, li)
                ref = _forward_fn(q, k, v, layout, "fwd_sm90", SM90_FWD_TILES[head_dim])()
                for name, (kernel, tile) in forward_kernels(head_dim).items():
                    o, lse = _forward_fn(q, k, v, layout, kernel, tile)()
                    rows.append({"head_dim": head_dim, "group": group, "layout": li, "variant": name,
                                 "out_max_abs_diff": (o.float() - ref[0].float()).abs().max().item(),
                                 "lse_max_abs_diff": (lse - ref[1]).abs().max().item(),
                                 "finite": bool(torch.isfinite(o).all())})
    out["variants"] = rows
    worst = max(r["out_max_abs_diff"] for r in rows)
    print(f"variants: {len(rows)} rows, worst out diff vs wgmma_v1 {worst:.3g}, all finite "
          f"{all(r['finite'] for r in rows)}", flush=True)


def _grads(q, k, v, layout, dout, family):
    import dualkv
    from dualkv.cuda.configs import kernel_family

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with kernel_family(family):
        out = dualkv.shared_prefix_attention(*leaves, layout)
        return [out.detach()] + list(torch.autograd.grad(out, leaves, dout))


def bwd_section(out: dict, shapes, reps: int) -> None:
    """The fused warp-specialised backward against the first wgmma backward and float64; determinism; timing."""
    from dualkv.reference import shared_prefix_attention as reference

    rows = []
    layouts = [GroupLayout.from_lengths([129], [[1, 63, 64, 65, 127]]), GroupLayout.from_lengths([1, 300], [[1], [129, 2, 257]]),
               GroupLayout.from_lengths([4097], [[128, 129, 1]]), GroupLayout.from_lengths([700, 65], [[300, 1000], [64]])]
    for group in (1, 4, 8):
        for li, layout in enumerate(layouts):
            q, k, v = random_inputs(layout, 8, 8 // group, 128, torch.bfloat16, li)
            dout = torch.randn_like(q)
            ws = _grads(q, k, v, layout, dout, "auto")
            v1 = _grads(q, k, v, layout, dout, "wgmma_v1")
            leaves = [t.double().requires_grad_() for t in (q, k, v)]
            ref_out = reference(*leaves, layout)
            ref = [ref_out.detach()] + list(torch.autograd.grad(ref_out, leaves, dout.double()))
            row = {"group": group, "layout": li}
            for name, a, b, r in zip(("out", "dq", "dk", "dv"), ws, v1, ref):
                scale_ = r.abs().max().item() or 1.0
                row[f"{name}_ws_err"] = (a.double() - r).abs().max().item() / scale_
                row[f"{name}_v1_err"] = (b.double() - r).abs().max().item() / scale_
                row[f"{name}_finite"] = bool(torch.isfinite(a).all())
            rows.append(row)
            print("bwd check", json.dumps(row), flush=True)
    out["bwd_checks"] = rows
    layout = GroupLayout.from_lengths([5000], [[700, 129, 2048, 1]])
    q, k, v = random_inputs(layout, 32, 8, 128, torch.bfloat16, 3)
    dout = torch.randn_like(q)
    runs = [_grads(q, k, v, layout, dout, "auto") for _ in range(3)]
    out["bwd_bitwise_deterministic"] = all(torch.equal(a, b) for r in runs[1:] for a, b in zip(r, runs[0]))
    print("bwd deterministic:", out["bwd_bitwise_deterministic"], flush=True)
    timing = []
    for n, p in shapes:
        layout = GroupLayout.single(p, [2048] * n)
        pairs = useful_pairs(layout)
        q, k, v = (t.requires_grad_() for t in random_inputs(layout, 32, 8, 128, torch.bfloat16, 0))
        dout = torch.randn_like(q)
        for family in ("auto", "wgmma_v1"):
            import dualkv
            from dualkv.cuda.configs import kernel_family

            with kernel_family(family):
                o = dualkv.shared_prefix_attention(q, k, v, layout)
                t = time_runs(lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True), "cuda", reps)
            timing.append({"N": n, "P": p, "family": family, "ms": t.ms, "ms_min": min(t.ms_runs),
                           "ms_max": max(t.ms_runs), "tflops": attention_flops(pairs, 32, 128, "bwd") / t.ms / 1e9,
                           "peak_gib": t.peak_mem_gib})
            print(f"bwd N={n} P={p} {family:<9} {t.ms:8.2f} ms {timing[-1]['tflops']:6.1f} TF", flush=True)
        del q, k, v, dout, o
        torch.cuda.empty_cache()
    out["bwd_timing"] = timing


def fwd_section(out: dict, shapes, reps: int) -> None:
    rows = []
    for n, p in shapes:
        layout = GroupLayout.single(p, [2048] * n)
        pairs = useful_pairs(layout)
        q, k, v = random_inputs(layout, 32, 8, 128, torch.bfloat16, 0)
        for name, (kernel, tile) in forward_kernels(128).items():
            t = time_runs(_forward_fn(q, k, v, layout, kernel, tile), "cuda", reps)
            rows.append({"N": n, "P": p, "kernel": name, "ms": t.ms, "ms_min": min(t.ms_runs),
                         "ms_max": max(t.ms_runs), "tflops": attention_flops(pairs, 32, 128, "fwd") / t.ms / 1e9})
            print(f"fwd N={n} P={p} {name:<10} {t.ms:8.2f} ms {rows[-1]['tflops']:6.1f} TF", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    out["fwd"] = rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sections", default="cudnn,variants,fwd,table")
    ap.add_argument("--shapes", default="16:32768,8:8192,28:4096")
    ap.add_argument("--systems", default="dualkv,dualkv_v1,cudnn_cascade,cascade,flex")
    ap.add_argument("--modes", default="fwd,bwd,fwdbwd")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--tag", default="hopper")
    args = ap.parse_args()
    sections = args.sections.split(",")
    shapes = _shapes(args.shapes)
    result = {"environment": environment(torch.device("cuda")), "args": vars(args)}
    stamp = time.strftime("%Y%m%dT%H%MZ", time.gmtime())
    gpu = torch.cuda.get_device_name().split()[-1].lower()
    path = Path(args.out) / f"{args.tag}-{gpu}-{stamp}.json"

    def save():
        path.write_text(json.dumps(result, indent=1, default=str))

    for name, fn in (("cudnn", lambda: cudnn_section(result)), ("bwd", lambda: bwd_section(result, shapes, args.reps)),
                     ("variants", lambda: variants_section(result, shapes)),
                     ("fwd", lambda: fwd_section(result, shapes, args.reps))):
        if name in sections:
            try:
                fn()
            except Exception as err:  # keep the other sections' results
                result[f"{name}_error"] = repr(err)
                print(f"{name} FAILED: {err!r}", flush=True)
            save()
    if "table" in sections:
        rows = []
        for n, p in shapes:
            rows += bench_shape(n, p, 2048, args.systems.split(","), modes=args.modes.split(","), reps=args.reps)
            result["table"] = [asdict(r) for r in rows]
            save()
        print(format_rows(rows))
    save()
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
