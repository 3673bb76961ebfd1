"""First GPU session for the forward kernel: environment, compile, GPU tests, baseline agreement, quick timings.

Run on the GPU box: PYTHONUNBUFFERED=1 PYTHONPATH=. python3 experiments/gpu/smoke_forward.py
Writes $OUT/smoke_forward.json (or ./smoke_forward.json).
"""

import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
OUT = os.environ.get("OUT", ".")
report = {"steps": {}}


def step(name, fn):
    t = time.time()
    try:
        report["steps"][name] = {"result": fn(), "seconds": round(time.time() - t, 1)}
    except Exception as err:  # keep going: one call, many answers
        import traceback

        report["steps"][name] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()[-3000:],
                                 "seconds": round(time.time() - t, 1)}
    print(f"== {name}: {json.dumps(report['steps'][name])[:1500]}", flush=True)


def env():
    import cuda.core
    from cuda.bindings import nvrtc

    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_core": cuda.core.__version__, "nvrtc": nvrtc.nvrtcVersion()[1:],
            "sm": torch.cuda.get_device_capability()}


def compile_all():
    proc = subprocess.run([sys.executable, "-m", "dualkv", "kernels", "--arch", "sm_90", "--no-progress",
                           "--jobs", "8"], capture_output=True, text=True)
    return proc.stdout[-500:] + proc.stderr[-2000:]


def gpu_tests():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-m", "gpu", "proofs_tests/test_cuda_forward.py",
                           "-p", "no:cacheprovider"], capture_output=True, text=True, timeout=420)
    return proc.stdout[-6000:] + proc.stderr[-2000:]


def agree():
    from dualkv.bench.kernel import check_systems_agree

    return check_systems_agree(["dualkv", "fa2_ncopy", "cascade", "flex"])


def timings():
    from dualkv import GroupLayout
    from dualkv.bench.baselines import SYSTEMS
    from dualkv.bench.kernel import _inputs, cuda_time_ms

    rows = []
    for n, p in ((16, 32768), (28, 4096)):
        layout = GroupLayout.single(p, [2048] * n)
        q, k, v = _inputs(layout, 32, 8, 128, torch.bfloat16, 0)
        for name in ("dualkv", "cascade", "flex", "fa2_ncopy"):
            try:
                with torch.no_grad():
                    s = SYSTEMS[name](q, k, v, layout)
                    s.prepare()
                    ms = cuda_time_ms(s.forward, reps=8)
                rows.append((name, n, p, round(ms, 3)))
            except Exception as err:
                rows.append((name, n, p, f"{type(err).__name__}: {str(err)[:200]}"))
            s = None
            torch.cuda.empty_cache()
    return rows


def tile_sweep():
    """dualkv forward at (16, 32K) for candidate d=128 tiles and head packings."""
    from dualkv import GroupLayout
    from dualkv.bench.kernel import _inputs, cuda_time_ms
    from dualkv.cuda.configs import TileConfig
    from dualkv.cuda.forward import attention_forward, make_plan

    layout = GroupLayout.single(32768, [2048] * 16)
    q, k, v = _inputs(layout, 32, 8, 128, torch.bfloat16, 0)
    out = []
    for tile in (TileConfig(64, 4, 2), TileConfig(64, 8, 1), TileConfig(32, 4, 2), TileConfig(128, 8, 1)):
        for pack in (1, 4):
            plan = make_plan(layout.segment_table, head_dim=128, dtype=q.dtype, group_size=4, window_left=-1,
                             device=q.device, tile=tile, pack=pack)
            try:
                ms = cuda_time_ms(lambda: attention_forward(q, k, v, k, v, plan, scale=128 ** -0.5, window_left=-1),
                                  reps=6)
                out.append((str(tile), pack, round(ms, 3)))
            except Exception as err:
                out.append((str(tile), pack, f"{type(err).__name__}: {str(err)[:300]}"))
    return out


step("env", env)
step("compile", compile_all)
step("gpu_tests", gpu_tests)
step("agree", agree)
step("timings", timings)
step("tile_sweep", tile_sweep)
with open(os.path.join(OUT, "smoke_forward.json"), "w") as fh:
    json.dump(report, fh, indent=2)
print("\n==== summary")
for name, res in report["steps"].items():
    print(name, res.get("seconds"), "ERROR" if "error" in res else "ok")
