"""Is the kernel bench's FlexAttention baseline as fast as FlexAttention can be at one shape?

The shared notes measured FlexAttention fwd+bwd at (16, 32K) well below what ``dualkv bench kernel`` measures for
its ``flex`` system. This times, at one shape and in one process, FlexAttention set up several ways:

* ``bench``        — the kernel bench's ``flex`` system: (T, H, d) leaves viewed as (1, H, T, d), group+segment
                     mask_mod, backward by ``autograd.grad(retain_graph=True)`` of one forward;
* ``contig``       — contiguous (1, H, T, d) leaves, the same mask_mod, a fresh forward + ``backward`` per call;
* ``contig_seg``   — as ``contig`` with a segment-only int32 mask_mod (one group: no group lookup);
* ``dualkv``       — the default dualkv kernels, same inputs (for the ratio).

PYTHONUNBUFFERED=1 PYTHONPATH=. python3 experiments/gpu/flex_check.py [--N 16 --P 32768] ; JSON to $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from dualkv import GroupLayout
from dualkv.analysis import attention_flops, useful_pairs
from dualkv.bench.baselines import SYSTEMS
from dualkv.bench.kernel import random_inputs, time_ms
from dualkv.bench.systems import flex_mask


def segment_only_mask_mod(group: torch.Tensor, segment: torch.Tensor):
    seg = segment.to(torch.int32)

    def mask_mod(b, h, q, kv):
        return (kv <= q) & ((seg[kv] == 0) | (seg[kv] == seg[q]))

    return mask_mod


def contiguous_flex(q, k, v, layout, dout, mask_mod_fn):
    """(fwd call, fwd+bwd call) of FlexAttention over contiguous (1, H, T, d) copies of q, k, v."""
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention)
    block_mask = flex_mask(layout, q.device, mask_mod_fn=mask_mod_fn).block_mask
    qc, kc, vc = (x.transpose(0, 1).unsqueeze(0).contiguous().requires_grad_(q.is_cuda) for x in (q, k, v))
    doutc = dout.transpose(0, 1).unsqueeze(0).contiguous()
    scale = q.shape[-1] ** -0.5

    def fwd():
        with torch.no_grad():
            return flex(qc, kc, vc, block_mask=block_mask, scale=scale, enable_gqa=True)

    def fwdbwd():
        qc.grad = kc.grad = vc.grad = None
        flex(qc, kc, vc, block_mask=block_mask, scale=scale, enable_gqa=True).backward(doutc)

    return fwd, fwdbwd, lambda: fwd()[0].transpose(0, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--N", type=int, default=16)
    ap.add_argument("--P", type=int, default=32768)
    ap.add_argument("--R", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (tiny shapes)")
    args = ap.parse_args()
    torch._functorch.config.donated_buffer = False
    layout = GroupLayout.single(args.P, [args.R] * args.N)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    q, k, v = random_inputs(layout, 32, 8, 128, dtype, 0, args.device)
    dout = torch.randn_like(q)
    pairs = useful_pairs(layout)
    rows, outputs = [], {}

    def record(name, mode, fn):
        t = time.time()
        ms, peak = time_ms(fn, args.device, args.reps)
        tf = attention_flops(pairs, 32, 128, mode) / (ms * 1e-3) / 1e12
        rows.append({"variant": name, "mode": mode, "ms": ms, "tflops": tf, "peak_mem_gib": peak,
                     "wall_s": round(time.time() - t, 1)})
        print(f"{name:12s} {mode:7s} {ms:9.2f} ms {tf:6.1f} TF {peak or 0:6.1f} GiB ({rows[-1]['wall_s']} s)", flush=True)

    for name, label in (("dualkv", "dualkv"), ("flex", "bench")):
        system = SYSTEMS[name](q, k, v, layout)
        system.prepare()
        with torch.no_grad():
            outputs[label] = system.forward(False).float()
        record(label, "fwd", lambda: system.forward(False))
        if args.device != "cuda":       # FlexAttention has no CPU backward
            continue
        system.forward(True)
        record(label, "bwd", lambda: system.backward(dout))
        record(label, "fwdbwd", lambda: (system.forward(True), system.backward(dout)))
        del system
    from dualkv.bench.systems import shared_prompt_mask_mod

    for name, mask_fn in (("contig", shared_prompt_mask_mod), ("contig_seg", segment_only_mask_mod)):
        fwd, fwdbwd, out = contiguous_flex(q, k, v, layout, dout, mask_fn)
        outputs[name] = out().float()
        record(name, "fwd", fwd)
        if args.device == "cuda":
            record(name, "fwdbwd", fwdbwd)
    agree = {name: float((o - outputs["dualkv"]).abs().max()) for name, o in outputs.items()}
    print("max |out - dualkv|:", agree)
    result = {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__, "commit": os.environ.get("DUALKV_COMMIT"),
              "N": args.N, "P": args.P, "R": args.R, "rows": rows, "max_abs_diff_vs_dualkv": agree}
    with open(os.path.join(os.environ.get("OUT", "."), f"flex-check-{args.N}-{args.P}.json"), "w") as fh:
        json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
