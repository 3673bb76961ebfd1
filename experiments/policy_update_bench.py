"""Policy-update benchmark: veRL's own actor and ref workers, in process, stock vs dualkv.

For each system (``stock``: veRL 0.9.1 as shipped, N-copy rows, FlashAttention-2 varlen attention; ``dualkv``:
the same recipe plus the documented dualkv lines) this builds veRL's ``ActorRolloutRefWorker`` for the actor and
for the ref from veRL's generated trainer config, on one GPU, with no Ray actors and no rollout server: the
"rollout" is synthetic — one prompt of P random tokens and N responses of R random tokens per step. It times the
three phases the paper speeds up:

* ``old_log_prob`` — ``compute_log_prob`` (actor, forward, entropy on);
* ``ref_log_prob`` — ``compute_ref_log_prob`` (ref, forward);
* ``update_actor`` — ``update_actor`` (forward + backward + optimizer step over one mini-batch of N rows),

with micro-batches of ``--mb`` rows (a list runs each), and reports wall time (median of ``--reps`` after ``--warmup``), peak GPU
memory, MFU and the per-phase speedup. The model is a Qwen3 built from its published config with random weights
(``dualkv.bench.qwen3``). Two MFUs per row, both without the checkpointing recompute: ``mfu_useful`` counts the
FLOPs the system itself executes (stock: the N-copy layout; dualkv: the P+ΣR layout), so it is ≤ 100% and says
how well each system uses the GPU; ``mfu`` counts the N-copy FLOPs for both (veRL's convention: the work of the
rows the trainer sees), so dualkv's can exceed 100% and the ratio of the two systems' ``mfu`` is the speedup. The
old log-probs of the two systems are compared
(``logprob_max_abs_diff``; bf16 noise expected). Each system runs in its own child process (its own CUDA context
and peak-memory counter; nothing of the other system stays resident); an out-of-memory phase is a row with status
``OOM`` and the sweep goes on; ``--time-budget-s`` is shared equally by the systems and stops starting new
phases; the result file is rewritten after each system, so a killed run keeps what it measured.

Result: ``out/bench/policy_update-<device>-<UTC time>.json`` (``--out experiments/results`` records a run with the
committed ones that ``experiments/summarize.py`` reads)::

    {"environment": {...}, "benchmark": "policy_update", "config": {...},
     "rows": [{"system", "N", "P", "R", "mb", "phase", "seconds", "seconds_runs", "peak_mem_gib", "mfu",
               "mfu_useful", "status"}, ...],
     "logprob_max_abs_diff": float, "logprob_max_abs_diff_by_N": {"8": ..., ...}}

GPU (H100/H200, one card)::

    python experiments/policy_update_bench.py --model qwen3-1.7b --P 8192 --R 2048 --N 8,16,32 --mb 8

CPU smoke run (seconds; what the test suite runs)::

    python experiments/policy_update_bench.py --tiny

Needs veRL 0.9.1 and its small dependencies (``experiments/verl/wheels.txt``); Ray and ``datasets`` are not needed:
when absent, stubs (``proofs_tests/verl_fixtures/import_stubs.py``) stand in for veRL's import-time uses of them,
in this process only. Run it from the repository root (it imports the CPU platform shim, the stubs and the synthetic
rollouts from ``proofs_tests/verl_fixtures``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from proofs_tests.verl_fixtures import import_stubs, stock_attention  # noqa: E402

#: Pretend these packages are not installed (inherited by the per-system child processes).
HIDE_ENV = import_stubs.HIDE_ENV
#: Packages served by import stubs in this process (set by :func:`stub_unused_imports`).
STUBBED: list[str] = []


def stub_unused_imports() -> list[str]:
    """Hide the packages named in ``$DUALKV_BENCH_HIDE_PACKAGES`` and stub every missing one that veRL imports at
    module top but does not use in process (Ray, datasets, ...). Runs first in :func:`main`, not on import, so
    importing this module (``experiments/summarize.py`` does, for the FLOP helpers) changes nothing."""
    STUBBED[:] = import_stubs.hide_and_stub()
    return STUBBED


SYSTEMS = ("stock", "dualkv")
PHASES = ("old_log_prob", "ref_log_prob", "update_actor")
STOCK_ATTENTION = stock_attention.STOCK_ATTENTION
#: The documented override (the ref follows the actor).
DUALKV_LINES = {"actor_rollout_ref.actor.use_dualkv": True}
TINY = {"model": "tiny", "P": 24, "R": 6, "N": [2, 4], "mb": [2], "warmup": 1, "reps": 1}


# ---------------------------------------------------------------------------------------------- arguments
def _ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="qwen3-0.6b, qwen3-1.7b (default), qwen3-4b, qwen3-8b, or tiny")
    p.add_argument("--layers", type=int, default=None, help="override the number of decoder layers")
    p.add_argument("--model-dir", default=None, help="use this saved HF model (+tokenizer) instead of random weights")
    p.add_argument("--P", type=int, default=None, help="prompt tokens (default 8192)")
    p.add_argument("--R", type=int, default=None, help="tokens per response (default 2048, the paper's R_max)")
    p.add_argument("--N", type=_ints, default=None, help="responses per prompt, comma-separated (default 8,16,32)")
    p.add_argument("--mb", type=_ints, default=None,
                   help="micro-batch rows (ppo and log-prob micro batch size), comma-separated (default 8)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="stock,dualkv (default both)")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs of each phase (default 1)")
    p.add_argument("--reps", type=int, default=None, help="timed runs of each phase; median reported (default 2)")
    p.add_argument("--fused-kernels", choices=("off", "torch", "triton"), default="off",
                   help="veRL's use_fused_kernels log-prob head (default off, veRL's default)")
    p.add_argument("--stock-logprobs", choices=("fused", "verl-fallback"), default="fused",
                   help="stock's log-prob head: 'fused' (default) = a chunked fp32 log-softmax + gather standing in "
                        "for flash-attn's Triton cross-entropy, which veRL uses when flash-attn is installed; "
                        "'verl-fallback' = veRL's own path without flash-attn (a Python loop over tokens in bf16)")
    p.add_argument("--fp32", action="store_true", help="float32 end to end (exactness check; default bf16 mixed)")
    p.add_argument("--strategy", choices=("fsdp2", "fsdp"), default="fsdp2",
                   help="veRL's FSDP strategy for actor and ref (default fsdp2; fsdp = FSDP1, veRL's own default)")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny model and lengths on the CPU: a smoke run")
    p.add_argument("--out", default=str(REPO / "out" / "bench"),
                   help="result folder (default out/bench, git-ignored; experiments/results holds the cited runs)")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="start no new (N, mb) after this many seconds; the rest are recorded as skipped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker-system", default=None, help=argparse.SUPPRESS)   # internal: one system per process
    p.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    defaults = TINY if args.tiny else {"model": "qwen3-1.7b", "P": 8192, "R": 2048, "N": [8, 16, 32], "mb": [8],
                                       "warmup": 1, "reps": 2}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.device = args.device or ("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    args.systems = [s for s in args.systems.split(",") if s]
    if set(args.systems) - set(SYSTEMS) or not args.systems:
        p.error(f"--systems takes a subset of {','.join(SYSTEMS)}")
    if any(n % mb for n in args.N for mb in args.mb):
        p.error(f"every N must be a multiple of every --mb {args.mb} (equal micro-batches); got N {args.N}")
    return args


# ---------------------------------------------------------------------------------------------- setup
def setup_process(device: str) -> None:
    """One-rank process group and veRL's environment variables (a worker reads them)."""
    os.environ.setdefault("VERL_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    if device == "cpu":
        from proofs_tests.verl_fixtures import cpu_platform

        cpu_platform.register()
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo" if device == "cpu" else "cpu:gloo,cuda:nccl", rank=0,
                                             world_size=1)


