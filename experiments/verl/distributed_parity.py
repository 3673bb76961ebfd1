"""veRL 0.9.1's own FSDP engine, stock vs dualkv, on several processes: DP=2, Ulysses SP=2, DP=2 x SP=2.

Launch with torchrun (one process per GPU; veRL's own ``initialize_global_process_group`` on CUDA/NCCL)::

    torchrun --nproc-per-node 2 experiments/verl/distributed_parity.py --mode dp2     --out $OUT
    torchrun --nproc-per-node 2 experiments/verl/distributed_parity.py --mode sp2     --out $OUT
    torchrun --nproc-per-node 4 experiments/verl/distributed_parity.py --mode dp2sp2  --out $OUT

``--mode dp1 --groups-per-rank 8`` is the one-process control: the same global batch as ``dp2`` (4 groups per rank),
on one GPU, so a bf16 gap seen at DP=2 can be told apart from one the batch itself has.

and on a CPU over gloo, the same code path at a tiny size (what CI runs)::

    torchrun --nproc-per-node 2 experiments/verl/distributed_parity.py --mode sp2 --device cpu --out DIR

What one run does, on every rank:

1. a random Qwen3 (head_dim 128 on CUDA, so the dualkv kernels serve it; 2 layers) is saved by rank 0;
2. ``--batches`` global GRPO batches (seeds ``--seed``, ``--seed`` + 1, ...; default 4 on CUDA, 1 on a CPU), each
   of G groups of N responses (random lengths), on the same model; each is balanced over the DP ranks with dualkv's
   group-preserving partition — the one both veRL trainers' ``_balance_batch`` use with dualkv — and the run
   **stops with an error if any group's rows land on two ranks** (``--mutant split-groups`` balances rows the way
   stock veRL does, to show the check fires); each rank takes its share, as veRL's dispatch would;
3. for each precision (fp32, bf16) one FSDP2 engine (veRL's ``EngineRegistry``; bf16 = fp32 master weights,
   bf16 compute, fp32 gradient reduction) runs the rank's batch with stock veRL (N-copy rows; FlashAttention-2
   varlen, Ulysses-wrapped as veRL wraps ``flash_attention_2``: ``proofs_tests/verl_fixtures/stock_attention.py``)
   and with dualkv (the CUDA kernels for bf16 on a GPU; the reference for fp32), on the same weights and batches:
   ``infer_batch`` (old log-probs, entropy) and ``forward_backward_batch`` with veRL's ``ppo_loss`` (loss, its
   terms, full gradients after FSDP's reduce, gradient norm); micro-batches of two groups;
4. the comparison (per rank, then gathered):

   * fp32: relative error ``||dualkv - stock|| / ||stock||`` <= 1e-5 for every quantity on every batch;
   * bf16 (:data:`BF16_RULE`): the stock-vs-stock spread is stock bf16 against stock fp32 on the same batch, layout
     and weights (the rounding that bf16 itself puts into veRL's stock run); dualkv bf16 passes when the mean over
     batches of its max |error| against stock fp32 is <= 2 x the mean spread + 1e-4 (3 x for gradients) —
     FlashAttention's rule, ``dualkv.testing``, on means over batches;
   * with SP: every group's first response token (scored from the shared last-prompt row that the SP all-reduce
     sums) is checked on its own, the SP ranks of a DP group must return bitwise the same values, and the batch
     is built so that both SP ranks own shared rows (recorded; ``--mutant no-sp-allreduce`` drops the
     all-reduce to show the check fires).

``--packing trie`` runs dualkv with ``dualkv_packing=trie`` (micro-batches packed as radix tries) and
``--system-prompt K`` gives every prompt the same first K tokens, so the tries share a node across groups; the
SP shared-row placement record (which assumes the group packing) is then skipped.

Rank 0 writes ``<out>/distributed_parity-<mode>[-trie].json`` (GPU names, torch/CUDA/veRL versions, commit from
``$DUALKV_COMMIT`` or git, per-quantity errors and bounds, pass/fail) and the exit status is 0 only when every
check passed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "proofs_tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import torch  # noqa: E402

from dualkv.testing import bound_margin  # noqa: E402

#: world size and Ulysses SP size of each mode.
MODES = {"dp1": (1, 1), "dp2": (2, 1), "sp2": (2, 2), "dp2sp2": (4, 2)}
MUTANTS = ("none", "split-groups", "no-sp-allreduce")
PRECISIONS = ("fp32", "bf16")
N = 4                       # responses per prompt (default of --n)
GROUPS_PER_MICRO_BATCH = 2
#: Packages served by import stubs in this process (set by :func:`setup`).
STUBBED: list[str] = []

#: Model and lengths. CUDA: head_dim 128 (a kernel size); CPU: small, for CI.
SIZES = {
    "gpu": {"model": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=128, max_position_embeddings=4096),
            "prompt": (48, 320), "response": (8, 160)},
    "tiny": {"model": dict(num_attention_heads=4, num_key_value_heads=2),
             "prompt": (3, 14), "response": (1, 7)},
}


class GroupSplitError(RuntimeError):
    """The DP balancing put rows of one prompt group on two ranks."""


# ---------------------------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=sorted(MODES), required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="fp32,bf16 (default both)")
    p.add_argument("--size", choices=sorted(SIZES), default=None, help="default: gpu on cuda, tiny on cpu")
    p.add_argument("--groups-per-rank", type=int, default=4, help="prompt groups per DP rank (even)")
    p.add_argument("--seed", type=int, default=0, help="the model's seed and the first batch's")
    p.add_argument("--batches", type=int, default=None,
                   help="batches (seeds seed, seed+1, ...) the bf16 rule averages over (BF16_RULE); default 4 on "
                        "cuda, 1 on cpu")
    p.add_argument("--responses", dest="n", type=int, default=N, help="responses per prompt (N)")
    p.add_argument("--mutant", choices=MUTANTS, default="none", help="a known-wrong variant (tests only)")
    p.add_argument("--packing", choices=("group", "trie"), default="group",
                   help="dualkv_packing of the dualkv engine (trie: micro-batches as radix tries, docs/trees.md)")
    p.add_argument("--system-prompt", type=int, default=0,
                   help="tokens of a prefix shared by every prompt of the batch (a system prompt; 0: none)")
    p.add_argument("--old-log-probs", choices=("on-policy", "random"), default="on-policy",
                   help="what the training passes use as old log-probs (ON_POLICY_NOTE)")
    p.add_argument("--out", default=str(REPO / "out" / "parity"))
    args = p.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.size = args.size or ("gpu" if args.device == "cuda" else "tiny")
    if args.batches is None:
        args.batches = 4 if args.device == "cuda" else 1
    if args.batches < 1:
        p.error("--batches must be >= 1")
    chosen = [x for x in args.precisions.split(",") if x]
    if not chosen or set(chosen) - set(PRECISIONS):
        p.error(f"--precisions takes a subset of {','.join(PRECISIONS)}")
    args.precisions = [x for x in PRECISIONS if x in chosen]   # fp32 first: bf16 trains on its log-probs
    if "bf16" in args.precisions and "fp32" not in args.precisions:
        p.error("bf16 is judged against stock fp32: --precisions must include fp32")
    if args.groups_per_rank < GROUPS_PER_MICRO_BATCH or args.groups_per_rank % GROUPS_PER_MICRO_BATCH:
        p.error(f"--groups-per-rank must be a positive multiple of {GROUPS_PER_MICRO_BATCH}")
    return args


# ---------------------------------------------------------------------------------------------- setup
def setup(device: str) -> tuple[int, int]:
    """Process group (veRL's own init on CUDA: cpu:gloo + cuda:nccl, device = LOCAL_RANK; gloo on a CPU with the
    CPU platform shim), dualkv's veRL patches, the stock attention. Returns (rank, world size)."""
    from verl_fixtures import import_stubs

    STUBBED[:] = import_stubs.hide_and_stub()   # Ray, datasets, ...: veRL imports them at module top; absent on the GPU hosts
    os.environ.setdefault("VERL_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if device == "cpu":
        import verl_fixtures

        verl_fixtures.setup_cpu_verl()
        torch.set_num_threads(1)
        torch.distributed.init_process_group("gloo")
    else:
        # The GPU hosts run with NVLink multicast off; keep it off in this process too.
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        from verl.utils.distributed import initialize_global_process_group

        initialize_global_process_group()
    from dualkv.integration.verl import enable
    from verl_fixtures.stock_attention import register_stock_attention

    enable()        # what dualkv's verl.plugins entry point does where dualkv is pip-installed
    register_stock_attention()
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


#: Temporary folders this process made; :func:`main` removes them however :func:`run` ends (the ranks leave through
#: :func:`exit_now`, which runs no ``atexit`` hooks).
SCRATCH: list[Path] = []


def shared_model_dir(args: argparse.Namespace, rank: int) -> tuple[str, dict]:
    """Rank 0 saves the random model under a fresh temporary folder (in :data:`SCRATCH`); every rank gets its path."""
    import verl_fixtures

    fields = dict(SIZES[args.size]["model"])
    box = [None]
    if rank == 0:
        SCRATCH.append(Path(tempfile.mkdtemp(prefix="dualkv-parity-")))
        box[0] = verl_fixtures.build_model_dir(SCRATCH[-1] / "model", seed=args.seed, **fields)
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0], fields


