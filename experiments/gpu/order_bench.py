"""The backward's launch and dQ orders on a GPU: dualkv fwd+bwd (and fwd alone) under each
``DUALKV_KEY_TILE_ORDER`` / ``DUALKV_TREE_DQ_ORDER`` / ``DUALKV_TWO_LEVEL_DQ_ORDER`` setting, one child process per
setting (all are read at import), same layouts and inputs, in one run.

Layouts (H=32, H_k=8, d=128, bf16): micro-batches of several groups, where the heaviest-first table interleaves the
groups' prompt blocks (``4x8K``: 4 groups of P=8K, N=8, R=2K; ``8x4K``: 8 groups of P=4K), one group
(``1x32K``: P=32K, N=16; ``1x8K``: P=8K, N=8), and the issue #14 trees (``tree-a``, ``tree-c``). The key-tile order
changes no result bit (the dQ ranks fix the adds' order): every setting's gradients are compared bitwise with the
first setting's ("=" in the table) and checked finite; another tree dQ order adds a tree's dQ in another order, and
another two-level dQ order a two-level layout's, so those rows' dQ differ in rounding ("dq≠" expected there, and
only there).

    python experiments/gpu/order_bench.py --settings heaviest,node,node+root,node+root+shared --reps 10 --out $OUT
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

#: setting name -> environment (the key-tile order, the dQ orders, the warp-specialised backward's CTA order)
SETTINGS = {"heaviest": {"DUALKV_KEY_TILE_ORDER": "heaviest", "DUALKV_TREE_DQ_ORDER": "nearest",
                         "DUALKV_TWO_LEVEL_DQ_ORDER": "own"},
            "node": {"DUALKV_KEY_TILE_ORDER": "node", "DUALKV_TREE_DQ_ORDER": "nearest",
                     "DUALKV_TWO_LEVEL_DQ_ORDER": "own"},
            "node+root": {"DUALKV_KEY_TILE_ORDER": "node", "DUALKV_TREE_DQ_ORDER": "root",
                          "DUALKV_TWO_LEVEL_DQ_ORDER": "own"},
            "node+root+shared": {"DUALKV_KEY_TILE_ORDER": "node", "DUALKV_TREE_DQ_ORDER": "root",
                                 "DUALKV_TWO_LEVEL_DQ_ORDER": "shared"},
            # the warp-specialised backward's CTAs one KV head's whole table at a time (a launch order: same bits)
            "node+root+headmajor": {"DUALKV_KEY_TILE_ORDER": "node", "DUALKV_TREE_DQ_ORDER": "root",
                                    "DUALKV_TWO_LEVEL_DQ_ORDER": "own", "DUALKV_WS_CTA_ORDER": "head"}}
for _env in SETTINGS.values():  # no debug macros leak from the caller's environment into another setting
    _env.setdefault("DUALKV_EXTRA_DEFINES", "")
    _env.setdefault("DUALKV_WS_CTA_ORDER", "tile")  # the order every setting but headmajor was first measured in


def layouts() -> dict:
    from dualkv import GroupLayout
    from dualkv.analysis.trees import multi_turn_workload, system_prompt_workload

    return {"4x8K": GroupLayout.from_lengths([8192] * 4, [[2048] * 8] * 4),
            "8x4K": GroupLayout.from_lengths([4096] * 8, [[2048] * 8] * 8),
            "1x32K": GroupLayout.single(32768, [2048] * 16), "1x8K": GroupLayout.single(8192, [2048] * 8),
            "tree-a": system_prompt_workload(), "tree-c": multi_turn_workload()}


def child(args) -> int:
    """One setting (the environment is already set): time every layout, save gradients' checksums."""
    import dualkv
    from dualkv.bench.harness import environment, measure
    from dualkv.cuda import configs

    rows = []
    built = layouts()
    for name in args.layouts.split(","):
        layout = built[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(layout.total_tokens, h, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                   .requires_grad_() for h in (32, 8, 8))
        dout = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=gen)

        def fwd():
            return dualkv.shared_prefix_attention(q, k, v, layout)

        def step():
            torch.autograd.grad(fwd(), (q, k, v), dout)

        grads = torch.autograd.grad(fwd(), (q, k, v), dout)
        device = torch.device("cuda")
        t_step = measure(step, device, warmup=args.warmup, reps=args.reps)
        t_fwd = measure(fwd, device, warmup=args.warmup, reps=args.reps)
        rows.append({"layout": name, "tokens": layout.total_tokens, "median_ms": t_step.ms,
                     "min_ms": min(t_step.ms_runs), "max_ms": max(t_step.ms_runs), "fwd_median_ms": t_fwd.ms,
                     "bwd_ms_median_difference": t_step.ms - t_fwd.ms, "peak_mem_gib": t_step.peak_mem_gib,
                     "finite": all(bool(torch.isfinite(g).all()) for g in grads),
                     "grad_sums": [float(g.double().sum()) for g in grads],
                     "grad_sha256": [hashlib.sha256(g.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]
                                     for g in grads]})
        print(f"  {name:<7} fwd+bwd {t_step.ms:8.2f} ms  fwd {t_fwd.ms:7.2f} ms", flush=True)
    record = {"setting": args.child, "key_tile_order": "node" if configs.KEY_TILES_NODE_MAJOR else "heaviest",
              "tree_dq_order": configs.TREE_DQ_ORDER,
              "two_level_dq_order": "shared" if configs.TWO_LEVEL_SHARED_FIRST else "own", "environment": environment(torch.device("cuda")), "rows": rows}
    Path(args.child_out).write_text(json.dumps(record, default=str))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", default="node+root,node+root+shared")
    p.add_argument("--layouts", default="4x8K,8x4K,1x32K,1x8K,tree-a,tree-c")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "experiments" / "results"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("order_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.child:
        return child(args)
    settings = [s for s in args.settings.split(",") if s]
    unknown = set(settings) - set(SETTINGS)
    if unknown or not settings:
        p.error(f"no settings, or unknown settings {sorted(unknown)} (choose from {list(SETTINGS)})")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"order_bench-{time.strftime('%Y%m%dT%H%M%S')}.json"
    results = []
    for name in settings:
        print(f"{name}:", flush=True)
        part = out_dir / f"order_bench-{name}.part.json"
        cmd = [sys.executable, __file__, "--child", name, "--child-out", str(part), "--layouts", args.layouts,
               "--reps", str(args.reps), "--warmup", str(args.warmup)]
        proc = subprocess.run(cmd, env={**os.environ, **SETTINGS[name]})
        if proc.returncode or not part.exists():
            results.append({"setting": name, "error": f"exit status {proc.returncode}"})
        else:
            results.append(json.loads(part.read_text()))
            part.unlink()
        unexpected = compare_bits(results)
        # rewritten after every setting: a run cut off by a time limit keeps what it measured
        path.write_text(json.dumps({"benchmark": "order_bench", "settings": SETTINGS, "results": results,
                                    "unexpected_bit_differences": unexpected}, indent=1, default=str))
    print(table(results, args.layouts.split(",")))
    for line in unexpected:
        print(f"UNEXPECTED: {line}", file=sys.stderr)
    print(f"wrote {path}")
    return 1 if unexpected or any("error" in r for r in results) else 0


def compare_bits(results: list[dict]) -> list[str]:
    """Mark each row's dq/dk/dv as bitwise equal to the first setting's or not (``bits_equal_first_setting``), and
    list the differences no order may cause: dK/dV anywhere, dQ anywhere except a tree under another tree dQ order
    or a two-level layout under another two-level dQ order (those add dQ in another order: other rounding)."""
    base = next((r for r in results if "rows" in r), None)
    unexpected = []
    for r in results:
        if "rows" not in r or base is None:
            continue
        for row, ref in zip(r["rows"], base["rows"]):
            same = [a == b for a, b in zip(row["grad_sha256"], ref["grad_sha256"])]
            row["bits_equal_first_setting"] = dict(zip(("dq", "dk", "dv"), same))
            if row["layout"].startswith("tree"):
                dq_may_differ = r["tree_dq_order"] != base["tree_dq_order"]
            else:
                dq_may_differ = r.get("two_level_dq_order", "own") != base.get("two_level_dq_order", "own")
            for name, ok in zip(("dq", "dk", "dv"), same):
                if not ok and not (name == "dq" and dq_may_differ):
                    unexpected.append(f"{r['setting']} {row['layout']}: {name} differs from {base['setting']}'s")
            if not row["finite"]:
                unexpected.append(f"{r['setting']} {row['layout']}: non-finite gradients")
    return unexpected


def table(results: list[dict], layout_names: list[str]) -> str:
    """fwd+bwd median ms per layout and setting; "=" all three gradients bitwise equal to the first setting's."""
    lines = [f"{'layout':<8}" + "".join(f"{r['setting']:>16}" for r in results)
             + "   (fwd+bwd median ms; = bits of the first setting, dq≠ where only dQ differs)"]
    for i, name in enumerate(layout_names):
        cells = []
        for r in results:
            if "rows" not in r:
                cells.append(f"{'FAILED':>16}")
                continue
            row = r["rows"][i]
            bits = row.get("bits_equal_first_setting", {})
            mark = "=" if all(bits.values()) else ("dq≠" if bits.get("dk") and bits.get("dv") else "≠")
            cells.append(f"{row['median_ms']:>12.2f} {mark:<3}")
        lines.append(f"{name:<8}" + "".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
