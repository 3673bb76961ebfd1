"""Group-preserving ``_balance_batch`` for veRL's two PPO trainers (used when the actor or the ref has
``use_dualkv``).

* legacy ``verl.trainer.ppo.ray_trainer.RayPPOTrainer._balance_batch(batch: DataProto, metrics, ...)`` — reorders
  the DataProto in place;
* v1 ``verl.trainer.ppo.v1.trainer_base.PPOTrainer._balance_batch(batch: KVBatchMeta, metrics, ...)`` — runs every
  step (it ignores ``trainer.balance_batch``), first pads the batch with synthetic no-op samples to a multiple of
  the DP/mini-batch sizes (veRL's ``upsample_batch_to_divisible_size``, kept), then reorders the key list.

Both place groups with :func:`~.balance.group_balanced_partitions`. The logged ``global_seqlen`` statistics are
veRL's (per-row P+R), so dashboards stay comparable to stock runs.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .balance import group_balanced_partitions

__all__ = ["uses_dualkv", "micro_batch_notes", "warn_micro_batches", "dualkv_partitions", "balance_legacy", "balance_v1",
           "uid_of_v1_key"]


def uses_dualkv(config: Any) -> bool:
    """Whether the actor or the ref of a trainer's (OmegaConf) config has ``use_dualkv`` (either packs groups, so
    either needs them kept together); the switch read as :func:`~.switch.switch_value` reads it."""
    from .switch import switch_value

    roles = config.actor_rollout_ref
    return any(bool(switch_value(roles.get(role, {}).get("use_dualkv", None))) for role in ("actor", "ref"))


#: (role, fixed micro-batch size key, its dynamic-batch switch) of each phase whose micro-batches dualkv packs.
_MICRO_BATCH_SETTINGS = (("actor", "ppo_micro_batch_size_per_gpu", "use_dynamic_bsz"),
                         ("rollout", "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz"),
                         ("ref", "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz"))


def micro_batch_notes(config: Any) -> list[str]:
    """Fixed micro-batch sizes (dynamic batch size off) that are not a multiple of ``rollout.n`` in a trainer config
    with dualkv on: exact, but their micro-batches hold parts of prompt groups, so each prompt is packed once per
    micro-batch holding its rows and little is shared (TRL's integration warns the same way)."""
    roles = config.get("actor_rollout_ref", {})
    n = roles.get("rollout", {}).get("n", None)
    if not uses_dualkv(config) or not isinstance(n, int) or n < 2:
        return []
    notes = []
    for role, size_key, dynamic_key in _MICRO_BATCH_SETTINGS:
        section = roles.get(role, {}) or {}
        size = section.get(size_key, None)
        if isinstance(size, int) and size > 0 and not section.get(dynamic_key, False) and size % n:
            notes.append(f"actor_rollout_ref.{role}.{size_key}={size} is not a multiple of rollout.n={n}: its "
                         "micro-batches split prompt groups, so dualkv packs a prompt once per micro-batch holding "
                         f"its rows (exact, but less shared); use a multiple of {n} or {dynamic_key}=true")
    return notes


_noted: set[str] = set()


def warn_micro_batches(config: Any) -> None:
    """Warn once per process for each of :func:`micro_batch_notes`."""
    import warnings

    for note in micro_batch_notes(config):
        if note not in _noted:
            _noted.add(note)
            warnings.warn(note, stacklevel=3)


def dualkv_partitions(group_ids: Sequence, prompt_lens: Sequence[int], response_lens: Sequence[int], dp_size: int,
                      mini_batch_rows: int | None = None) -> list[list[int]]:
    """DP partitions keeping groups whole; with ``mini_batch_rows`` each global mini-batch window is balanced on its
    own and the windows are appended per rank (veRL's ``keep_minibatch``)."""
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

    def equal(loads: list[int], k: int) -> list[list[int]]:
        return get_seqlen_balanced_partitions(loads, k, equal_size=True)

    n = len(group_ids)
    window = n if not mini_batch_rows else mini_batch_rows
    if n % window:
        raise ValueError(f"{n} rows are not a whole number of mini-batches of {window} rows")
    result: list[list[int]] = [[] for _ in range(dp_size)]
    for start in range(0, n, window):
        sl = slice(start, start + window)
        parts = group_balanced_partitions(list(group_ids[sl]), list(prompt_lens[sl]), list(response_lens[sl]),
                                          dp_size, equal_partition=equal)
        for rank, part in enumerate(parts):
            result[rank].extend(start + i for i in part)
    return result


def balance_legacy(trainer: Any, batch: Any, metrics: dict, logging_prefix: str = "global_seqlen",
                   keep_minibatch: bool = False) -> None:
    """Group-preserving replacement of ``RayPPOTrainer._balance_batch`` (in-place reorder of ``batch``)."""
    from verl.utils.seqlen_balancing import log_seqlen_unbalance

    mask = batch.batch["attention_mask"]
    width = batch.batch["prompts"].shape[1]
    prompt_lens = mask[:, :width].sum(-1).tolist()
    response_lens = mask[:, width:].sum(-1).tolist()
    if "uid" not in batch.non_tensor_batch:
        raise ValueError("dualkv balancing needs the batch's 'uid' (one per prompt)")
    uids = list(batch.non_tensor_batch["uid"])
    dp_size = trainer._get_dp_size(trainer.actor_rollout_wg, "actor")
    window = None
    if keep_minibatch:
        window = trainer.config.actor_rollout_ref.actor.ppo_mini_batch_size * trainer.config.actor_rollout_ref.rollout.n
    partitions = dualkv_partitions(uids, prompt_lens, response_lens, dp_size, window)
    batch.reorder(torch.tensor([i for part in partitions for i in part]))
    seqlens = [p + r for p, r in zip(prompt_lens, response_lens)]
    metrics.update(log_seqlen_unbalance(seqlen_list=seqlens, partitions=partitions, prefix=logging_prefix))


def uid_of_v1_key(key: str) -> str:
    """The prompt uid of a v1 TransferQueue key ``{uid}_{session_id}_{index}``."""
    parts = str(key).rsplit("_", 2)
    if len(parts) != 3:
        raise ValueError(f"TransferQueue key {key!r} is not '<uid>_<session>_<index>'; cannot find its prompt group")
    return parts[0]


def balance_v1(trainer: Any, batch: Any, metrics: dict, logging_prefix: str = "global_seqlen",
               keep_minibatch: bool = False) -> Any:
    """Group-preserving replacement of the v1 ``PPOTrainer._balance_batch`` (returns the padded, reordered batch)."""
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.utils.seqlen_balancing import log_seqlen_unbalance

    worker_group = trainer.actor_rollout_wg
    if "actor" not in worker_group._dispatch_info:
        worker_group._dispatch_info["actor"] = worker_group._query_dispatch_info("actor")
    dp_size = max(worker_group._dispatch_info["actor"]) + 1
    batch = upsample_batch_to_divisible_size(batch, trainer._get_required_batch_multiple(dp_size),
                                             trainer.tokenizer.eos_token_id)
    prompt_lens = [int(tag["prompt_len"]) for tag in batch.tags]
    response_lens = [int(tag["response_len"]) for tag in batch.tags]
    uids = [uid_of_v1_key(k) for k in batch.keys]
    window = None
    if keep_minibatch:
        window = trainer.config.actor_rollout_ref.actor.ppo_mini_batch_size * trainer.config.actor_rollout_ref.rollout.n
    partitions = dualkv_partitions(uids, prompt_lens, response_lens, dp_size, window)
    batch.reorder([i for part in partitions for i in part])
    seqlens = [p + r for p, r in zip(prompt_lens, response_lens)]
    metrics.update(log_seqlen_unbalance(seqlen_list=seqlens, partitions=partitions, prefix=logging_prefix))
    return batch
