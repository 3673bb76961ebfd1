"""Policy-update benchmark across GPUs: veRL 0.9.1's FSDP2 engine, stock vs dualkv, launched with torchrun.

One launch = one layout (world size W from torchrun, Ulysses SP from ``--sp``, DP = W / SP) and one engine of a
Qwen3 built from its published config with random weights (``--model-dir``, saved by ``--save-model``), bf16
compute with fp32 master weights (veRL's actor default). Every DP rank runs one prompt group of N responses
(P prompt tokens, R tokens per response; micro-batch = the whole group, ``--mb``), stock and dualkv on the same
engine (switched per call, as veRL's ``use_dualkv`` does). Phases, as veRL's worker runs them:

* ``old_log_prob`` — ``infer_batch`` with entropy; * ``update_actor`` — ``train_batch`` (forward, backward,
  optimizer step) with veRL's ``ppo_loss``.

Tasks (``--task``):

* ``throughput`` — every phase at each ``--P`` (``--warmup`` untimed + ``--reps`` timed runs, median): seconds
  (slowest rank), tokens/s per GPU (the N(P+R) tokens the trainer sees, per DP rank, / seconds / SP), peak memory
  of every rank. Run at W=1 and W=2 (DP) for the DP scaling efficiency;
* ``maxp`` — ``update_actor`` at increasing ``--P`` for each system until it runs out of memory (caught; the
  system stops there), the time budget ends or ``--max-p`` is passed: the longest prompt that fits, and the speed
  of both systems at every P where both fit (one warm-up + ``--reps``; once stock is out, dualkv runs once per P).

Each launch writes ``<out>/multigpu-<task>-w<W>-sp<SP>-<model>.json`` (rank 0; rewritten after every row, so a
killed run keeps what it measured); ``--summarize DIR`` reads them and writes ``DIR/multigpu_summary.json``
(DP=1 -> DP=2 scaling, longest prompt at SP=1 vs SP=2, dualkv vs stock at SP=2).

    python experiments/verl/multigpu_bench.py --save-model /tmp/q17 --model qwen3-1.7b --max-positions 70000
    torchrun --nproc-per-node 2 experiments/verl/multigpu_bench.py --task throughput --model-dir /tmp/q17 \\
        --P 8192 --out $OUT

The stock system is veRL as shipped with FlashAttention-2 varlen (PyTorch's kernel, Ulysses-wrapped as veRL wraps
``flash_attention_2``) and a chunked fp32 log-prob head standing in for flash-attn's fused cross-entropy — the
same stand-ins as ``experiments/policy_update_bench.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "proofs_tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import torch  # noqa: E402

SYSTEMS = ("stock", "dualkv")
PHASES = ("old_log_prob", "update_actor")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ints = policy_bench_cached()._ints
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=("throughput", "maxp"), default="throughput")
    p.add_argument("--model-dir", help="a saved model (+ tokenizer), from --save-model")
    p.add_argument("--save-model", metavar="DIR", help="only save a random --model to DIR and exit (no torchrun)")
    p.add_argument("--model", default="qwen3-1.7b", help="qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b or tiny")
    p.add_argument("--layers", type=int, default=None, help="override the number of decoder layers (--save-model)")
    p.add_argument("--max-positions", type=int, default=140_000, help="the model's max positions (--save-model)")
    p.add_argument("--sp", type=int, default=1, help="Ulysses sequence-parallel size")
    p.add_argument("--P", type=ints, default=[8192], help="prompt lengths, ascending (maxp: the search grid)")
    p.add_argument("--R", type=int, default=2048)
    p.add_argument("--N", type=int, default=8)
    p.add_argument("--mb", type=int, default=None, help="rows per micro-batch (default N: the whole group)")
    p.add_argument("--stock-mb", type=int, default=None,
                   help="rows per micro-batch for stock only (default --mb): stock's N-copy rows need not keep a "
                        "group together, and a smaller micro-batch is how a stock user fits a long prompt")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--max-p", type=int, default=None, help="maxp: test no prompt longer than this")
    p.add_argument("--time-budget-s", type=float, default=None, help="start nothing new after this many seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tag", default="", help="appended to the output file name (several runs of one layout)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None)
    p.add_argument("--out", default=str(REPO / "out" / "bench"))
    p.add_argument("--summarize", metavar="DIR", help="summarize the launches' JSON files in DIR and exit")
    args = p.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.systems = [s for s in args.systems.split(",") if s]
    if not args.systems or set(args.systems) - set(SYSTEMS):
        p.error(f"--systems takes a subset of {','.join(SYSTEMS)}")
    args.mb = args.mb or args.N
    if args.N % args.mb:
        p.error(f"--N {args.N} must be a multiple of --mb {args.mb}")
    if args.P != sorted(args.P):
        p.error("--P must be ascending")
    return args


# ---------------------------------------------------------------------------------------------- setup
def policy_bench():
    """``experiments/policy_update_bench.py`` as a module (its model saving, timing and stock log-prob head)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("policy_update_bench", REPO / "experiments" / "policy_update_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def save_model(args: argparse.Namespace) -> str:
    bench = policy_bench_cached()
    ns = argparse.Namespace(model=args.model, P=args.max_positions - args.R - 16, R=args.R, layers=args.layers,
                            fp32=False, seed=args.seed)
    path, _ = bench.save_model(ns, Path(args.save_model))
    return path


def setup(device: str) -> tuple[int, int]:
    """Stubs for veRL's unused imports, the process group (veRL's own init on CUDA), dualkv's patches, the stock
    attention and log-prob head."""
    from verl_fixtures import import_stubs

    import_stubs.hide_and_stub()
    os.environ.setdefault("VERL_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if device == "cpu":
        import verl_fixtures

        verl_fixtures.setup_cpu_verl()
        torch.distributed.init_process_group("gloo")
    else:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        from verl.utils.distributed import initialize_global_process_group

        # A short timeout: a rank that ran out of memory alone leaves the others in a collective; fail, not hang.
        initialize_global_process_group(timeout_second=180)
    from dualkv.integration.verl import enable
    from verl_fixtures.stock_attention import register_stock_attention

    enable()
    register_stock_attention()
    policy_bench_cached().use_fused_stock_logprobs()
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def rank_batch(args: argparse.Namespace, prompt_len: int, dp_rank: int, vocab: int, mb: int | None = None):
    """This DP rank's group as the engine TensorDict, ``mb`` rows per micro-batch (default ``--mb``)."""
    import verl_fixtures
    from verl_fixtures.synthetic import rollout_batch

    data = rollout_batch([(prompt_len, [args.R] * args.N)], vocab_size=vocab, seed=args.seed + dp_rank)
    tokens = args.N * (prompt_len + args.R)
    return verl_fixtures.engine_batch_of(data, micro_batch_size_per_gpu=mb or args.mb, global_batch_size=args.N,
                                         max_token_len_per_gpu=tokens)


def phase_call(engine, phase: str, td, loss):
    if phase == "old_log_prob":
        with engine.eval_mode():
            return engine.infer_batch(td.clone(), loss_function=None)
    with engine.train_mode():
        return engine.train_batch(td.clone(), loss)


def measure(args, engine, system: str, phase: str, td, loss, warmup: int, reps: int) -> dict:
    """One (system, phase) on every rank: median seconds (slowest rank) and each rank's peak GiB, or OOM."""
    bench = policy_bench_cached()
    engine.engine_config.__dict__["use_dualkv"] = system == "dualkv"
    status, seconds, peak = "ok", None, None
    try:
        seconds, peak, _, _ = bench.timed(lambda: phase_call(engine, phase, td, loss), warmup, reps, args.device)
    except torch.OutOfMemoryError:
        status = "OOM"
    except RuntimeError as err:            # e.g. an OOM re-raised by a collective or a checkpointed recompute
        status = "OOM" if "out of memory" in str(err).lower() else f"error: {type(err).__name__}: {str(err)[:200]}"
    finally:
        engine.optimizer_zero_grad()
        bench.release_memory()
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, (status, seconds, peak))
    statuses = [g[0] for g in gathered]
    worst = "OOM" if "OOM" in statuses else next((x for x in statuses if x != "ok"), "ok")
    row = {"system": system, "phase": phase, "status": worst,
           "seconds": None, "peak_mem_gib_per_rank": [g[2] for g in gathered]}
    if row["status"] == "ok":
        row["seconds"] = max(g[1] for g in gathered)
    return row


_BENCH = []


def policy_bench_cached():
    if not _BENCH:
        _BENCH.append(policy_bench())
    return _BENCH[0]


def tokens_per_gpu_s(args, prompt_len: int, seconds: float, sp: int) -> float:
    """The N(P+R) row tokens of one DP rank's group per second, divided over its SP GPUs."""
    return args.N * (prompt_len + args.R) / seconds / sp


def environment(device: str) -> dict:
    from importlib import metadata

    from dualkv._provenance import git_commit

    commit, dirty = git_commit()
    env = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "commit": commit, "dirty": dirty,
           "torch": torch.__version__, "cuda": torch.version.cuda, "verl": metadata.version("verl")}
    names: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(names, torch.cuda.get_device_name() if device == "cuda" else "cpu")
    env["devices"] = names
    return env


