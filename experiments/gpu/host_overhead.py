"""How much of a pass's CUDA-event time is the GPU waiting for the host: for dualkv and the cuDNN cascade, each
pass (forward, backward) is timed three ways, median of ``--reps``:

* ``events_ms``: CUDA events around the call, the GPU idle before it (what ``dualkv bench kernel`` reports);
* ``gpu_ms``: the same call queued behind a ~``--sleep-ms`` GPU sleep, so the host has launched everything before
  the GPU reaches it: the GPU time alone;
* ``host_ms``: the host's wall time to return from the call while the GPU is busy (launch cost, Python work).

Caveat: on an H100 ``events_ms - gpu_ms`` came out larger than ``host_ms`` (3.8-5.8 against 1.0-2.0 ms at (16, 32K)),
so the gap is not host time alone; the GPU sleep before each ``gpu_ms`` run likely also changes clocks or power
headroom, which would make ``gpu_ms`` optimistic. Compare systems within one column, not across columns.

    python3 experiments/gpu/host_overhead.py --shapes 16:32768,4:1024 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402


def _sleep_cycles(ms: float) -> int:
    """GPU clock cycles of about ``ms`` milliseconds (torch.cuda._sleep spins for cycles)."""
    props = torch.cuda.get_device_properties(0)
    rate_khz = getattr(props, "clock_rate", 1_700_000) or 1_700_000
    return int(ms * rate_khz)


def _three_ways(fn, reps: int, sleep_ms: float) -> dict:
    cycles = _sleep_cycles(sleep_ms)
    events, gpu, host = [], [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        events.append(a.elapsed_time(b))
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        a.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        b.record()
        torch.cuda.synchronize()
        gpu.append(a.elapsed_time(b))
    return {"events_ms": statistics.median(events), "gpu_ms": statistics.median(gpu),
            "host_ms": statistics.median(host), "host_max_ms": max(host)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16:32768,4:1024", help="N:P,...")
    ap.add_argument("--systems", default="dualkv,cudnn")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sleep-ms", type=float, default=60.0)
    ap.add_argument("--out", default="/tmp")
    args = ap.parse_args()
    import dualkv
    from dualkv import cascade
    from dualkv.bench.kernel import random_inputs

    fns = {"dualkv": dualkv.shared_prefix_attention, "cudnn": cascade.shared_prefix_attention}
    rows = []
    for shape in args.shapes.split(","):
        n, p = (int(x) for x in shape.split(":"))
        layout = dualkv.GroupLayout.single(p, [2048] * n)
        q, k, v = (t.requires_grad_() for t in random_inputs(layout, 32, 8, 128, torch.bfloat16, 0))
        dout = torch.randn_like(q)
        for name in args.systems.split(","):
            fn = fns[name]

            def forward():
                with torch.no_grad():
                    return fn(q, k, v, layout)

            for _ in range(2):
                forward()
            fwd = _three_ways(forward, args.reps, args.sleep_ms)
            out = fn(q, k, v, layout)

            def backward():
                return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

            for _ in range(2):
                backward()
            bwd = _three_ways(backward, args.reps, args.sleep_ms)
            rows.append({"system": name, "N": n, "P": p, "fwd": fwd, "bwd": bwd})
            print(f"{name:7s} ({n}, {p}) fwd events {fwd['events_ms']:8.3f} gpu {fwd['gpu_ms']:8.3f} host "
                  f"{fwd['host_ms']:6.3f} | bwd events {bwd['events_ms']:8.3f} gpu {bwd['gpu_ms']:8.3f} host "
                  f"{bwd['host_ms']:6.3f} ms", flush=True)
            del out
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    Path(args.out, "host_overhead.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
