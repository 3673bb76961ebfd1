"""``dualkv bench model``: a whole Qwen3 causal LM (random init from the real config; default Qwen3-1.7B, any of
0.6b/1.7b/4b/8b, ``--layers`` to cut depth), bf16, one RL training step's forward + backward per system: the
decoder on the system's token layout, then the chunked fused log-prob head over the response tokens (same head for
every system), loss = -mean(logp) - 1e-3 mean(entropy). Gradient checkpointing is on by default (as in veRL).
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from ..integration.hf import disable_dualkv, enable_dualkv
from ..integration.logprobs import token_logprobs
from ..integration.packing import PackedBatch
from . import register_bench
from .harness import RunRecorder, add_sweep_arguments, run_sweep, sweep_command, sweep_config
from .qwen3 import QWEN3, build_model, qwen3_config
from .systems import ATTN_NAMES, SYSTEMS, SystemBatch, build_batch, register_attention

__all__ = ["model_logprobs", "model_step", "run_model_bench", "use_system"]


def model_logprobs(model: torch.nn.Module, packed: PackedBatch, batch: SystemBatch, *, chunk_size: int,
                   fused: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's decoder on ``batch``'s layout of ``packed``, then the log-prob head: (ΣR,) logp and entropy.

    The model must run ``batch``'s attention (inside :func:`use_system`).
    """
    device = model.device
    b, length = batch.grid
    ids = packed.input_ids.to(device)[batch.gather].view(b, length)
    hidden = model.get_decoder()(input_ids=ids, position_ids=batch.position_ids, use_cache=False,
                                 **batch.forward_kwargs).last_hidden_state
    return token_logprobs(hidden.reshape(b * length, -1), model.get_output_embeddings().weight,
                          batch.predictor_index, packed.response_ids.to(device), chunk_size=chunk_size, fused=fused)


@contextmanager
def use_system(model: torch.nn.Module, system: str) -> Iterator[torch.nn.Module]:
    """Run ``model`` with ``system``'s attention inside the block (``"dualkv"`` through :func:`enable_dualkv`)."""
    if system == "dualkv":
        enable_dualkv(model)
        try:
            yield model
        finally:
            disable_dualkv(model)
        return
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTN_NAMES[system])
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


def model_step(model: torch.nn.Module, packed: PackedBatch, batch: SystemBatch, chunk_size: int) -> Callable[[], None]:
    """The timed step: forward, log-prob head, backward into every parameter."""

    def step() -> None:
        model.zero_grad(set_to_none=True)
        logp, entropy = model_logprobs(model, packed, batch, chunk_size=chunk_size)
        (-logp.mean() - 1e-3 * entropy.mean()).backward()

    return step


def _args(p: argparse.ArgumentParser) -> None:
    add_sweep_arguments(p, systems=SYSTEMS)
    p.add_argument("--model", default="qwen3-1.7b", choices=sorted(QWEN3),
                   help="Qwen3 size (random init from its config; default qwen3-1.7b; tiny with --tiny)")
    p.add_argument("--layers", type=int, default=None, help="use only this many decoder layers")
    p.add_argument("--no-grad-ckpt", action="store_true", help="no gradient checkpointing")
    p.add_argument("--chunk-size", type=int, default=2048, help="log-prob head rows per chunk (default 2048)")


def _model_bench(args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
                 configs: list[tuple[int, int]]) -> None:
    """Time one whole-model training step per system and (P, mb); write the result file and plot."""
    register_attention()
    name = "tiny" if args.tiny else args.model
    config = qwen3_config(name, max_positions=max(p + args.r_range[1] for p, _ in configs), num_layers=args.layers)
    model = build_model(config, device, dtype, seed=args.seed)
    if not args.no_grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    recorder = RunRecorder("model", device, sweep_config(
        args, dtype, model=name, layers=config.num_hidden_layers, hidden_size=config.hidden_size,
        params_billion=round(sum(p.numel() for p in model.parameters()) / 1e9, 3),
        gradient_checkpointing=not args.no_grad_ckpt, head=f"fused chunked log-prob head, chunk {args.chunk_size}"),
        args.out, args.time_budget_s)
    print(f"dualkv bench model: {name} ({config.num_hidden_layers} layers) on {recorder.env['gpu']}, "
          f"{len(configs)} (P, mb) configs")

    def build_row(system, packed):
        def build():
            batch = build_batch(system, packed, device)
            return model_step(model, packed, batch, args.chunk_size), batch.tokens
        return build

    run_sweep(args, recorder, configs, config.vocab_size, build_row, around=lambda system: use_system(model, system))


run_model_bench = sweep_command(_model_bench)
register_bench("model", "a whole Qwen3 model (random init), fwd+bwd with the log-prob head: dualkv vs N-copy "
                        "(FA2, cuDNN), the cuDNN cascade, Prefix-Grouper-style, FlexAttention", _args, run_model_bench)
