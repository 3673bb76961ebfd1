"""Multi-process cases (gloo, CPU): each rank builds a real FSDP engine, runs the same batches with stock veRL and
with dualkv, and saves what it saw to ``out_dir/rank{r}.pt`` for the test process to compare.

Run with :func:`spawn`; every case is a top-level function so ``torch.multiprocessing`` can pickle it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch

from dualkv._process import exit_without_finalizers


def spawn(case: Callable, world_size: int, *args) -> list[dict]:
    """Run ``case(rank, world_size, port, *args)`` on ``world_size`` processes; return each rank's saved dict."""
    import torch.multiprocessing as mp

    from . import free_port

    out_dir = Path(args[-1])
    mp.spawn(_entry, args=(case, world_size, free_port(), args), nprocs=world_size, join=True)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def _entry(rank: int, case: Callable, world_size: int, port: int, args: tuple) -> None:
    from . import init_process_group, setup_cpu_verl

    torch.set_num_threads(1)
    setup_cpu_verl()
    init_process_group(rank, world_size, port)
    try:
        result = case(rank, world_size, *args)
        torch.save(result, Path(args[-1]) / f"rank{rank}.pt")
        torch.distributed.barrier()   # no rank tears its process group down while another still talks to it
    finally:
        torch.distributed.destroy_process_group()
    exit_without_finalizers(0)  # a joinable gloo thread could abort this finished rank; its result file is closed


def _run_both(engine, td, n: int, *, train: bool) -> dict:
    """Stock then dualkv on one engine (same weights): outputs, loss and full gradients of each."""
    from verl.utils import tensordict_utils as tu

    from . import full_grads, loss_fn, response_values

    td = td.clone()
    tu.assign_non_tensor(td, return_model_output=True)
    out = {}
    for system in ("stock", "dualkv"):
        engine.engine_config.__dict__["use_dualkv"] = system == "dualkv"
        if train:
            with engine.train_mode():
                res = engine.forward_backward_batch(td.clone(), loss_fn(n), forward_only=False)
                grads = full_grads(engine.module)
                engine.optimizer_zero_grad()
        else:
            with engine.eval_mode():
                res = engine.infer_batch(td.clone(), loss_function=None)
            grads = {}
        mo = res["model_output"]
        out[system] = {"log_probs": response_values(mo["log_probs"], td),
                       "entropy": response_values(mo["entropy"], td) if "entropy" in mo else None,
                       "loss": res["loss"], "metrics": res.get("metrics", {}), "grads": grads}
    return out


def sequence_parallel(rank: int, world_size: int, model_dir: str, groups: list, n: int, mutant: bool,
                      out_dir: str) -> dict:
    """SP = world_size (DP = 1): both ranks run the whole batch; stock and dualkv, inference and training.

    ``mutant``: the head's SP collectives removed (a known-wrong variant: each rank keeps only its own rows)."""
    from . import build_engine, engine_batch

    if mutant:
        from dualkv.integration.verl import head

        head._sum_over = lambda values, group: values
    engine = build_engine(model_dir, dualkv=False, sp=world_size)
    td = engine_batch(groups)
    if mutant:
        return {"infer": _run_both(engine, td, n, train=False)}
    return {"infer": _run_both(engine, td, n, train=False), "train": _run_both(engine, td, n, train=True)}


def count_trie_packings() -> list:
    """Record (in the returned list) every micro-batch this process packs as a trie."""
    import dualkv.integration.verl.engine as dk_engine

    calls: list = []
    original = dk_engine.pack_rows_as_trie
    dk_engine.pack_rows_as_trie = lambda *args: calls.append(1) or original(*args)
    return calls


def sequence_parallel_trie(rank: int, world_size: int, model_dir: str, groups: list, n: int, system_prompt: int,
                           mutant: bool, out_dir: str) -> dict:
    """:func:`sequence_parallel` with ``dualkv_packing="trie"`` on groups sharing a ``system_prompt``-token prefix
    (``trie_calls``: how many micro-batches went through the trie packing)."""
    from . import build_engine, engine_batch

    calls = count_trie_packings()
    if mutant:
        from dualkv.integration.verl import head

        head._sum_over = lambda values, group: values
    engine = build_engine(model_dir, dualkv=False, sp=world_size)
    engine.engine_config.__dict__["dualkv_packing"] = "trie"
    td = engine_batch(groups, system_prompt=system_prompt)
    out = {"infer": _run_both(engine, td, n, train=False)}
    if not mutant:
        out["train"] = _run_both(engine, td, n, train=True)
    return {**out, "trie_calls": len(calls)}


def data_parallel(rank: int, world_size: int, model_dir: str, groups_per_rank: list, n: int, dynamic: bool,
                  strategy: str, out_dir: str) -> dict:
    """DP = world_size: rank r runs its own groups; stock and dualkv training, gradients after FSDP's reduce
    (FSDP2: the full gradient; FSDP1: this rank's shard of the flat parameters)."""
    from . import build_engine, engine_batch

    engine = build_engine(model_dir, dualkv=False, dynamic=dynamic, max_token_len=40, strategy=strategy)
    td = engine_batch(groups_per_rank[rank], seed=rank, use_dynamic_bsz=dynamic, max_token_len_per_gpu=40,
                      micro_batch_size_per_gpu=n)
    return {"infer": _run_both(engine, td, n, train=False), "train": _run_both(engine, td, n, train=True)}


def fused_kernels(rank: int, world_size: int, model_dir: str, groups: list, n: int, out_dir: str) -> dict:
    """use_fused_kernels=True (veRL patches the model class's forward, hence its own process)."""
    return _fused_kernels(model_dir, groups, n)


def fused_kernels_trie(rank: int, world_size: int, model_dir: str, groups: list, n: int, system_prompt: int,
                       out_dir: str) -> dict:
    """:func:`fused_kernels` with ``dualkv_packing="trie"`` on groups sharing a ``system_prompt``-token prefix."""
    return _fused_kernels(model_dir, groups, n, packing="trie", system_prompt=system_prompt)


def _fused_kernels(model_dir: str, groups: list, n: int, packing: str = "group", system_prompt: int = 0) -> dict:
    from . import build_engine, engine_batch

    calls = count_trie_packings()
    engine = build_engine(model_dir, dualkv=False, fused=True)
    engine.engine_config.__dict__["dualkv_packing"] = packing
    td = engine_batch(groups, use_fused_kernels=True, system_prompt=system_prompt)
    return {"infer": _run_both(engine, td, n, train=False), "train": _run_both(engine, td, n, train=True),
            "pid": os.getpid(), "trie_calls": len(calls)}