# ---------------------------------------------------------------------------------------------- tasks
def run(args: argparse.Namespace) -> int:
    import verl_fixtures
    from transformers import AutoConfig
    from verl_fixtures.stock_attention import STOCK_ATTENTION

    rank, world = setup(args.device)
    if world % args.sp:
        raise SystemExit(f"world size {world} is not a multiple of --sp {args.sp}")
    start = time.monotonic()
    hf = AutoConfig.from_pretrained(args.model_dir)
    vocab = min(int(hf.vocab_size), 4096)
    def build():
        return verl_fixtures.build_engine(args.model_dir, dualkv=False, sp=args.sp, precision="bf16",
                                          attention=STOCK_ATTENTION, micro_batch_size=args.mb,
                                          max_token_len=args.N * (max(args.P) + args.R))

    engine = build()
    dp_rank, dp = engine.get_data_parallel_rank(), engine.get_data_parallel_size()
    loss = verl_fixtures.loss_fn(args.N, entropy_coeff=0.0, kl_loss_coef=0.001)
    name = Path(args.model_dir).name
    tag = f"-{args.tag}" if args.tag else ""
    out = Path(args.out) / f"multigpu-{args.task}-w{world}-sp{args.sp}-{name}{tag}.json"
    record = {"benchmark": "verl_multigpu_policy_update", "task": args.task, "world_size": world, "dp": dp,
              "sp": args.sp, "model": name, "hidden_size": hf.hidden_size, "num_layers": hf.num_hidden_layers,
              "N": args.N, "R": args.R, "mb": args.mb, "stock_mb": args.stock_mb or args.mb,
              "precision": "bf16 compute, fp32 master weights",
              "strategy": "fsdp2", "environment": environment(args.device),
              "build_seconds": time.monotonic() - start, "rows": []}

    def save():
        if rank == 0:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(record, indent=1))

    def over_budget() -> bool:
        late = args.time_budget_s is not None and time.monotonic() - start > args.time_budget_s
        flags: list = [None] * world
        torch.distributed.all_gather_object(flags, late)
        return any(flags)

    alive = list(args.systems)
    for prompt_len in args.P:
        if args.task == "maxp" and args.max_p is not None and prompt_len > args.max_p:
            break
        td = rank_batch(args, prompt_len, dp_rank, vocab)
        td_stock = rank_batch(args, prompt_len, dp_rank, vocab, args.stock_mb) if args.stock_mb else td
        phases = PHASES if args.task == "throughput" else ("update_actor",)
        both = len(alive) == len(args.systems)
        for system in list(alive):
            for phase in phases:
                if over_budget():
                    record["stopped"] = f"time budget {args.time_budget_s} s"
                    save()
                    return finish(record, out, rank)
                warm, reps = (args.warmup, args.reps) if (args.task == "throughput" or both) else (0, 1)
                batch = td_stock if system == "stock" else td
                row = {"P": prompt_len, **measure(args, engine, system, phase, batch, loss, warm, reps),
                       "warmup": warm, "reps": reps}
                if row["seconds"]:
                    row["tokens_per_s_per_gpu"] = tokens_per_gpu_s(args, prompt_len, row["seconds"], args.sp)
                record["rows"].append(row)
                save()
                if rank == 0:
                    print(f"[w{world} sp{args.sp}] P={prompt_len} {system} {phase}: {row['status']} "
                          f"{row['seconds']} s, peak {row['peak_mem_gib_per_rank']} GiB", flush=True)
                if row["status"] != "ok":
                    alive.remove(system)
                    # A forward that died half-way may leave FSDP's state (unsharded modules, hooks) behind: the
                    # systems still searching get a fresh engine.
                    if alive:
                        del engine
                        policy_bench_cached().release_memory()
                        engine = build()
                        record["rebuilds"] = record.get("rebuilds", 0) + 1
                    break
        if not alive:
            break
    return finish(record, out, rank)


