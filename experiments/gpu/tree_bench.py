"""Prefix-tree attention, fwd+bwd, on the issue #14 workloads (H=32, H_k=8, d=128, bf16), same process:

* ``dualkv``        — dualkv.shared_prefix_attention on the PrefixTreeLayout (the tree kernels, default family);
* ``dualkv_v1``     — the same with DUALKV_KERNELS=wgmma_v1 (first wgmma forward, two-kernel wgmma backward);
* ``dualkv_mma``    — the same with the mma.sync kernels (what sm_80 runs; its backward as $DUALKV_MMA_BWD says);
* ``dualkv_bwd_v1`` — the default forward, the backward under wgmma_v1: against ``dualkv`` it isolates the
                      warp-specialised tree backward (DKV_TREE=1 bwd_sm90_ws) vs the wgmma dQ + dK/dV pair;
* ``flex``          — torch.compile(flex_attention) (static shapes) with a tree BlockMask; the mask build and the
                      compile (first call) are timed separately, not in the step;
* ``fa2_ncopy``     — every root-to-leaf path as its own sequence, PyTorch's varlen FlashAttention-2 (the N-copy
                      copies are built outside the timed step, as in dualkv.bench.baselines.FA2NCopy);
* ``cudnn_cascade`` — dualkv.bench.tree_cascade: own causal parts + one non-causal part per internal node on cuDNN
                      attention, merged by LSE.

Per (workload, system): median/min/max ms of fwd+bwd over --reps runs (dualkv.bench.harness.measure: CUDA events,
after --warmup runs; with --forward also of the forward alone, ``fwd_*`` fields), useful TFLOP/s (dualkv.analysis:
tree pairs x 4 d H x 3.5), peak memory of a step, and the max relative error of out/dq/dk/dv against fa2_ncopy (an
independent implementation; "FAIL" above 2e-2 — printed, never hidden). Then a run over trees of changing shape:
dualkv loads no new kernel and rebuilds only its host tables (timed), while Flex needs a new BlockMask per tree
(timed; a new total length also means a static recompile, which is not timed here).

Writes one JSON under --out (default $OUT, else experiments/results) and prints a table. Exit status 1 if any system
failed or disagreed, so a wrapper cannot miss it.

    python experiments/gpu/tree_bench.py [--reps 10] [--warmup 3] [--workloads a,b,c] [--systems ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dualkv import PrefixTreeLayout  # noqa: E402
from dualkv.analysis.pairs import attention_flops  # noqa: E402
from dualkv.analysis.trees import (branching_workload, multi_turn_workload, system_prompt_workload,  # noqa: E402
                                   tree_useful_pairs)

WORKLOADS = {"a": ("system prompt 2K x 8 prompts 4K x 8 responses 2K", system_prompt_workload),
             "b": ("4K prompt, 4 responses branching at 512 into 4 x 1.5K", branching_workload),
             "c": ("3 turns of 1K, 8 branches of 1K", multi_turn_workload)}
SYSTEMS = ("dualkv", "dualkv_v1", "dualkv_mma", "dualkv_bwd_v1", "flex", "fa2_ncopy", "cudnn_cascade")
AGREE = 2e-2


# ------------------------------------------------------------------------------------------------------- systems
def flex_tree_mask(layout: PrefixTreeLayout, device):
    """(mask_mod, BlockMask builder) of the tree: kv visible to q iff kv's node is an ancestor of q's node, or the
    same node and kv <= q (nodes in preorder: a is an ancestor-or-self of n iff a <= n < subtree_end[a])."""
    import numpy as np

    from dualkv.bench.systems import block_mask_builder
    from dualkv.cuda.tree_schedule import subtree_ends

    node_of = torch.from_numpy(np.repeat(np.arange(layout.num_nodes), layout.node_lens)).to(device)
    end = torch.from_numpy(subtree_ends(layout)).to(device)

    def mask_mod(b, h, q_idx, kv_idx):
        nq, nk = node_of[q_idx], node_of[kv_idx]
        return (nk <= nq) & (nq < end[nk]) & ((nk != nq) | (kv_idx <= q_idx))

    t = layout.total_tokens
    build = block_mask_builder(device)  # compiled on CUDA: no O(T^2) dense mask while building
    return lambda: build(mask_mod, None, None, t, t, device=device)


class Runner:
    """One system on one workload: ``forward()`` returns (out, leaves) with the leaves requiring grad; ``step()`` runs
    forward and backward; ``result()`` returns (out, dq, dk, dv) in packed order."""

    def __init__(self, name, layout, q, k, v, dout):
        self.name, self.layout, self.q, self.k, self.v, self.dout = name, layout, q, k, v, dout
        self.scale = q.shape[-1] ** -0.5
        self.extra: dict = {}
        self.grad_out = dout
        self.backward_family = None      # dualkv: the kernel family the backward launches under
        getattr(self, f"_prepare_{name}")()
        t0 = time.perf_counter()
        self.last = self.step()
        if q.is_cuda:
            torch.cuda.synchronize()
        # Flex's first call compiles; the others' first call loads kernels and builds tables
        self.extra["compile_and_first_call_s" if name == "flex" else "first_call_s"] = time.perf_counter() - t0

    def _leaves(self, *ts):
        return [t.detach().requires_grad_() for t in ts]

    def step(self):
        from dualkv.cuda.configs import kernel_family

        out, leaves = self.forward()
        with kernel_family(self.backward_family) if self.backward_family else contextlib.nullcontext():
            out.backward(self.grad_out)   # the family is read when the backward launches
        return out, *(t.grad for t in leaves)

    # dualkv --------------------------------------------------------------------------------------------------
    def _prepare_dualkv(self, family="auto", bwd_family=None):
        import dualkv
        from dualkv.cuda.configs import kernel_family

        def forward():
            with kernel_family(family):
                leaves = self._leaves(self.q, self.k, self.v)
                return dualkv.shared_prefix_attention(*leaves, self.layout), leaves
        self.forward, self.backward_family = forward, bwd_family or family

    def _prepare_dualkv_v1(self):
        self._prepare_dualkv("wgmma_v1")

    def _prepare_dualkv_mma(self):
        self._prepare_dualkv("mma")

    def _prepare_dualkv_bwd_v1(self):
        self._prepare_dualkv("auto", "wgmma_v1")

    # flex ----------------------------------------------------------------------------------------------------
    def _prepare_flex(self):
        from dualkv.bench.systems import compiled_flex_attention

        torch._functorch.config.donated_buffer = False
        build = flex_tree_mask(self.layout, self.q.device)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        block_mask = build()
        torch.cuda.synchronize()
        self.extra["mask_build_s"] = time.perf_counter() - t0
        flex = compiled_flex_attention(False)
        gqa = self.q.shape[1] != self.k.shape[1]

        def forward():
            leaves = self._leaves(self.q, self.k, self.v)
            out = flex(*(x.transpose(0, 1).unsqueeze(0) for x in leaves), block_mask=block_mask,
                       scale=self.scale, enable_gqa=gqa)[0].transpose(0, 1)
            return out, leaves
        self.forward = forward

    # N-copy --------------------------------------------------------------------------------------------------
    def _prepare_fa2_ncopy(self):
        from dualkv.bench.systems import varlen_causal

        lay = self.layout
        index = torch.from_numpy(lay.copy_token_index).to(self.q.device)
        first = torch.from_numpy(lay.first_copy_index).to(self.q.device)
        q_std, k_std, v_std = (t[index].contiguous() for t in (self.q, self.k, self.v))
        d_std = torch.zeros((lay.tokens_std, *self.dout.shape[1:]), dtype=self.dout.dtype, device=self.dout.device)
        d_std[first] = self.dout  # each packed token's upstream gradient once (its first copy)
        cu = torch.from_numpy(lay.copy_cu_seqlens).to(device=self.q.device, dtype=torch.int32)
        max_len = lay.max_path_len

        def forward():
            leaves = self._leaves(q_std, k_std, v_std)
            return varlen_causal(*leaves, cu, cu, max_len, max_len, self.scale), leaves

        def packed(res):
            out, dq, dk, dv = res
            grads = [torch.zeros(t.shape, dtype=torch.float32, device=t.device).index_add_(0, index, g.float())
                     for t, g in zip((self.q, self.k, self.v), (dq, dk, dv))]
            return (out[first], *grads)
        self.forward, self.grad_out, self.to_packed = forward, d_std, packed

    # cascade -------------------------------------------------------------------------------------------------
    def _prepare_cudnn_cascade(self):
        from dualkv.bench.tree_cascade import tree_cascade_attention

        def forward():
            leaves = self._leaves(self.q, self.k, self.v)
            return tree_cascade_attention(*leaves, self.layout, self.scale), leaves
        self.forward = forward

    def result(self):
        res = self.last
        return getattr(self, "to_packed", lambda r: r)(res)


# ------------------------------------------------------------------------------------------------------- timing
def time_steps(fn, warmup: int, reps: int, prefix: str = "") -> dict:
    """dualkv.bench.harness.measure of ``fn`` (CUDA events, median/min/max over ``reps`` after ``warmup``), with
    the step's own memory (peak of the timed runs minus what was allocated before them)."""
    from dualkv.bench.harness import measure

    device = torch.device("cuda")
    base = torch.cuda.memory_allocated()
    timing = measure(fn, device, warmup=warmup, reps=reps)
    row = {"median_ms": timing.ms, "min_ms": min(timing.ms_runs), "max_ms": max(timing.ms_runs), "reps": reps,
           "times_ms": timing.ms_runs, "peak_mem_gib": timing.peak_mem_gib,
           "step_mem_gib": timing.peak_mem_gib - base / 2**30}
    return {prefix + k: v for k, v in row.items()}


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_workload(key: str, systems, args) -> list[dict]:
    desc, make = WORKLOADS[key]
    layout = make()
    gen = torch.Generator(device="cuda").manual_seed(0)
    t, h, hk, d = layout.total_tokens, args.heads, args.kv_heads, args.head_dim
    make_t = lambda n: torch.randn(t, n, d, generator=gen, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v, dout = make_t(h), make_t(hk), make_t(hk), make_t(h)
    flops = attention_flops(tree_useful_pairs(layout), h, d, "fwdbwd")
    base = {"workload": key, "description": desc, "tokens": t, "nodes": layout.num_nodes, "paths": layout.num_paths,
            "max_depth": layout.max_depth, "tokens_ncopy": layout.tokens_std, "useful_flops": flops}
    rows, results = [], {}
    for name in systems:
        row = dict(base, system=name)
        try:
            runner = Runner(name, layout, q, k, v, dout)
            row.update(time_steps(runner.step, args.warmup, args.reps))
            if args.forward:   # the forward alone (its leaves still require grad, so the same kernels run)
                row.update(time_steps(lambda: runner.forward()[0], args.warmup, args.reps, "fwd_"))
            row.update(runner.extra)
            row["useful_tflops"] = flops / (row["median_ms"] * 1e-3) / 1e12
            results[name] = [x.detach() for x in runner.result()]
            del runner
        except Exception as err:  # noqa: BLE001 - recorded and reported as a failure, never swallowed
            row["error"] = f"{type(err).__name__}: {err}"
            row["traceback"] = traceback.format_exc()
            print(row["traceback"], file=sys.stderr)
        torch.cuda.empty_cache()
        rows.append(row)
    ref = results.get("fa2_ncopy")
    for row in rows:
        got = results.get(row["system"])
        if ref is not None and got is not None:
            row["rel_err_vs_fa2_ncopy"] = {n: rel(a, b) for n, a, b in zip(("out", "dq", "dk", "dv"), got, ref)}
            row["agrees"] = all(e <= AGREE for e in row["rel_err_vs_fa2_ncopy"].values())
    return rows


def changing_trees(args, with_flex: bool = True) -> dict:
    """dualkv on trees of changing shape: kernels loaded (must stay constant after the first tree) and host table
    build time per tree; with ``with_flex``, Flex's BlockMask build time per tree (a new total length would also
    recompile; its first build compiles, tens of seconds)."""
    import dualkv
    from dualkv.cuda import runtime

    out = {"trees": []}
    for i, (prompt, resp) in enumerate([(3000, 1500), (2500, 1700), (3500, 900), (2048, 2048), (1000, 3000)]):
        layout = branching_workload(prompt=prompt, responses=3 + i % 3, branch_at=300 + 50 * i,
                                    continuations=2 + i % 2, continuation_len=resp)
        t = layout.total_tokens
        q, k, v = (torch.randn(t, n, args.head_dim, device="cuda", dtype=torch.bfloat16).requires_grad_()
                   for n in (args.heads, args.kv_heads, args.kv_heads))
        loaded_before = len(runtime._loaded)
        t0 = time.perf_counter()
        out_ = dualkv.shared_prefix_attention(q, k, v, layout)
        out_.backward(torch.ones_like(out_))
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        out_ = dualkv.shared_prefix_attention(q, k, v, layout)
        out_.backward(torch.ones_like(out_))
        torch.cuda.synchronize()
        again = time.perf_counter() - t0
        row = {"tokens": t, "nodes": layout.num_nodes, "dualkv_new_kernels_loaded": len(runtime._loaded) - loaded_before,
               "dualkv_first_step_s": first, "dualkv_repeat_step_s": again}
        if not with_flex:
            out["trees"].append(row)
            continue
        try:
            build = flex_tree_mask(layout, "cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            build()
            torch.cuda.synchronize()
            row["flex_mask_build_s"] = time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001
            row["flex_error"] = f"{type(err).__name__}: {err}"
        out["trees"].append(row)
    out["dualkv_recompiled"] = any(r["dualkv_new_kernels_loaded"] for r in out["trees"][1:])
    return out


def table(rows) -> str:
    lines = [f"{'wl':<3} {'system':<14} {'median ms':>10} {'min':>8} {'max':>8} {'TFLOP/s':>8} {'peak GiB':>9} "
             f"{'vs flex':>8} {'max rel err':>12}  note"]
    flex = {r["workload"]: r.get("median_ms") for r in rows if r["system"] == "flex"}
    for r in rows:
        if "error" in r:
            lines.append(f"{r['workload']:<3} {r['system']:<14} FAILED: {r['error'][:90]}")
            continue
        errs = r.get("rel_err_vs_fa2_ncopy")
        worst = f"{max(errs.values()):.2e}" if errs else "–"    # fa2_ncopy not run: nothing to compare with
        speed = flex.get(r["workload"])
        vs_flex = f"{speed / r['median_ms']:>7.2f}x" if speed else f"{'–':>8}"   # flex not run
        note = "" if r.get("agrees", True) else "FAIL: disagrees with fa2_ncopy"
        lines.append(f"{r['workload']:<3} {r['system']:<14} {r['median_ms']:>10.2f} {r['min_ms']:>8.2f} "
                     f"{r['max_ms']:>8.2f} {r['useful_tflops']:>8.1f} {r['peak_mem_gib']:>9.2f} "
                     f"{vs_flex} {worst:>12}  {note}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="a,b,c")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--forward", action="store_true",
                   help="also time each system's forward alone (fwd_* fields; the backward is the difference)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--no-changing-trees", action="store_true",
                   help="skip the changing-trees section (kernels loaded and Flex mask builds per new tree)")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "experiments" / "results"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("tree_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown or args.reps < 1:
        p.error(f"unknown systems {sorted(unknown)} (choose from {SYSTEMS}) or --reps < 1")
    from dualkv.bench.harness import environment

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"tree_bench-{time.strftime('%Y%m%dT%H%M%S')}.json"
    config = {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": "bf16",
              "reps": args.reps, "warmup": args.warmup, "forward": args.forward}
    rows, changing = [], None
    env = environment(torch.device("cuda"))

    def write() -> dict[str, float]:  # after every section, so a run cut off by a time limit still leaves its rows
        speedups = {}
        for key in args.workloads.split(","):
            by = {r["system"]: r for r in rows if r["workload"] == key and "error" not in r}
            if "dualkv" in by and "flex" in by:
                speedups[key] = by["flex"]["median_ms"] / by["dualkv"]["median_ms"]
        record = {"benchmark": "tree_bench", "environment": env, "config": config,
                  "rows": rows, "changing_trees": changing, "dualkv_speedup_vs_flex": speedups,
                  "target_speedup_vs_flex": 1.2}
        path.write_text(json.dumps(record, indent=1, default=str))
        return speedups

    for key in args.workloads.split(","):
        rows.extend(run_workload(key, systems, args))
        print(table([r for r in rows if r["workload"] == key]), flush=True)
        write()
    if "dualkv" in systems and not args.no_changing_trees:
        changing = changing_trees(args, with_flex="flex" in systems)
    speedups = write()
    print("\n" + table(rows))
    print("\ndualkv speed-up over flex (target >= 1.2x):",
          ", ".join(f"{k}: {v:.2f}x" for k, v in speedups.items()) or "n/a")
    if changing:
        print("changing trees: dualkv new kernels per new tree:",
              [r["dualkv_new_kernels_loaded"] for r in changing["trees"]],
              "| flex mask build s:", [round(r["flex_mask_build_s"], 3) if r.get("flex_mask_build_s") is not None
                                       else "–" for r in changing["trees"]])
    print(f"wrote {path}")
    failed = [r for r in rows if "error" in r or not r.get("agrees", True)]
    if failed:
        print(f"FAILED: {[(r['workload'], r['system']) for r in failed]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
