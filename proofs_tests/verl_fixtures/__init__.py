"""Fixtures for the veRL tests: CPU platform, a tiny random model with an offline-built tokenizer, veRL-format
batches, FSDP2 engines on gloo. Nothing is downloaded.

Everything here runs veRL's real code (engine, worker, losses, padding helpers); only the platform shim is ours.
"""

from __future__ import annotations

import os
import socket
from functools import partial
from pathlib import Path
from typing import Sequence

import torch

from . import cpu_platform

VOCAB = 64


def setup_cpu_verl() -> None:
    """CPU platform + quiet veRL; call before building engines."""
    os.environ.setdefault("VERL_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cpu_platform.register()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(rank: int = 0, world_size: int = 1, port: int | None = None) -> None:
    """gloo process group (idempotent in a process)."""
    if torch.distributed.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port or os.environ.get("MASTER_PORT") or free_port())
    os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"] = str(rank), str(world_size), str(rank)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)


def build_model_dir(path: Path, arch: str = "qwen3", seed: int = 0, **overrides) -> str:
    """Save a tiny random ``arch`` causal LM (dualkv.testing.tiny_causal_lm, float32) and its tokenizer."""
    from .synthetic import save_random_model
    from dualkv.testing import tiny_causal_lm

    fields = dict(vocab=VOCAB, tie_word_embeddings=False)
    fields.update(overrides)
    return save_random_model(path, tiny_causal_lm(arch, dtype=torch.float32, seed=seed, **fields))


def tiny_model_dir(tmp_path_factory, name: str, arch: str = "qwen3", **overrides) -> str:
    """CPU platform + gloo group (world 1) + a tiny model saved under a fresh temporary folder ``name``."""
    setup_cpu_verl()
    init_process_group()
    return build_model_dir(tmp_path_factory.mktemp(name), arch=arch, **overrides)


# ---------------------------------------------------------------------------------------------- batches
def engine_batch(groups: Sequence[tuple[int, Sequence[int]]], *, seed: int = 0, temperature: float = 1.0,
                 calculate_entropy: bool = True, uids: Sequence[str] | None = None, system_prompt: int = 0,
                 **meta):
    """The no-padding TensorDict veRL's workers hand the engine (``left_right_2_no_padding`` of a synthetic rollout
    batch), with the non-tensor keys the trainer and worker set. ``system_prompt``: a prefix of that many tokens
    shared by every prompt (:func:`.synthetic.rollout_batch`)."""
    from .synthetic import rollout_batch

    batch = rollout_batch(groups, vocab_size=VOCAB, seed=seed, temperature=temperature, uids=uids,
                          system_prompt=system_prompt)
    return engine_batch_of(batch, calculate_entropy=calculate_entropy, **meta)