# ---------------------------------------------------------------------------------------------- batches
def global_groups(args: argparse.Namespace, dp: int) -> list[tuple[int, list[int]]]:
    """dp x groups-per-rank groups of N responses, random prompt and response lengths (the same on every rank)."""
    g = torch.Generator().manual_seed(1000 + args.seed)
    (p_lo, p_hi), (r_lo, r_hi) = SIZES[args.size]["prompt"], SIZES[args.size]["response"]
    groups = []
    for _ in range(dp * args.groups_per_rank):
        p = int(torch.randint(p_lo, p_hi + 1, (1,), generator=g))
        groups.append((p, [int(x) for x in torch.randint(r_lo, r_hi + 1, (args.n,), generator=g)]))
    return groups


def dp_partitions(batch, dp: int, mutant: str) -> list[list[int]]:
    """Row indices of each DP rank: dualkv's group-preserving balancing (what both veRL trainers run with dualkv),
    or for ``--mutant split-groups`` stock veRL's row balancing (Karmarkar-Karp over P+R per row)."""
    from dualkv.integration.verl.trainers import dualkv_partitions

    width = batch.batch["prompts"].shape[1]
    mask = batch.batch["attention_mask"]
    prompt_lens, response_lens = mask[:, :width].sum(-1).tolist(), mask[:, width:].sum(-1).tolist()
    uids = list(batch.non_tensor_batch["uid"])
    if mutant == "split-groups":
        from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

        seqlens = [p + r for p, r in zip(prompt_lens, response_lens)]
        return [sorted(part) for part in get_seqlen_balanced_partitions(seqlens, dp, equal_size=True)]
    return dualkv_partitions(uids, prompt_lens, response_lens, dp)