def register_stock_attention() -> None:
    """The stock system's attention: causal FlashAttention-2 varlen over veRL's packed N-copy rows (PyTorch's
    ``varlen_attn`` on CUDA), Ulysses-aware — see ``proofs_tests/verl_fixtures/stock_attention.py``."""
    stock_attention.register_stock_attention()


def use_fused_stock_logprobs() -> None:
    """Stock veRL computes log-probs with flash-attn's Triton cross-entropy when flash-attn is installed (the GPU
    image here has none); without it veRL loops over tokens (``logprobs_from_logits_v2``), seconds per micro-batch.
    This stands in for the fused kernel: fp32 log-softmax + gather over chunks of rows, all on the GPU."""
    import verl.utils.torch_functional as tf
    import verl.workers.engine.fsdp.transformer_impl as engine
    from torch.utils.checkpoint import checkpoint

    def chunk_logprobs(chunk, lab):
        return torch.gather(chunk.float().log_softmax(-1), -1, lab.unsqueeze(-1)).squeeze(-1)

    def logprobs(logits, labels, inplace_backward=True):
        flat, flat_labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
        # Checkpointed per chunk: like the fused kernel, no (T, V) fp32 tensor is kept for the backward.
        out = torch.cat([checkpoint(chunk_logprobs, chunk, lab, use_reentrant=False)
                         for chunk, lab in zip(flat.split(4096), flat_labels.split(4096))])
        return out.view(labels.shape)

    tf.logprobs_from_logits = engine.logprobs_from_logits = logprobs


