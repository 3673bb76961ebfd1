"""``dualkv bench layer``: one Qwen3-8B decoder layer (hidden 4096, 32 heads, 8 KV heads, head dim 128,
intermediate 12288, RMS eps 1e-6, RoPE theta 1e6; random init), forward + backward, bf16, per system
(:mod:`dualkv.bench.systems`) over the paper's (P, mb) sweep with R ~ U(131, 2048).

The layer runs exactly as in a model: input hidden states (requiring grad) laid out as the system lays out the
micro-batch, RoPE for its position ids, and a random output gradient over every token of that layout.
"""

from __future__ import annotations

import argparse
from typing import Callable

import torch

from . import register_bench
from .harness import RunRecorder, add_sweep_arguments, run_sweep, sweep_command, sweep_config
from .qwen3 import QWEN3, build_layer, qwen3_config
from .systems import SYSTEMS, SystemBatch, build_batch, register_attention

__all__ = ["layer_forward", "layer_step", "run_layer_bench"]


def layer_forward(layer: torch.nn.Module, rotary: torch.nn.Module, batch: SystemBatch,
                  hidden: torch.Tensor) -> torch.Tensor:
    """The decoder layer on ``hidden`` (B, L, D) laid out as ``batch``; returns (B, L, D)."""
    layer.self_attn.config._attn_implementation = batch.attn_name
    cos, sin = rotary(hidden, batch.position_ids)
    out = layer(hidden, attention_mask=None, position_ids=batch.position_ids, position_embeddings=(cos, sin),
                **batch.forward_kwargs)
    return out[0] if isinstance(out, tuple) else out


def layer_step(layer: torch.nn.Module, rotary: torch.nn.Module, batch: SystemBatch, hidden_packed: torch.Tensor,
               seed: int) -> Callable[[], None]:
    """Inputs for ``batch`` (made now, untimed) and the timed step: forward + backward of the layer."""
    b, length = batch.grid
    hidden = hidden_packed[batch.gather].view(b, length, -1).detach().requires_grad_()
    gen = torch.Generator(device=hidden.device).manual_seed(seed)
    grad_out = torch.randn(hidden.shape, generator=gen, device=hidden.device, dtype=hidden.dtype)
    params = list(layer.parameters())

    def step() -> None:
        hidden.grad = None
        for p in params:
            p.grad = None
        layer_forward(layer, rotary, batch, hidden).backward(grad_out)

    return step


def _args(p: argparse.ArgumentParser) -> None:
    add_sweep_arguments(p, systems=SYSTEMS)
    p.add_argument("--model", default="qwen3-8b", choices=sorted(QWEN3),
                   help="whose layer dimensions (default qwen3-8b; tiny with --tiny)")


def _layer_bench(args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
                 configs: list[tuple[int, int]]) -> None:
    """Time one decoder layer per system and (P, mb); write the result file and plot."""
    register_attention()
    name = "tiny" if args.tiny else args.model
    max_pos = max(p + args.r_range[1] for p, _ in configs)
    config = qwen3_config(name, max_positions=max_pos)
    layer, rotary = build_layer(config, device, dtype, seed=args.seed)
    recorder = RunRecorder("layer", device, sweep_config(
        args, dtype, model_dims=name, hidden_size=config.hidden_size, heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads, head_dim=config.head_dim, intermediate_size=config.intermediate_size),
        args.out, args.time_budget_s)
    print(f"dualkv bench layer: {name} layer on {recorder.env['gpu']}, {len(configs)} (P, mb) configs")

    def build_row(system, packed):
        def build():
            batch = build_batch(system, packed, device)
            gen = torch.Generator(device=device).manual_seed(args.seed)
            hidden = torch.randn(packed.layout.total_tokens, config.hidden_size, generator=gen, device=device,
                                 dtype=dtype)
            return layer_step(layer, rotary, batch, hidden, args.seed + 1), batch.tokens
        return build

    run_sweep(args, recorder, configs, config.vocab_size, build_row)


run_layer_bench = sweep_command(_layer_bench)
register_bench("layer", "one Qwen3-8B decoder layer, fwd+bwd: dualkv vs N-copy (FA2, cuDNN), the cuDNN "
                        "cascade, Prefix-Grouper-style, FlexAttention", _args, run_layer_bench)
