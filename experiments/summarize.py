"""Markdown tables of the GPU result files in experiments/results (what the README's numbers are copied from).

python experiments/summarize.py [experiments/results]
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dualkv.bench.plot import latest_kernel_rows  # noqa: E402


def kernel_table(files):
    rows, env = latest_kernel_rows(files)
    gpu = env.get("gpu")
    shapes = sorted({(r["N"], r["P"]) for r in rows}, key=lambda s: (s[1], s[0]))
    systems = ["dualkv", "cascade", "flex", "fa2_ncopy"]
    print(f"Kernel (attention only), {gpu}, bf16, H=32, H_k=8, d=128, R=2048. ms fwd / bwd / fwd+bwd; "
          "fwd+bwd useful TFLOP/s; peak GiB (fwd+bwd).\n")
    print("| (N, P) | " + " | ".join(systems) + " | dualkv vs FA2 (fwd+bwd) |")
    print("|" + "---|" * (len(systems) + 2))
    for n, p in shapes:
        cells, fa2, dk = [], None, None
        for s in systems:
            got = {r["mode"]: r for r in rows if r["system"] == s and (r["N"], r["P"]) == (n, p)}
            fb = got.get("fwdbwd")
            if not fb or fb["status"] != "ok":
                cells.append(fb["status"] if fb else "-")
                continue
            cells.append(f"{got['fwd']['ms']:.1f} / {got['bwd']['ms']:.1f} / **{fb['ms']:.1f}** "
                         f"({fb['tflops']:.0f} TF, {fb['peak_mem_gib']:.1f} GiB)")
            if s == "fa2_ncopy":
                fa2 = fb["ms"]
            if s == "dualkv":
                dk = fb["ms"]
        ratio = f"{fa2 / dk:.2f}x" if fa2 and dk else "-"
        print(f"| ({n}, {p // 1024}K) | " + " | ".join(cells) + f" | {ratio} |")
    print()


def sweep_table(files, kind):
    for f in files:
        d = json.loads(f.read_text())
        cfg = d.get("config", {})
        print(f"`{f.name}`: {kind} {cfg.get('model', '')} on {d['environment'].get('gpu')}, fwd+bwd, "
              f"R ~ U{tuple(cfg.get('r_range', ()))}. ms (peak GiB); speedup of dualkv over each.\n")
        systems = [s for s in ("dualkv", "fa2_ncopy", "pg_padded", "flex_packed") if any(r["system"] == s for r in d["rows"])]
        print("| P | mb | " + " | ".join(systems) + " |")
        print("|" + "---|" * (len(systems) + 2))
        keys = sorted({(r["P"], r["mb"]) for r in d["rows"]})
        for p, mb in keys:
            by = {r["system"]: r for r in d["rows"] if (r["P"], r["mb"]) == (p, mb)}
            dk = by.get("dualkv", {}).get("ms")
            cells = []
            for s in systems:
                r = by.get(s)
                if not r or r["status"] != "ok":
                    cells.append(r["status"] if r else "-")
                    continue
                sp = f", {r['ms'] / dk:.2f}x" if dk and s != "dualkv" else ""
                cells.append(f"{r['ms']:.1f} ({r['peak_mem_gib']:.1f}{sp})")
            print(f"| {p} | {mb} | " + " | ".join(cells) + " |")
        print()


def varying_table(files):
    """The varying-shape runs (every micro-batch a new (P, R_i) set; mask builds and recompiles included)."""
    for f in files:
        d = json.loads(f.read_text())
        if d.get("varying"):
            print(f"`{f.name}`: " + ", ".join(f"{r['system']} {r['seconds']:.3f} s ({r['batches']} batches)"
                                              for r in d["varying"] if r.get("status") == "ok") + "\n")


def policy_mfu(d: dict):
    """row -> MFU over the FLOPs the row's own system executes (``mfu_useful``; derived from ``mfu`` for files
    written before that field existed)."""
    from policy_update_bench import analysis_model, useful_mfu

    from dualkv.bench.qwen3 import qwen3_config

    cfg = d["config"]
    model = analysis_model(qwen3_config(cfg["model"], max_positions=cfg["P"] + cfg["R"], num_layers=cfg.get("layers")))
    return lambda row: row["mfu_useful"] if "mfu_useful" in row else useful_mfu(model, row)


def policy_update_table(files):
    for f in files:
        d = json.loads(f.read_text())
        cfg = d["config"]
        print(f"`{f.name}`: {cfg.get('model')} P={cfg.get('P')} R={cfg.get('R')} mb={cfg.get('mb')}, stock log-probs "
              f"{cfg.get('stock_logprobs', 'verl-fallback')}; s per phase (peak GiB, MFU over the system's own "
              f"FLOPs); old log-prob max |Δ| {d.get('logprob_max_abs_diff_by_N')}, mean |Δ| "
              f"{d.get('logprob_mean_abs_diff_by_N')}\n")
        print("| N | phase | stock | dualkv | speedup |")
        print("|---|---|---|---|---|")
        by = {(r["system"], r["N"], r["phase"]): r for r in d["rows"]}
        own_mfu = policy_mfu(d)

        def cell(x):
            if not x or x["status"] != "ok":
                return (x or {}).get("status", "-")
            mfu = own_mfu(x)
            return f"{x['seconds']:.2f} ({x['peak_mem_gib']:.1f}" + (f", {mfu:.0%})" if mfu is not None else ")")

        for (system, n, phase), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
            if system != "dualkv":
                continue
            st = by.get(("stock", n, phase))
            speed = f"{st['seconds'] / r['seconds']:.2f}x" if st and st["status"] == "ok" and r["status"] == "ok" else "-"
            print(f"| {n} | {phase} | {cell(st)} | {cell(r)} | {speed} |")
        print()


def main(root="experiments/results"):
    root = Path(root)
    kernel = sorted(root.glob("kernel-*.json"))
    if kernel:
        kernel_table(kernel)
        varying_table(kernel)
    policy_update_table(sorted(root.glob("policy_update-*.json")))
    sweep_table(sorted(root.glob("layer-*.json")), "one decoder layer")
    sweep_table(sorted(root.glob("model-*.json")), "whole model")


if __name__ == "__main__":
    main(*sys.argv[1:])