def save_model(args: argparse.Namespace, folder: Path) -> tuple[str, Any]:
    """A randomly initialised Qwen3 of the requested size (built on the CPU) saved to ``folder``, and its config."""
    from dualkv.bench.qwen3 import build_model, qwen3_config
    from proofs_tests.verl_fixtures.synthetic import save_random_model

    config = qwen3_config(args.model, max_positions=args.P + args.R + 16, num_layers=args.layers)
    dtype = torch.float32 if args.fp32 else torch.bfloat16
    model = build_model(config, torch.device("cpu"), dtype, seed=args.seed)   # the GPU is left to the children
    path = save_random_model(folder, model)
    del model
    release_memory()
    return path, config


def analysis_model(hf_config: Any):
    """dualkv.analysis's FLOP model of a Qwen3 config."""
    from dualkv.analysis.models import ModelConfig

    return ModelConfig(name=str(getattr(hf_config, "name_or_path", "") or "qwen3"),
                       hidden_size=hf_config.hidden_size, num_layers=hf_config.num_hidden_layers,
                       num_heads=hf_config.num_attention_heads, num_kv_heads=hf_config.num_key_value_heads,
                       head_dim=hf_config.head_dim, intermediate_size=hf_config.intermediate_size,
                       vocab_size=hf_config.vocab_size, tie_word_embeddings=bool(hf_config.tie_word_embeddings))