def engine_batch_of(batch, *, calculate_entropy: bool = True, **meta):
    """:func:`engine_batch` of a given rollout ``DataProto`` (e.g. one DP rank's share of a balanced batch)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(batch.to_tensordict())
    rows = td.batch_size[0]
    defaults = dict(calculate_entropy=calculate_entropy, compute_loss=True, use_remove_padding=True,
                    use_dynamic_bsz=False, micro_batch_size_per_gpu=rows, max_token_len_per_gpu=4096,
                    use_fused_kernels=False, global_batch_size=rows)
    defaults.update(meta)
    tu.assign_non_tensor(td, **defaults)
    return td


# ---------------------------------------------------------------------------------------------- engines
def actor_config(n: int, **overrides):
    """An FSDPActorConfig for the loss (vanilla PPO clip, token-mean, entropy bonus and a KL loss on)."""
    from verl.workers.config import FSDPActorConfig

    fields = dict(strategy="fsdp2", rollout_n=n, ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1,
                  entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl",
                  use_torch_compile=False)
    fields.update(overrides)
    return FSDPActorConfig(**fields)


def loss_fn(n: int, **overrides):
    from verl.workers.utils.losses import ppo_loss

    return partial(ppo_loss, config=actor_config(n, **overrides))


def build_engine(model_dir: str, *, dualkv: bool, sp: int = 1, fused: bool = False, dynamic: bool = False,
                 forward_only: bool = False, max_token_len: int = 4096, micro_batch_size: int = 64,
                 strategy: str = "fsdp2", precision: str = "fp32", attention: str = "sdpa"):
    """An initialised FSDP language-model engine (``strategy`` fsdp2 or fsdp; gradient checkpointing on).

    ``precision``: "fp32" (float32 end to end) or "bf16" (veRL's actor default: fp32 master weights, bf16 compute,
    fp32 gradient reduction). ``attention``: the model's ``attn_implementation`` for stock micro-batches."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry

    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be 'fp32' or 'bf16'; got {precision!r}")
    model_config = HFModelConfig(path=model_dir, override_config={"attn_implementation": attention},
                                 use_remove_padding=True, enable_gradient_checkpointing=True,
                                 use_fused_kernels=fused, fused_kernel_options={"impl_backend": "torch"} if fused else {})
    engine_config = FSDPEngineConfig(
        strategy=strategy, model_dtype="fp32", forward_only=forward_only, ulysses_sequence_parallel_size=sp,
        mixed_precision={"param_dtype": precision, "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
        use_torch_compile=False, use_dynamic_bsz=dynamic, max_token_len_per_gpu=max_token_len,
        micro_batch_size_per_gpu=micro_batch_size, infer_max_token_len_per_gpu=max_token_len,
        infer_micro_batch_size_per_gpu=micro_batch_size, use_remove_padding=True, use_fused_kernels=fused)
    object.__setattr__(engine_config, "use_dualkv", dualkv)
    engine = EngineRegistry.new(model_type="language_model", backend=strategy, model_config=model_config,
                                engine_config=engine_config, optimizer_config=FSDPOptimizerConfig(lr=1e-3),
                                checkpoint_config=CheckpointConfig())
    engine.initialize()
    return engine


def full_grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient as a full (unsharded) float64 CPU tensor."""
    out = {}
    for name, p in module.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        out[name] = g.detach().double().cpu().clone()
    return out


def response_values(nested: torch.Tensor, td) -> torch.Tensor:
    """(B, R_max) response-token values from an engine output, the way veRL's losses read them."""
    from verl.workers.utils.padding import no_padding_2_padding

    return no_padding_2_padding(nested, td).double()


# ---------------------------------------------------------------------------------------------- recipes
#: What a user adds to a stock GRPO recipe (README "veRL"): one override.
DUALKV_OVERRIDES = ["+actor_rollout_ref.actor.use_dualkv=true"]
#: The same with the config class named explicitly (works without plugin discovery).
DUALKV_EXPLICIT_OVERRIDES = [
    "actor_rollout_ref.actor._target_=dualkv.integration.verl.config.DualKVActorConfig",
    "+actor_rollout_ref.actor.use_dualkv=true",
    "actor_rollout_ref.ref._target_=dualkv.integration.verl.config.DualKVActorConfig",
    "+actor_rollout_ref.ref.use_dualkv=true",
]


def compose_grpo(model_dir: str, n: int, *, dualkv: bool, strategy: str | None = None, extra: Sequence[str] = ()):
    """veRL's ``ppo_trainer`` config composed by Hydra as ``main_ppo`` would, for a GRPO run on the tiny model
    (float32, sdpa, fixed micro-batches of one group; veRL's default strategy, FSDP1, unless ``strategy``), plus
    :data:`DUALKV_OVERRIDES` when ``dualkv``."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    overrides = [
        "algorithm.adv_estimator=grpo", f"actor_rollout_ref.model.path={model_dir}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"actor_rollout_ref.rollout.n={n}", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={n}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={n}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={n}",
        "actor_rollout_ref.actor.use_torch_compile=false", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32", "actor_rollout_ref.ref.fsdp_config.model_dtype=fp32",
        "actor_rollout_ref.actor.optim.lr=1e-3",
    ]
    for role in ("actor", "ref"):
        overrides += [f"+actor_rollout_ref.{role}.fsdp_config.mixed_precision.{k}=fp32"
                      for k in ("param_dtype", "reduce_dtype", "buffer_dtype")]
    if strategy is not None:
        overrides.append(f"actor_rollout_ref.actor.strategy={strategy}")   # the ref follows the actor
    overrides += list(DUALKV_OVERRIDES if dualkv else []) + list(extra)
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)
