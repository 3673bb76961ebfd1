"""The warp-specialised backward's Q / dO multicast build (DKV_QDO_MC, ``DUALKV_WS_MULTICAST``) against the build
without it, on a GPU: the same products in the same order, so dQ, dK and dV must agree BIT FOR BIT on every case
(one group, several groups, odd block counts, N = 1, GQA ratios, head dims 64 / 96 / 128, prefix trees, an odd CTA
count that falls back to the plain build). Outputs are poisoned with NaN (the runtime's debug mode). A known-wrong
multicast build (DKV_DBG_MC_WRONG=1: rank 1 multicasts the dO rows one token late) runs in a child process and must
be caught. Prints a table; ``--json`` writes the rows.

    python experiments/gpu/multicast_check.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# name: (layout kind, lengths, heads, kv heads, head dim)
CASES = {
    "one_group_d128": ("group", ([1024], [[384] * 4]), 8, 2, 128),
    "one_group_d64": ("group", ([1024], [[384] * 4]), 8, 2, 64),
    "one_group_d96": ("group", ([1024], [[384] * 4]), 8, 2, 96),
    "odd_blocks": ("group", ([1153], [[129, 65, 1, 127]]), 8, 2, 128),
    "n1": ("group", ([777], [[513]]), 4, 4, 128),
    "groups": ("group", ([640, 129, 1], [[300, 64], [65] * 3, [257, 1]]), 8, 2, 128),
    "gqa8": ("group", ([896], [[256, 511]]), 16, 2, 128),
    "odd_ctas": ("group", ([129], [[129]]), 4, 1, 128),  # 3 key tiles x 1 KV head: the plain build
    "tree": ("tree", ([300, 129, 65, 300, 1, 130], [-1, 0, 1, 2, 0, 4]), 8, 2, 128),
}


def _grads(case: str, multicast: bool, seed: int = 0):
    import torch

    import dualkv
    from dualkv.cuda import configs, runtime

    kind, lens, heads, kv_heads, head_dim = CASES[case]
    configs.WS_MULTICAST = multicast  # read by ws_bwd_spec at each launch
    layout = dualkv.GroupLayout.from_lengths(*lens) if kind == "group" else dualkv.PrefixTreeLayout(*lens)
    tokens = layout.total_tokens
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(tokens, h, head_dim, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
               for h in (heads, kv_heads, kv_heads))
    dout = torch.randn(tokens, heads, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    with runtime.debug(poison=True, sync=True):
        if kind == "group":
            out = dualkv.shared_prefix_attention(q, k, v, layout)
        else:
            from dualkv.cuda.api import tree_attention

            out = tree_attention(q, k, v, layout)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    return [t.detach().clone() for t in grads]


def compare(cases: list[str]) -> list[dict]:
    import torch

    from dualkv.cuda.configs import ws_bwd_spec

    rows = []
    for case in cases:
        plain = _grads(case, False)
        mc = _grads(case, True)
        head_dim = CASES[case][4]
        same = [torch.equal(a, b) for a, b in zip(plain, mc)]
        finite = all(bool(torch.isfinite(t).all()) for t in plain + mc)
        rows.append({"case": case, "head_dim": head_dim, "bitwise_dq_dk_dv": same, "finite": finite,
                     "multicast_build": ws_bwd_spec(head_dim, torch.bfloat16, multicast=True).qdo_multicast,
                     "max_abs_diff": max(float((a.float() - b.float()).abs().max()) for a, b in zip(plain, mc))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.child:
        print("RESULT " + json.dumps(compare(args.child.split(","))), flush=True)
        return
    rows = compare(list(CASES))
    env = dict(os.environ, DUALKV_EXTRA_DEFINES="DKV_DBG_MC_WRONG=1")
    proc = subprocess.run([sys.executable, __file__, "--child", "one_group_d128,groups"], env=env, text=True,
                          capture_output=True, timeout=600)
    wrong = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    wrong_rows = wrong[0] if wrong else []
    caught = bool(wrong_rows) and all(not all(r["bitwise_dq_dk_dv"]) for r in wrong_rows)
    ok = all(all(r["bitwise_dq_dk_dv"]) and r["finite"] for r in rows)
    print(f"{'case':16} {'d':>4}  bitwise (dQ, dK, dV)  finite  max |diff|")
    for r in rows:
        print(f"{r['case']:16} {r['head_dim']:4}  {str(r['bitwise_dq_dk_dv']):21} {str(r['finite']):6}  "
              f"{r['max_abs_diff']:.3g}")
    print(f"known-wrong multicast (DKV_DBG_MC_WRONG=1) caught: {caught}"
          + ("" if wrong_rows else f" (child failed: {proc.stderr[-600:]})"))
    print("multicast check:", "PASS" if ok and caught else "FAIL")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "known_wrong": wrong_rows, "known_wrong_caught": caught,
                                         "pass": ok and caught}, indent=1))
    sys.exit(0 if ok and caught else 1)


if __name__ == "__main__":
    main()