def check_partitions(uids: list, partitions: list[list[int]]) -> dict:
    """Raise :class:`GroupSplitError` when a group's rows are on two ranks (or the partition is unusable)."""
    from dualkv.integration.verl.balance import partition_problems, split_groups

    split = split_groups(uids, partitions)
    problems = partition_problems(uids, partitions)
    record = {"rows_per_rank": [len(p) for p in partitions], "split_groups": [str(u) for u in split],
              "problems": problems}
    if split or problems:
        raise GroupSplitError(f"DP balancing split prompt groups across ranks: {len(split)} group(s) "
                              f"{[str(u)[-8:] for u in split]} on several ranks; problems: {problems}")
    return record


def shared_row_owners(groups: list[tuple[int, list[int]]], sp: int) -> list[list[int]]:
    """For each micro-batch (GROUPS_PER_MICRO_BATCH consecutive groups) the SP rank holding each group's last
    prompt row: the P+ΣR stream padded to a multiple of SP is cut into SP equal parts (veRL's Ulysses slice)."""
    owners = []
    for start in range(0, len(groups), GROUPS_PER_MICRO_BATCH):
        chunk = groups[start:start + GROUPS_PER_MICRO_BATCH]
        total = sum(p + sum(rs) for p, rs in chunk)
        part = -(-total // sp)
        offset, ranks = 0, []
        for p, rs in chunk:
            ranks.append((offset + p - 1) // part)
            offset += p + sum(rs)
        owners.append(ranks)
    return owners


def rank_batch(args, groups, partitions, dp_rank: int, old_log_probs: torch.Tensor | None = None):
    """This DP rank's rows of the global rollout batch, as the engine TensorDict (fixed micro-batches of two
    groups), and its groups in order. ``old_log_probs`` ((rows, R_max), this rank's rows) replaces the batch's
    random ones."""
    import verl_fixtures
    from verl_fixtures.synthetic import rollout_batch

    batch = rollout_batch(groups, vocab_size=verl_fixtures.VOCAB, seed=args.seed, system_prompt=args.system_prompt)
    rows = partitions[dp_rank]
    mine = batch.select_idxs(torch.tensor(rows))
    if old_log_probs is not None:
        mask = mine.batch["response_mask"]
        mine.batch["old_log_probs"] = old_log_probs.to(mine.batch["old_log_probs"].dtype).cpu() * mask
    row_group = [gi for gi, (_, rs) in enumerate(groups) for _ in rs]
    order = list(dict.fromkeys(row_group[r] for r in rows))
    td = verl_fixtures.engine_batch_of(mine, micro_batch_size_per_gpu=GROUPS_PER_MICRO_BATCH * args.n,
                                       global_batch_size=len(rows))
    return td, [groups[gi] for gi in order], mine.batch["response_mask"].bool()


# ---------------------------------------------------------------------------------------------- runs
def run_precision(args, model_dir: str, precision: str, sp: int, groups, partitions, mutant: str,
                  old_log_probs: torch.Tensor | None = None) -> dict:
    """Stock and dualkv on one engine of this precision: outputs, loss terms, full gradients. ``old_log_probs``:
    see :func:`rank_batch`."""
    import verl_fixtures
    from verl_fixtures import dist_cases
    from verl_fixtures.stock_attention import STOCK_ATTENTION

    engine = verl_fixtures.build_engine(model_dir, dualkv=False, sp=sp, precision=precision,
                                        attention=STOCK_ATTENTION, micro_batch_size=GROUPS_PER_MICRO_BATCH * args.n)
    engine.engine_config.__dict__["dualkv_packing"] = args.packing
    trie_packings = dist_cases.count_trie_packings()
    dp_rank, dp_size = engine.get_data_parallel_rank(), engine.get_data_parallel_size()
    td, my_groups, mask = rank_batch(args, groups, partitions, dp_rank)
    if mutant == "no-sp-allreduce":     # drop only the all-reduce of the shared last-prompt rows ((G, D) buffer)
        from dualkv.integration.verl import head

        original = getattr(head._sum_over, "__wrapped__", head._sum_over)

        def without_shared_rows(values, group):
            return values if values.dim() == 2 else original(values, group)

        without_shared_rows.__wrapped__ = original
        head._sum_over = without_shared_rows
    infer = dist_cases._run_both(engine, td, args.n, train=False)
    if args.old_log_probs == "on-policy":   # train on the given (or this run's stock) log-probs: ON_POLICY_NOTE
        old = old_log_probs if old_log_probs is not None else infer["stock"]["log_probs"]
        td = rank_batch(args, groups, partitions, dp_rank, old)[0]
    train = dist_cases._run_both(engine, td, args.n, train=True)
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    out = {"dp_rank": dp_rank, "dp_size": dp_size, "groups": my_groups, "trie_packings": len(trie_packings)}
    for system in ("stock", "dualkv"):
        grads = train[system]["grads"]
        flat = torch.cat([grads[k].flatten() for k in sorted(grads)]) if grads else torch.zeros(0)
        sizes = [(k, grads[k].numel()) for k in sorted(grads)]
        out[system] = {"log_probs": infer[system]["log_probs"], "entropy": infer[system]["entropy"],
                       "train_log_probs": train[system]["log_probs"],
                       "loss": float(sum(train[system]["loss"])), "terms": loss_terms(train[system]["metrics"]),
                       "grads": flat, "grad_norm": float(flat.norm()) if flat.numel() else 0.0, "mask": mask,
                       "grad_sizes": sizes}
    return out


#: fp32 absolute floor of a loss term (log-prob scale ~1): on-policy, ppo_kl = mean(old - new) is 0 for stock and
#: ~1e-8 for dualkv, so its relative error says nothing.
FP32_TERM_ATOL = 1e-6

#: Why the runs train on-policy.
ON_POLICY_NOTE = (
    "--old-log-probs on-policy (default): every precision trains with stock fp32's inference log-probs as old "
    "log-probs (PPO ratio ~1, as GRPO's first update). With the batch's random old log-probs (--old-log-probs "
    "random) some tokens sit at the clip boundary (ratio 0.8 / 1.2) and ANY bf16 rounding flips them between "
    "clipped and not, moving every gradient by whole tokens - measured at 92d1fe0 on 2xH100: the DP batch then put "
    "dualkv 2.9x further from fp32 than stock (relative 0.040 vs 0.014, in every parameter), the SP batch put stock "
    "5.5x further than dualkv (0.053 vs 0.0095); fp32 parity held either way.")

#: veRL ppo_loss terms compared (continuous ones; clip fractions are counts that one rounding flips).
LOSS_TERMS = ("actor/pg_loss", "actor/entropy_loss", "kl_loss", "actor/ppo_kl")


def loss_terms(metrics: dict) -> dict[str, list[float]]:
    """veRL's ppo_loss terms, one value per micro-batch (veRL's ``Metric.values``)."""
    terms = {}
    for key in LOSS_TERMS:
        if key in (metrics or {}):
            value = metrics[key]
            terms[key] = [float(v) for v in getattr(value, "values", value)]
    missing = set(LOSS_TERMS) - set(terms)
    if missing:
        raise RuntimeError(f"veRL's ppo_loss did not report {sorted(missing)}; got {sorted(metrics or {})}")
    return terms


# ---------------------------------------------------------------------------------------------- checks
def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The real response tokens of (B, R_max) values."""
    if x.shape != mask.shape:
        raise ValueError(f"values {tuple(x.shape)} and response mask {tuple(mask.shape)} differ in shape")
    return x.double()[mask.to(x.device)]


def quantities(result: dict, system: str) -> dict[str, Any]:
    """Every compared quantity of one system at one precision (tensors flattened over real response tokens)."""
    r = result[system]
    mask = r["mask"]
    q = {"log_probs": _masked(r["log_probs"], mask), "entropy": _masked(r["entropy"], mask),
         "first_token_log_probs": r["log_probs"][:, 0].double(), "first_token_entropy": r["entropy"][:, 0].double(),
         "train_log_probs": _masked(r["train_log_probs"], mask), "loss": r["loss"], "grads": r["grads"].double(),
         "grad_norm": r["grad_norm"]}
    q.update({f"term:{k}": v for k, v in r["terms"].items()})
    return q


def _rel(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _max_abs(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max()) if a.numel() else 0.0


def compare_fp32(stock: dict, dualkv: dict) -> dict:
    from dualkv.testing import REL_BOUNDS

    bound = REL_BOUNDS[torch.float32]
    rows = {}
    for name in stock:
        err, max_abs = _rel(dualkv[name], stock[name]), _max_abs(dualkv[name], stock[name])
        rows[name] = {"kind": "rel", "error": err, "max_abs": max_abs, "bound": bound, "passed": err <= bound}
        if name.startswith("term:"):   # a loss term that is ~0 on-policy (ppo_kl): relative error is undefined
            rows[name].update(atol=FP32_TERM_ATOL, passed=err <= bound or max_abs <= FP32_TERM_ATOL)
    return rows


#: The bf16 rule, fixed at this commit before any GPU run of it (#16: "within stock-vs-stock spread").
BF16_RULE = (
    "FlashAttention's rule averaged over the run's batches: per quantity, mean over batches of max |dualkv bf16 - "
    "stock fp32| <= factor x mean over batches of max |stock bf16 - stock fp32| + 1e-4 (factor 2 for outputs and "
    "loss terms, 3 for gradients; the stock-vs-stock spread is stock bf16's distance from stock fp32 on the same "
    "batch, layout and weights). One batch's max over elements is decided by a handful of tokens (at 92d1fe0 and "
    "57219be the one-batch rule passed or failed with the batch and N while both systems' norm-relative distances "
    "stayed alike), so the GPU runs average 4 batches; each batch's own verdict is kept as a diagnostic.")


def compare_bf16(stock: dict, dualkv: dict, stock32: dict) -> dict:
    """One batch: FlashAttention's rule against stock fp32 (|dualkv_bf16 - stock_fp32| <= factor x |stock_bf16 -
    stock_fp32| + atol, max over elements; factor 2, 3 for gradients) and norm-relative diagnostics."""
    from dualkv.testing import FA_ATOL, FA_FACTOR_GRAD, FA_FACTOR_OUT

    rows = {}
    for name in stock:
        factor = FA_FACTOR_GRAD if name in ("grads", "grad_norm") else FA_FACTOR_OUT
        spread = _max_abs(stock[name], stock32[name])
        err = _max_abs(dualkv[name], stock32[name])
        bound = factor * spread + FA_ATOL[torch.bfloat16]
        rows[name] = {"kind": "max_abs vs stock fp32", "error": err, "stock_bf16_spread": spread, "factor": factor,
                      "fa_atol": FA_ATOL[torch.bfloat16], "bound": bound,
                      "rel_vs_stock_bf16": _rel(dualkv[name], stock[name]),
                      # diagnostics (not the pass rule): norm-relative errors against stock fp32
                      "rel_vs_stock_fp32": _rel(dualkv[name], stock32[name]),
                      "stock_bf16_rel_vs_stock_fp32": _rel(stock[name], stock32[name]), "passed": err <= bound}
    return rows


def _batch_lists(batch_rows: list[dict]) -> dict:
    """Every batch's own error, bound and verdict for one quantity (kept beside a combined row)."""
    return {"batch_errors": [r["error"] for r in batch_rows], "batch_bounds": [r["bound"] for r in batch_rows],
            "batch_passed": [r["passed"] for r in batch_rows]}


def over_batches(per_batch: list[dict]) -> dict:
    """BF16_RULE: per quantity, the batches' one-batch rows (:func:`compare_bf16`) combined into one row whose
    error and spread are means over batches; ``batch_passed`` keeps each batch's own verdict."""
    rows = {}
    for name in per_batch[0]:
        batch_rows = [b[name] for b in per_batch]
        first = batch_rows[0]
        err = sum(r["error"] for r in batch_rows) / len(batch_rows)
        spread = sum(r["stock_bf16_spread"] for r in batch_rows) / len(batch_rows)
        bound = first["factor"] * spread + first["fa_atol"]
        mean = {key: sum(r[key] for r in batch_rows) / len(batch_rows)
                for key in ("rel_vs_stock_bf16", "rel_vs_stock_fp32", "stock_bf16_rel_vs_stock_fp32")}
        rows[name] = {"kind": f"mean over {len(batch_rows)} batches of max_abs vs stock fp32", "error": err,
                      "stock_bf16_spread": spread, "factor": first["factor"], "fa_atol": first["fa_atol"], "bound": bound,
                      **mean, **_batch_lists(batch_rows), "passed": err <= bound}
    return rows


def worst_over_batches(per_batch: list[dict]) -> dict:
    """fp32: a quantity passes only if it passes on every batch; its row is the batch furthest into its bound, with
    every batch's error, bound and verdict (:func:`_batch_lists`)."""
    rows = {}
    for name in per_batch[0]:
        batch_rows = [b[name] for b in per_batch]
        rows[name] = {**max(batch_rows, key=bound_margin), **_batch_lists(batch_rows),
                      "passed": all(r["passed"] for r in batch_rows)}
    return rows


def grads_by_param(stock: torch.Tensor, dualkv: torch.Tensor, stock32: torch.Tensor,
                   sizes: list[tuple[str, int]], top: int = 6) -> list[dict]:
    """The parameters whose bf16 gradients are furthest from stock fp32 relative to stock bf16's own distance
    (max |dualkv - fp32| / max |stock - fp32|), worst first: where a flattened-gradient gap comes from."""
    rows, at = [], 0
    for name, n in sizes:
        sl = slice(at, at + n)
        at += n
        err, spread = _max_abs(dualkv[sl], stock32[sl]), _max_abs(stock[sl], stock32[sl])
        rows.append({"param": name, "numel": n, "max_abs": err, "stock_bf16_spread": spread,
                     "ratio": err / max(spread, 1e-30), "rel_vs_stock_fp32": _rel(dualkv[sl], stock32[sl]),
                     "stock_bf16_rel_vs_stock_fp32": _rel(stock[sl], stock32[sl]),
                     "max_abs_stock_fp32": float(stock32[sl].abs().max()) if n else 0.0})
    return sorted(rows, key=lambda r: -r["max_abs"])[:top]


def rank_report(batches: list[dict]) -> dict:
    """Per precision, per quantity: errors and bounds for this rank over the run's batches (each batch a
    ``{precision: run_precision result}``): fp32 must hold on every batch, bf16 follows BF16_RULE."""
    report = {}
    for precision in batches[0]:
        per_batch = []
        for results in batches:
            stock, dualkv = quantities(results[precision], "stock"), quantities(results[precision], "dualkv")
            per_batch.append(compare_fp32(stock, dualkv) if precision == "fp32" else
                             compare_bf16(stock, dualkv, quantities(results["fp32"], "stock")))
        report[precision] = worst_over_batches(per_batch) if precision == "fp32" else over_batches(per_batch)
    return report


def grad_diagnostics(results: dict) -> dict:
    """Per low precision: :func:`grads_by_param` against stock fp32 (empty without an fp32 run), of one batch
    (:func:`run` passes the first)."""
    if "fp32" not in results:
        return {}
    stock32 = quantities(results["fp32"], "stock")["grads"]
    out = {}
    for precision, result in results.items():
        if precision != "fp32" and stock32.numel():
            out[precision] = grads_by_param(quantities(result, "stock")["grads"],
                                            quantities(result, "dualkv")["grads"], stock32,
                                            result["stock"]["grad_sizes"])
    return out


def _describe(row: dict) -> str:
    """The comparison that decided a row: its relative error and bound, or its absolute floor where that held."""
    text = f"error {row['error']:.2e} bound {row['bound']:.2e}"
    if "atol" in row and row["max_abs"] <= row["atol"]:
        text += f" (passes on the absolute floor: max |diff| {row['max_abs']:.2e} <= {row['atol']:.0e})"
    return text


def sp_consistency(gathered: list[dict], sp: int) -> dict:
    """The SP ranks of a DP group must hold bitwise the same dualkv outputs (the head's all-reduces)."""
    out = {"checked": sp > 1, "passed": True, "mismatches": []}
    if sp == 1:
        return out
    for dp_rank in sorted({g["dp_rank"] for g in gathered}):
        members = [g for g in gathered if g["dp_rank"] == dp_rank]
        for b, batch in enumerate(members[0]["dualkv_log_probs"]):
            for precision, first in batch.items():
                for other in members[1:]:
                    if not torch.equal(first, other["dualkv_log_probs"][b][precision]):
                        out["passed"] = False
                        out["mismatches"].append(f"dp rank {dp_rank} batch {b} {precision}: SP ranks differ")
    return out


# ---------------------------------------------------------------------------------------------- main
def environment(device: str) -> dict:
    from importlib import metadata

    from dualkv._provenance import git_commit

    commit, dirty = git_commit()
    env = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "commit": commit, "dirty": dirty,
           "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "device": device}
    for package in ("verl", "transformers"):
        try:
            env[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            env[package] = None
    if device == "cuda":
        import dualkv

        env["dualkv_backend_bf16"] = dualkv.backend_name(torch.zeros(1, dtype=torch.bfloat16, device="cuda"))
        version = torch.cuda.nccl.version()
        env["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return env


def run(args: argparse.Namespace) -> int:
    rank, world = setup(args.device)
    want_world, sp = MODES[args.mode]
    if world != want_world:
        raise SystemExit(f"--mode {args.mode} needs {want_world} processes (torchrun --nproc-per-node "
                         f"{want_world}); this run has {world}")
    dp = world // sp
    start = time.monotonic()
    record: dict[str, Any] = {"benchmark": "verl_distributed_parity", "mode": args.mode, "world_size": world,
                              "dp": dp, "sp": sp, "mutant": args.mutant, "precisions": args.precisions, "N": args.n,
                              "groups_per_micro_batch": GROUPS_PER_MICRO_BATCH, "strategy": "fsdp2",
                              "packing": args.packing, "system_prompt": args.system_prompt}
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    names: list = [None] * world
    torch.distributed.all_gather_object(names, device_name)
    record["devices"] = names
    record["environment"] = environment(args.device)
    record["environment"]["stubbed_packages"] = list(STUBBED)
    record["tolerance"] = {
        "fp32": "relative error ||dualkv - stock|| / ||stock|| <= 1e-5 (dualkv.testing.REL_BOUNDS[float32]); a loss "
                "term also passes at max |dualkv - stock| <= 1e-6 (on-policy ppo_kl is ~0)",
        "bf16": BF16_RULE, "batches": args.batches,
        "old_log_probs": args.old_log_probs, "old_log_probs_note": ON_POLICY_NOTE,
    }
    suffix = "".join(f"-{v}" for v, default in ((args.packing, "group"), (args.mutant, "none")) if v != default)
    suffix += f"-n{args.n}" if args.n != N else ""
    out_path = Path(args.out) / f"distributed_parity-{args.mode}{suffix}.json"
    status = 1
    try:
        import verl_fixtures
        from verl_fixtures.synthetic import rollout_batch

        model_dir, fields = shared_model_dir(args, rank)
        record["model"] = {"arch": "qwen3", "vocab": verl_fixtures.VOCAB, **fields}
        record["batch_seeds"] = [args.seed + b for b in range(args.batches)]
        record["global_groups"], record["partitions"], batches = [], [], []
        for seed in record["batch_seeds"]:
            batch_args = argparse.Namespace(**{**vars(args), "seed": seed})
            groups = global_groups(batch_args, dp)
            batch = rollout_batch(groups, vocab_size=verl_fixtures.VOCAB, seed=seed,
                                  system_prompt=args.system_prompt)
            partitions = dp_partitions(batch, dp, args.mutant)
            record["global_groups"].append(groups)
            record["partitions"].append(check_partitions(list(batch.non_tensor_batch["uid"]), partitions))
            results = {}
            for precision in args.precisions:
                # on-policy: every precision trains on stock fp32's log-probs (ON_POLICY_NOTE)
                old = results["fp32"]["stock"]["log_probs"] if "fp32" in results else None
                results[precision] = run_precision(batch_args, model_dir, precision, sp, groups, partitions,
                                                   args.mutant, old)
            batches.append(results)
        record["partition"] = {"split_groups": sorted({g for c in record["partitions"] for g in c["split_groups"]})}
        first = batches[0][args.precisions[0]]
        mine = {"rank": rank, "dp_rank": first["dp_rank"], "groups": [b[args.precisions[0]]["groups"] for b in batches],
                "report": rank_report(batches), "grads_by_param": grad_diagnostics(batches[0]),
                "trie_packings": sum(r["trie_packings"] for b in batches for r in b.values()),
                "dualkv_log_probs": [{p: r["dualkv"]["log_probs"].cpu() for p, r in b.items()} for b in batches]}
        gathered: list = [None] * world
        torch.distributed.all_gather_object(gathered, mine)
        if rank == 0:
            record["ranks"] = [{k: g[k] for k in ("rank", "dp_rank", "groups", "report", "grads_by_param",
                                                  "trie_packings")}
                               for g in gathered]
            record["sp_consistency"] = sp_consistency(gathered, sp)
            # where the group packing puts each shared last-prompt row (a trie packs differently: not recorded)
            # per rank, per batch, per micro-batch: the SP ranks holding a shared last-prompt row
            owners = [[shared_row_owners(groups, sp) for groups in g["groups"]] for g in gathered] \
                if args.packing == "group" else None
            record["sp_shared_row_owners"] = owners
            both = sp == 1 or owners is None \
                or all({o for mb in batch for o in mb} == set(range(sp)) for own in owners for batch in own)
            record["sp_shared_rows_on_every_sp_rank"] = both
            failed = sorted({f"{p}:{name}" for g in gathered for p, rows in g["report"].items()
                             for name, row in rows.items() if not row["passed"]})
            record["failed"] = failed
            record["passed"] = not failed and record["sp_consistency"]["passed"] and both
            status = 0 if record["passed"] else 1
    except GroupSplitError as err:
        record["error"] = str(err)
        record["passed"] = False
        print(f"FAILED: {err}", file=sys.stderr, flush=True)
    record["seconds"] = time.monotonic() - start
    if rank == 0:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(record, indent=1, default=str))
        summary = "PASSED" if record.get("passed") else f"FAILED {record.get('failed') or record.get('error')}"
        print(f"[{args.mode}] {summary}; wrote {out_path} ({record['seconds']:.1f} s)", flush=True)
        for r in record.get("ranks", []):
            for precision, rows in r["report"].items():
                name, row = max(rows.items(), key=lambda kv: bound_margin(kv[1]))
                print(f"  rank {r['rank']} {precision}: worst {name}: {_describe(row)}", flush=True)
    flag = [status]
    torch.distributed.broadcast_object_list(flag, src=0)
    torch.distributed.barrier()         # every rank is done with the saved model (main removes it)
    torch.distributed.destroy_process_group()
    return int(flag[0])


def exit_now(code: int) -> None:
    """Leave a torchrun rank without finalisers (:func:`dualkv._process.exit_without_finalizers`: a gloo thread
    joinable at interpreter exit aborts a finished rank); every result is written and flushed before this point."""
    from dualkv._process import exit_without_finalizers

    exit_without_finalizers(code)


def main(argv: list[str] | None = None) -> int:
    from dualkv.integration.verl.compat import exit_unless_supported_verl

    try:
        args = parse_args(argv)
        exit_unless_supported_verl("distributed_parity.py")
        return run(args)
    finally:
        for folder in SCRATCH:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    exit_now(main())