def finish(record: dict, out: Path, rank: int) -> int:
    if rank == 0:
        out.write_text(json.dumps(record, indent=1))
        print(f"wrote {out}", flush=True)
    torch.distributed.barrier()    # no rank leaves (exit_now) while another still uses the group
    torch.distributed.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------------------------- summary
def max_fitting_p(rows: list[dict], system: str) -> dict:
    """Longest P that ran, and whether the search ended in an OOM (else: bounded by the grid, cap or time)."""
    mine = [r for r in rows if r["system"] == system and r["phase"] == "update_actor"]
    ok = [r["P"] for r in mine if r["status"] == "ok"]
    oom = [r["P"] for r in mine if r["status"] == "OOM"]
    return {"max_p": max(ok) if ok else None, "first_oom_p": min(oom) if oom else None,
            "bounded_by_oom": bool(oom)}


def summarize(folder: Path) -> dict:
    files = {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("multigpu-*.json"))}
    summary: dict[str, Any] = {"benchmark": "verl_multigpu_summary", "files": sorted(files)}
    tp = {(f["world_size"], f["sp"]): f for f in files.values() if f["task"] == "throughput"}
    if (1, 1) in tp and (2, 1) in tp:
        one, two = tp[(1, 1)], tp[(2, 1)]
        scaling = []
        for r2 in two["rows"]:
            r1 = next((r for r in one["rows"] if (r["system"], r["phase"], r["P"]) == (r2["system"], r2["phase"],
                                                                                     r2["P"])), None)
            if r1 and r1["seconds"] and r2["seconds"]:
                # throughput = DP x one group's tokens / seconds: DP=2 over DP=1 is 2 t1 / t2
                scaling.append({"system": r2["system"], "phase": r2["phase"], "P": r2["P"],
                                "seconds_dp1": r1["seconds"], "seconds_dp2": r2["seconds"],
                                "throughput_ratio": 2 * r1["seconds"] / r2["seconds"],
                                "efficiency": r1["seconds"] / r2["seconds"]})
        summary["dp_scaling"] = scaling
        summary["devices"] = two["environment"]["devices"]
    mp: dict[int, list[dict]] = {}       # SP -> the maxp launches at that SP (a search, a speed run, ...)
    for f in files.values():
        if f["task"] == "maxp":
            mp.setdefault(f["sp"], []).append(f)
    by_key: dict[str, list[dict]] = {}    # stock with its own micro-batch (--stock-mb) is a separate entry
    for sp, launches in mp.items():
        for f in launches:
            for system in ("stock", "dualkv"):
                own_mb = system == "stock" and f.get("stock_mb") not in (None, f.get("mb"))
                key = f"{system}_sp{sp}" + (f"_mb{f['stock_mb']}" if own_mb else "")
                by_key.setdefault(key, []).extend(r for r in f["rows"] if r["system"] == system)
    fits = {key: max_fitting_p(rows, key.split("_")[0]) for key, rows in sorted(by_key.items())}
    summary["max_prompt"] = fits
    if fits.get("dualkv_sp1", {}).get("max_p") and fits.get("dualkv_sp2", {}).get("max_p"):
        summary["dualkv_sp2_over_sp1_max_p"] = fits["dualkv_sp2"]["max_p"] / fits["dualkv_sp1"]["max_p"]
    speed = []
    for sp, launches in mp.items():
        for f in launches:
            for r in f["rows"]:
                other = next((o for o in f["rows"] if o["P"] == r["P"] and o["system"] == "dualkv"
                              and o["status"] == "ok" and o["reps"] == r["reps"]), None)
                if r["system"] == "stock" and r["status"] == "ok" and other:
                    speed.append({"sp": sp, "P": r["P"], "stock_s": r["seconds"], "dualkv_s": other["seconds"],
                                  "speedup": r["seconds"] / other["seconds"], "stock_mb": f.get("stock_mb"),
                                  "mb": f.get("mb")})
    summary["dualkv_vs_stock_update"] = speed
    (folder / "multigpu_summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize:
        print(json.dumps(summarize(Path(args.summarize)), indent=1))
        return 0
    if args.save_model:
        print(save_model(args))
        return 0
    if not args.model_dir:
        raise SystemExit("--model-dir is required (save one with --save-model)")
    from dualkv.integration.verl.compat import exit_unless_supported_verl

    exit_unless_supported_verl("multigpu_bench.py")
    return run(args)


if __name__ == "__main__":
    from distributed_parity import exit_now  # noqa: E402  (the same gloo/NCCL teardown guard)

    exit_now(main())