def trainer_config(args: argparse.Namespace, model_dir: str, n: int, system: str):
    """veRL's generated GRPO trainer config (no Hydra composition needed) with this run's settings; ``n`` is
    ``rollout.n`` (the actor config requires it; the phases take each batch's size from the batch)."""
    import verl
    from omegaconf import OmegaConf

    base = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    precision = "fp32" if args.fp32 else "bf16"
    settings: dict[str, Any] = {
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.model.path": model_dir,
        "actor_rollout_ref.model.override_config": {"attn_implementation": STOCK_ATTENTION},
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.model.use_fused_kernels": args.fused_kernels != "off",
        "actor_rollout_ref.model.fused_kernel_options": {"impl_backend": args.fused_kernels}
        if args.fused_kernels != "off" else {},
        "actor_rollout_ref.actor.strategy": args.strategy, "actor_rollout_ref.ref.strategy": args.strategy,
        "actor_rollout_ref.rollout.n": n, "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.actor.ppo_mini_batch_size": 1,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": args.mb[0],   # each batch sets its own
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": args.mb[0],
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": args.mb[0],
        "actor_rollout_ref.actor.use_dynamic_bsz": False,
        "actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_coef": 0.001,
        "actor_rollout_ref.actor.entropy_coeff": 0.0, "actor_rollout_ref.actor.optim.lr": 1e-6,
        "actor_rollout_ref.actor.use_torch_compile": False,
    }
    for role in ("actor", "ref"):
        settings[f"actor_rollout_ref.{role}.fsdp_config.model_dtype"] = "fp32"
        settings[f"actor_rollout_ref.{role}.fsdp_config.mixed_precision"] = {
            "param_dtype": precision, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    if system == "dualkv":
        from dualkv.integration.verl import enable

        enable()            # what the verl.plugins entry point does where dualkv is installed (here: PYTHONPATH)
        settings.update(DUALKV_LINES)
    cfg = base
    for key, value in settings.items():
        OmegaConf.update(cfg, key, value, force_add=True, merge=False)
    return cfg


def build_workers(cfg) -> tuple[Any, Any]:
    """veRL's ActorRolloutRefWorker for the actor and for the ref (in process)."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    actor = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor")
    actor.init_model()
    ref = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="ref")
    ref.init_model()
    return actor, ref


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- phases
def batches(args: argparse.Namespace, n: int, mb: int, vocab: int):
    """(log-prob TensorDict, update TensorDict, response mask) of one prompt with N synthetic responses, in
    micro-batches of ``mb`` rows (the workers take ``micro_batch_size_per_gpu`` from the batch when it is set)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    from proofs_tests.verl_fixtures.synthetic import rollout_batch

    data = rollout_batch([(args.P, [args.R] * n)], vocab_size=vocab, seed=args.seed)

    def td(**meta):
        out = left_right_2_no_padding(data.to_tensordict())
        tu.assign_non_tensor(out, **meta)
        return out

    log = td(calculate_entropy=True, compute_loss=False, micro_batch_size_per_gpu=mb)
    update = td(calculate_entropy=False, compute_loss=True, global_batch_size=n, mini_batch_size=n, epochs=1,
                seed=args.seed, dataloader_kwargs={"shuffle": False}, micro_batch_size_per_gpu=mb)
    return log, update, data.batch["response_mask"].bool()


def timed(fn: Callable[[], Any], warmup: int, reps: int,
          device: str) -> tuple[float, float | None, Any, list[float]]:
    """(median seconds, peak GiB or None, last result, every timed run's seconds) of ``fn``."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    result = None
    for _ in range(warmup):
        result = fn()
    sync()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(max(reps, 1)):
        start = time.perf_counter()
        result = fn()
        sync()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return statistics.median(times), peak, result, times


def phase_flops(model_cfg, args: argparse.Namespace, n: int, mb: int, phase: str) -> float:
    """N-copy model FLOPs of one phase (micro-batches of mb rows; the update is forward + backward)."""
    from dualkv.analysis.models import model_flops

    return model_flops(model_cfg, phase_layout(args.P, args.R, mb), phase_mode(phase), "ncopy")["total"] * (n // mb)


def phase_layout(prompt_len: int, response_len: int, mb: int):
    """The GroupLayout of one micro-batch: one prompt and ``mb`` responses."""
    from dualkv.layout import GroupLayout

    return GroupLayout.single(prompt_len, [response_len] * mb)


def phase_mode(phase: str) -> str:
    return "fwdbwd" if phase == "update_actor" else "fwd"


def useful_mfu(model_cfg, row: dict) -> float | None:
    """A row's MFU over the FLOPs its own system executes: ``row["mfu"]`` (N-copy FLOPs) for stock, divided by the
    N-copy/dualkv FLOP ratio of the micro-batch for dualkv."""
    from dualkv.analysis.models import step_speedup_bounds

    if row.get("mfu") is None:
        return None
    if row["system"] != "dualkv":
        return row["mfu"]
    layout = phase_layout(row["P"], row["R"], row["mb"])
    return row["mfu"] / step_speedup_bounds(model_cfg, layout, phase_mode(row["phase"]))["flop_ratio"]


def peak_flops(device: str) -> float | None:
    from dualkv.analysis.models import PEAK_BF16_FLOPS

    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def run_system(args, system: str, model_dir: str, model_cfg, vocab: int, rows: list, logprobs: dict,
               deadline: float | None) -> None:
    """Every (N, mb) for one system: build its actor and ref workers once, then time the three phases."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    actor, ref = build_workers(trainer_config(args, model_dir, max(args.N), system))
    peak = peak_flops(args.device)
    for n in args.N:
        for mb in args.mb:
            log_td, update_td, mask = batches(args, n, mb, vocab)
            calls = {"old_log_prob": lambda: actor.compute_log_prob(log_td.clone()),
                     "ref_log_prob": lambda: ref.compute_ref_log_prob(log_td.clone()),
                     "update_actor": lambda: actor.update_actor(update_td.clone())}
            for phase in PHASES:
                skip = deadline is not None and time.monotonic() > deadline
                row = {"system": system, "N": n, "P": args.P, "R": args.R, "mb": mb, "phase": phase,
                       "seconds": None, "seconds_runs": None, "peak_mem_gib": None, "mfu": None,
                       "mfu_useful": None, "status": "skipped" if skip else "ok"}
                if not skip:
                    try:
                        seconds, mem, result, runs = timed(calls[phase], args.warmup, args.reps, args.device)
                        row.update(seconds=seconds, seconds_runs=[round(x, 4) for x in runs], peak_mem_gib=mem)
                        if peak:
                            row["mfu"] = phase_flops(model_cfg, args, n, mb, phase) / (seconds * peak)
                            row["mfu_useful"] = useful_mfu(model_cfg, row)
                        if phase == "old_log_prob":
                            lp = no_padding_2_padding(tu.get(result, "log_probs"), log_td).float().cpu()
                            logprobs.setdefault((n, mb), {})[system] = lp.masked_fill(~mask, 0.0)
                    except torch.OutOfMemoryError:
                        row["status"] = "OOM"
                    except Exception as err:  # noqa: BLE001 - recorded in the row; the sweep goes on
                        row["status"] = f"error: {type(err).__name__}: {str(err)[:300]}"
                    release_memory()
                rows.append(row)
                print(f"[{system}] N={n} mb={mb} {phase}: {row['status']} {row['seconds']}", flush=True)
    del actor, ref


# ---------------------------------------------------------------------------------------------- report
def logprob_diffs(logprobs: dict, reduce: str = "max") -> dict[str, float]:
    """max (or mean) |stock - dualkv| of the old log-probs per N (max over every mb run)."""
    out: dict[str, float] = {}
    for (n, _), v in logprobs.items():
        if "stock" in v and "dualkv" in v:
            delta = (v["stock"] - v["dualkv"]).abs()
            out[str(n)] = max(out.get(str(n), 0.0), float(delta.max() if reduce == "max" else delta.mean()))
    return out


def table(rows: list[dict]) -> str:
    """N, mb, phase, stock/dualkv seconds, speedup, peak memory, each system's MFU over its own FLOPs."""
    index = {(r["system"], r["N"], r["mb"], r["phase"]): r for r in rows}
    lines = [f"{'N':>4} {'mb':>3} {'phase':<13} {'stock s':>9} {'dualkv s':>9} {'speedup':>8} {'stock GiB':>10} "
             f"{'dualkv GiB':>10} {'stock MFU':>10} {'dualkv MFU':>10}"]

    def cell(row, key, fmt):
        if row is None:
            return "-"
        if row["status"] != "ok":
            return row["status"][:9]
        value = row[key]
        return "-" if value is None else format(value, fmt)

    for n, mb in sorted({(r["N"], r["mb"]) for r in rows}):
        for phase in PHASES:
            s, d = index.get(("stock", n, mb, phase)), index.get(("dualkv", n, mb, phase))
            speed = (f"{s['seconds'] / d['seconds']:.2f}x" if s and d and s["status"] == d["status"] == "ok"
                     else "-")
            lines.append(f"{n:>4} {mb:>3} {phase:<13} {cell(s, 'seconds', '.3f'):>9} {cell(d, 'seconds', '.3f'):>9} "
                         f"{speed:>8} {cell(s, 'peak_mem_gib', '.1f'):>10} {cell(d, 'peak_mem_gib', '.1f'):>10} "
                         f"{cell(s, 'mfu_useful', '.1%'):>10} {cell(d, 'mfu_useful', '.1%'):>10}")
    return "\n".join(lines)


def environment(device: str) -> dict:
    from importlib import metadata

    from dualkv.bench.harness import environment as base

    env = base(torch.device(device))
    env["verl"] = metadata.version("verl")
    env["stubbed_packages"] = list(STUBBED)
    return env


def run_worker_process(args: argparse.Namespace) -> int:
    """Child process: one system, every (N, mb); rows and old log-probs saved to ``--worker-out``."""
    from transformers import AutoConfig

    if args.device == "cpu":
        torch.set_num_threads(min(4, torch.get_num_threads()))
    setup_process(args.device)
    register_stock_attention()
    if args.worker_system == "stock" and args.stock_logprobs == "fused":
        use_fused_stock_logprobs()
    hf_config = AutoConfig.from_pretrained(args.model_dir)
    rows: list[dict] = []
    logprobs: dict = {}
    deadline = None if args.time_budget_s is None else time.monotonic() + args.time_budget_s
    run_system(args, args.worker_system, args.model_dir, analysis_model(hf_config),
               min(int(hf_config.vocab_size), 4096), rows, logprobs, deadline)
    torch.save({"rows": rows, "logprobs": logprobs}, args.worker_out)
    return 0


def run_system_process(argv: list[str], system: str, model_dir: str, budget_s: float | None, folder: Path,
                       args: argparse.Namespace) -> tuple[list[dict], dict]:
    """Run one system in a fresh Python process (its own CUDA context, allocator and peak-memory counter; nothing
    of the other system's workers stays resident); a crash becomes error rows."""
    import subprocess

    out = folder / f"{system}.pt"
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--model-dir", model_dir, "--worker-system", system,
           "--worker-out", str(out)]
    if budget_s is not None:
        cmd += ["--time-budget-s", str(max(budget_s, 0.0))]
    proc = subprocess.run(cmd)
    if proc.returncode == 0 and out.exists():
        result = torch.load(out, weights_only=False)
        return result["rows"], result["logprobs"]
    status = f"error: {system} process exited with {proc.returncode}"
    rows = [{"system": system, "N": n, "P": args.P, "R": args.R, "mb": mb, "phase": phase, "seconds": None,
             "peak_mem_gib": None, "mfu": None, "mfu_useful": None, "status": status}
            for n in args.N for mb in args.mb for phase in PHASES]
    return rows, {}


