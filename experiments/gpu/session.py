"""One GPU session: environment, compile every kernel, GPU tests, baseline agreement, benchmark, short table.

PYTHONUNBUFFERED=1 PYTHONPATH=. python3 experiments/gpu/session.py [--tests PATTERN] [--shapes N:P,...] [--modes ...]
Writes $OUT/session.json and the benchmark JSON under $OUT.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

import torch

sys.path.insert(0, os.getcwd())
OUT = os.environ.get("OUT", ".")
report = {"steps": {}}


def step(name, fn):
    t = time.time()
    try:
        report["steps"][name] = {"result": fn(), "seconds": round(time.time() - t, 1)}
    except Exception as err:
        report["steps"][name] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()[-3000:],
                                 "seconds": round(time.time() - t, 1)}
    text = json.dumps(report["steps"][name])
    print(f"== {name} ({report['steps'][name]['seconds']} s): {text[:3000]}", flush=True)


def env():
    import cuda.core

    from dualkv.cuda.build import nvrtc_version  # (loads $DUALKV_NVRTC_LIB's first, as the kernels would)

    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_core": cuda.core.__version__, "nvrtc": nvrtc_version()}


def compile_all():
    proc = subprocess.run([sys.executable, "-m", "dualkv", "kernels", "--arch", "sm_90", "--no-progress", "--jobs",
                           "12"], capture_output=True, text=True)
    return proc.stdout[-300:] + proc.stderr[-3000:]


def tests(pattern, timeout):
    def run():
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                               "-p", "no:logging", "--tb=short", "--maxfail=8", *pattern.split()],
                              capture_output=True, text=True, timeout=timeout)
        tail = proc.stdout[-7000:]
        return {"rc": proc.returncode, "tail": tail + proc.stderr[-1500:]}
    return run


def tune(shape=(16, 32768)):
    """Per-kernel times at one shape for candidate tiles (fwd, dQ, dK/dV)."""
    from dualkv import GroupLayout
    from dualkv.bench.kernel import random_inputs, time_ms
    from dualkv.cuda.configs import KeyTileConfig, TileConfig
    from dualkv.cuda.launch import make_plan, run_backward, run_forward

    n, p = shape
    layout = GroupLayout.single(p, [2048] * n)
    q, k, v = random_inputs(layout, 32, 8, 128, torch.bfloat16, 0)
    scale = 128 ** -0.5
    res = {}
    plan = make_plan(layout.segment_table, head_dim=128, group_size=4, window_left=-1, device=q.device,
                     ctx_shared=True)
    out, lse = run_forward(q, k, v, k, v, plan.segments, plan.fwd_tiles, plan.fwd_pack, scale=scale, window_left=-1,
                           kernel=plan.fwd_kernel)
    dout = torch.randn_like(q)
    res[f"fwd_default ({plan.fwd_kernel})"] = time_ms(lambda: run_forward(
        q, k, v, k, v, plan.segments, plan.fwd_tiles, plan.fwd_pack, scale=scale, window_left=-1,
        kernel=plan.fwd_kernel), 'cuda', 5)[0]
    res["fwd mma.sync"] = time_ms(lambda: run_forward(q, k, v, k, v, plan.segments, plan.fwd_tiles, plan.fwd_pack,
                                                      scale=scale, window_left=-1, kernel="fwd"), 'cuda', 5)[0]
    candidates = [("dq", t) for t in (TileConfig(32, 4, 2), TileConfig(64, 4, 2), TileConfig(32, 8, 1),
                                      TileConfig(64, 8, 1))]
    candidates += [("dkdv", t) for t in (KeyTileConfig(64, 8, 1, 2), KeyTileConfig(32, 8, 1, 2),
                                         KeyTileConfig(64, 4, 1, 2), KeyTileConfig(128, 8, 2, 1),
                                         KeyTileConfig(64, 8, 2, 2))]
    for kernel, tile in candidates:  # one backward kernel at a time, with a plan built for its tile
        override = {f"{kernel}_tile": tile}
        try:
            pl = make_plan(layout.segment_table, head_dim=128, group_size=4, window_left=-1, device=q.device,
                           ctx_shared=True, **override)
            res[f"{kernel} {tile}"] = time_ms(lambda: run_backward(
                dout, q, k, v, k, v, out, lse, pl.segments, pl.dq_tiles, pl.key_tiles, pl.dq_pack, True, scale=scale,
                window_left=-1, kernels=(kernel,), dkdv_key_tiles_t=pl.dkdv_key_tiles, ws_first_tiles=pl.ws_first_tiles,
                **override), "cuda", 5)[0]
        except Exception as err:
            res[f"{kernel} {tile}"] = repr(err)[:200]
    return {k2: (round(v2, 2) if isinstance(v2, float) else v2) for k2, v2 in res.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", default="proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_backward.py")
    ap.add_argument("--test-timeout", type=int, default=360)
    ap.add_argument("--shapes", default="16:32768,28:4096")
    ap.add_argument("--modes", default="fwd,bwd,fwdbwd")
    ap.add_argument("--systems", default="dualkv,cascade,flex,fa2_ncopy")
    ap.add_argument("--varying", type=int, default=0)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--skip", default="")
    ap.add_argument("--verify", action="store_true", help="also run `dualkv verify` (JSON under $OUT)")
    args = ap.parse_args()
    skip = set(args.skip.split(","))

    step("env", env)
    if "compile" not in skip:
        step("compile", compile_all)
    if "tests" not in skip:
        step("tests", tests(args.tests, args.test_timeout))
    from dualkv.bench import kernel as kb

    if args.verify:
        def verify():
            proc = subprocess.run([sys.executable, "-m", "dualkv", "verify", "--no-progress", "--json",
                                   os.path.join(OUT, "verify.json")], capture_output=True, text=True, timeout=400)
            lines = proc.stdout.strip().splitlines()
            return {"rc": proc.returncode, "summary": lines[-2:] if lines else [], "failed": [
                l for l in lines if l.rstrip().endswith("FAIL")][:20], "stderr": proc.stderr[-1000:]}
        step("verify", verify)
    if "tune" not in skip:
        step("tune", tune)
    if "agree" not in skip:
        step("agree", lambda: kb.check_systems_agree(args.systems.split(",")))
    rows = []

    def bench():
        shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",") if s]
        for n, p in shapes:
            rows.extend(kb.bench_shape(n, p, 2048, args.systems.split(","), modes=args.modes.split(","), reps=args.reps))
            print(kb.format_rows(rows[-len(args.systems.split(",")) * len(args.modes.split(",")):]), flush=True)
        return len(rows)

    if "bench" not in skip:
        step("bench", bench)
    extra = {}
    if args.varying:
        step("varying", lambda: kb.bench_varying(args.systems.split(","), count=args.varying))
        extra["varying"] = report["steps"]["varying"].get("result")
    if rows:
        kb.write_results(rows, os.path.join(OUT, "kernel_bench.json"), extra)
    with open(os.path.join(OUT, "session.json"), "w") as fh:
        json.dump(report, fh, indent=2, default=str)
    print("\n==== summary")
    for name, res in report["steps"].items():
        print(f"{name:10s} {res['seconds']:7.1f}s", "ERROR " + res["error"][:200] if "error" in res else "ok")
    if rows:
        print(kb.format_rows(rows))


main()