def write_result(path: Path, args: argparse.Namespace, rows: list[dict], logprobs: dict) -> dict:
    """Write the result file (environment, config, rows, old log-prob agreement); returns its content."""
    diffs = logprob_diffs(logprobs)
    result = {"environment": environment(args.device), "benchmark": "policy_update",
              "config": {k: v for k, v in vars(args).items() if k not in ("out", "worker_system", "worker_out")},
              "rows": rows, "logprob_max_abs_diff": max(diffs.values()) if diffs else None,
              "logprob_max_abs_diff_by_N": diffs, "logprob_mean_abs_diff_by_N": logprob_diffs(logprobs, "mean")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    stub_unused_imports()
    args = parse_args(argv)
    if args.worker_system:
        return run_worker_process(args)
    start = time.monotonic()
    rows: list[dict] = []
    logprobs: dict = {}
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = Path(args.out) / f"policy_update-{args.device}-{stamp}.json"
    with tempfile.TemporaryDirectory(prefix="dualkv-bench-") as tmp:
        if args.model_dir:
            model_dir = args.model_dir
        else:
            model_dir, _ = save_model(args, Path(tmp) / "model")
        for i, system in enumerate(args.systems):
            # Each system gets an equal share of what is left, so a slow first system cannot starve the next one.
            budget = None
            if args.time_budget_s is not None:
                budget = (args.time_budget_s - (time.monotonic() - start)) / (len(args.systems) - i)
            sys_rows, sys_logprobs = run_system_process(argv, system, model_dir, budget, Path(tmp), args)
            rows += sys_rows
            for key, value in sys_logprobs.items():
                logprobs.setdefault(key, {}).update(value)
            result = write_result(path, args, rows, logprobs)  # after every system: a killed run keeps its rows
    print(f"wrote {path}")
    print(f"old log-prob max |stock - dualkv|: {result['logprob_max_abs_diff']}")
    print(table(rows))
    return 0 if all(r["status"] in ("ok", "OOM", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
