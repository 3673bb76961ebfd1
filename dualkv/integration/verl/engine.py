"""The dualkv micro-batch path of veRL's FSDP language-model engine (``FSDPEngineWithLMHead``).

For an engine whose config carries ``use_dualkv`` (set by :class:`~dualkv.integration.verl.config.DualKVActorConfig`
on the actor and the ref; the critic never has it), each micro-batch is

1. repacked from veRL's N rows [P; R_b] into P+ΣR per prompt group (:mod:`.rows`; refused with
   :class:`~.rows.DualKVBatchError` when groups are split or prompts differ);
2. with Ulysses SP, padded to a multiple of SP and sliced (veRL's own ``ulysses_pad_and_slice_inputs``) — the
   repack comes first, so each group's prompt stays one contiguous block;
3. run through the model with the "dualkv" attention (:mod:`.sequence_parallel` does the all-to-alls) inside the
   model's own (FSDP-wrapped) forward, with ``lm_head`` computing log-probs/entropy of the response tokens only
   (:mod:`.head`) instead of (T × V) logits;
4. returned as nested tensors in veRL's per-row layout, so ``no_padding_2_padding``, the losses and
   ``restore_dynamic_batch`` run unchanged.

With ``dualkv_packing="trie"`` on the engine config step 1 packs the micro-batch's rows as their radix trie instead
(:mod:`.trie`: prefixes shared across groups, e.g. a system prompt, stored once; no uid needed) and the head scores
each packed response token once, read back once per row.

Dynamic batch size uses :mod:`.micro_batches` (groups kept whole, counted as P+ΣR tokens); fixed micro-batch
sizes keep veRL's contiguous chunks, which never reorder rows. Both of veRL's FSDP strategies run: FSDP2 shards
the ``transformers`` model in place, FSDP1 (``strategy=fsdp``, veRL's default) wraps it (:func:`hf_model`).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from ..hf import ATTN_NAME, LAYOUT_KWARG, disable_dualkv, enable_dualkv, register
from ..logprobs import DEFAULT_CHUNK, _head_of
from .head import HeadPlan, RowKernel, dualkv_row_kernel, head_logprobs, verl_fused_row_kernel
from .micro_batches import plan_micro_batches
from .rows import (DualKVBatchError, group_ids_of, pack_rows, packed_response_lens, prompt_lengths,
                   response_values_to_rows, to_nested_rows)
from .sequence_parallel import ulysses_packed_attention
from .trie import pack_rows_as_trie

__all__ = ["ENGINE_FLAG", "PACKING_FLAG", "PACKINGS", "MICRO_BATCH_FLAG", "packing_of", "hf_model", "dualkv_enabled",
           "set_dualkv_attention", "run_packed_model", "dualkv_forward_step", "group_prepare_micro_batches"]

#: Attribute of the engine config (``FSDPEngineConfig``) that turns the dualkv path on.
ENGINE_FLAG = "use_dualkv"
#: Attribute of the engine config choosing the packing of a micro-batch (``dualkv_packing``; default "group").
PACKING_FLAG = "dualkv_packing"
#: "group": each uid group's prompt once (P+ΣR); "trie": the radix trie of the rows (:mod:`.trie`).
PACKINGS = ("group", "trie")
#: Non-tensor key the engine puts on a batch so micro-batching keeps prompt groups whole.
MICRO_BATCH_FLAG = "dualkv_group_micro_batches"
#: Engine attribute: weak reference to the module currently switched to the "dualkv" attention (None: none).
_STATE = "_dualkv_attention_module"


def hf_model(module: torch.nn.Module) -> torch.nn.Module:
    """The ``transformers`` model of an engine's module: FSDP1 wraps it (``FullyShardedDataParallel.module``; its
    forward unshards the root's parameters and then calls the wrapped model), FSDP2 shards it in place."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return module.module if isinstance(module, FullyShardedDataParallel) else module


def dualkv_enabled(engine: Any) -> bool:
    """True when this engine runs its micro-batches through dualkv."""
    return bool(getattr(getattr(engine, "engine_config", None), ENGINE_FLAG, False))


def packing_of(engine: Any) -> str:
    """The engine's packing, "group" (default) or "trie"; anything else is refused by name."""
    packing = getattr(getattr(engine, "engine_config", None), PACKING_FLAG, "group")
    if packing not in PACKINGS:
        raise ValueError(f"{PACKING_FLAG}={packing!r}: expected one of {', '.join(PACKINGS)}")
    return packing


@dataclass(frozen=True)
class _Packed:
    """One micro-batch packed either way: the model's (T,) inputs, the layout, the head plan for an SP slice, and
    the way from the plan's values back to (Σ_b R'_b,) row-order values and veRL's nested rows."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    layout: Any
    plan: Callable[[int, int | None], HeadPlan]
    to_rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _pack_micro_batch(engine: Any, micro_batch: Any) -> _Packed:
    from verl.utils import tensordict_utils as tu

    input_ids = micro_batch["input_ids"]
    prompt_lens = prompt_lengths(micro_batch["prompts"], micro_batch.get("attention_mask", None))
    if packing_of(engine) == "trie":
        trie = pack_rows_as_trie(input_ids, micro_batch["position_ids"], prompt_lens)
        targets, total = trie.targets, trie.layout.total_tokens
        return _Packed(trie.index.packed_ids, trie.index.position_ids, trie.layout,
                       lambda rank, part: HeadPlan.for_predictors(targets.predictor_index, targets.target_ids,
                                                                  rank=rank, part=part, total=total),
                       lambda values, offsets: response_values_to_rows(targets.unpack(values), prompt_lens, offsets))
    packed = pack_rows(input_ids, micro_batch["position_ids"], prompt_lens,
                       group_ids_of(tu.get(micro_batch, "uid"), input_ids.offsets().numel() - 1))
    return _Packed(packed.input_ids, packed.position_ids, packed.layout,
                   lambda rank, part: HeadPlan.build(packed, rank=rank, part=part),
                   lambda values, offsets: to_nested_rows(values, packed, offsets))


def set_dualkv_attention(engine: Any, on: bool) -> None:
    """Switch the engine's model to (or back from) the "dualkv" attention; idempotent.

    The per-layer attention is :func:`~.sequence_parallel.ulysses_packed_attention`, which is plain
    ``shared_prefix_attention`` without an SP group. Input checks stay on at SP = 1 (inputs are then the whole
    packed stream); with SP each rank sees a slice, so they are off.
    """
    module = hf_model(engine.module)
    ref = getattr(engine, _STATE, None)
    switched = ref is not None and ref() is module      # a re-initialised engine has a new, unswitched module
    if on and not switched:
        register(packed_attention=ulysses_packed_attention)
        enable_dualkv(module, check_inputs=engine.ulysses_sequence_parallel_size == 1)
        setattr(engine, _STATE, weakref.ref(module))
    elif not on and switched:
        disable_dualkv(module)
        setattr(engine, _STATE, None)


@contextmanager
def _forward_replaced(module: torch.nn.Module, forward: Callable) -> Iterator[None]:
    """Run ``module``'s hooks (FSDP2 unshard/reshard, casts) around ``forward`` instead of its own forward."""
    had = "forward" in module.__dict__
    previous = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if had:
            module.forward = previous
        else:
            del module.forward


def run_packed_model(module: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, layout,
                     head: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], Any]) -> Any:
    """Run a (possibly FSDP1- or FSDP2-wrapped) causal LM on packed (1, T_local) inputs and apply ``head`` to its
    final hidden states as the forward of its ``lm_head``.

    Both replacements go through the modules' own ``__call__`` (for FSDP1: the wrapper's, which calls the replaced
    forward of the model inside), so FSDP gathers the decoder and ``lm_head`` weights exactly when the stock forward
    would (``lm_head`` is its own FSDP2 unit when embeddings are untied), and its backward hooks fire.
    ``head(hidden (1, T_local, D), weight, bias)`` sees the unsharded weight.
    """
    model = hf_model(module)
    decoder = model.get_decoder()
    lm_head = model.get_output_embeddings()
    if decoder is None or lm_head is None:
        raise NotImplementedError(f"{type(module).__name__} has no decoder/output head to run dualkv on")
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation != ATTN_NAME:   # any other attention would treat the packed stream as plain sequences
        raise RuntimeError(f"the model runs the {implementation!r} attention, not {ATTN_NAME!r}; a packed micro-batch "
                           "needs dualkv.integration.verl.engine.set_dualkv_attention(engine, True) first")

    def root_forward(input_ids: torch.Tensor, position_ids: torch.Tensor) -> Any:
        hidden = decoder(input_ids=input_ids, position_ids=position_ids, attention_mask=None, use_cache=False,
                         **{LAYOUT_KWARG: layout}).last_hidden_state
        return lm_head(hidden)

    def head_forward(hidden: torch.Tensor) -> Any:
        return head(hidden, lm_head.weight, getattr(lm_head, "bias", None))

    with _forward_replaced(model, root_forward), _forward_replaced(lm_head, head_forward):
        return module(input_ids=input_ids, position_ids=position_ids)


def _refuse_unsupported(engine: Any, micro_batch: Any) -> None:
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.dataset_utils import DatasetPadMode
    from verl.utils.model import extract_multi_modal_inputs

    def flag(key: str) -> Any:
        return tu.get_non_tensor_data(data=micro_batch, key=key, default=False)

    if getattr(engine, "pad_to_length", False):
        raise NotImplementedError("dualkv does not support pad_to_length (static packed-length padding): turn it off")
    if tu.get_non_tensor_data(data=micro_batch, key="pad_mode", default=DatasetPadMode.NO_PADDING) \
            != DatasetPadMode.NO_PADDING:
        raise NotImplementedError("dualkv needs veRL's no-padding micro-batches (pad_mode=no_padding)")
    for key, what in (("distillation_use_topk", "top-K distillation"), ("distillation_only", "distillation"),
                      ("calculate_sum_pi_squared", "calculate_sum_pi_squared (needs full logits)")):
        if flag(key):
            raise NotImplementedError(f"dualkv does not support {what}")
    if extract_multi_modal_inputs(micro_batch.get("multi_modal_inputs", [])):
        raise NotImplementedError("dualkv supports text-only micro-batches (found multi_modal_inputs)")


def _temperature(micro_batch: Any) -> float:
    value = micro_batch["temperature"]
    if isinstance(value, torch.Tensor):
        distinct = torch.unique(value.detach().float())
        if distinct.numel() != 1:
            raise NotImplementedError("dualkv's log-prob head takes one temperature per micro-batch; got per-sample "
                                      f"temperatures {distinct.tolist()[:4]}...")
        return float(distinct.item())
    return float(value)


def _row_kernel(engine: Any, module: torch.nn.Module, use_fused_kernels: bool) -> RowKernel:
    if use_fused_kernels:
        options = getattr(engine.model_config, "fused_kernel_options", None) or {}
        return verl_fused_row_kernel(options.get("impl_backend", None) or "torch")
    _, _, softcap = _head_of(hf_model(module))
    chunk = int(getattr(engine.engine_config, "entropy_from_logits_chunk_size", 0) or DEFAULT_CHUNK)
    return dualkv_row_kernel(chunk_size=chunk, logit_softcap=softcap)


def dualkv_forward_step(engine: Any, micro_batch: Any, loss_function: Callable | None,
                        forward_only: bool) -> tuple[torch.Tensor, dict]:
    """``FSDPEngineWithLMHead.forward_step`` for dualkv engines: same contract (loss, {"model_output", "loss",
    "metrics"}), with ``model_output`` log-probs/entropy in veRL's nested per-row layout."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.device import get_device_id, get_device_name
    from verl.utils.ulysses import (get_ulysses_sequence_parallel_group, get_ulysses_sequence_parallel_rank,
                                    ulysses_pad_and_slice_inputs)
    from verl.workers.engine.utils import detach_tree

    micro_batch = micro_batch.to(get_device_id())
    _refuse_unsupported(engine, micro_batch)
    input_ids = micro_batch["input_ids"]
    packed = _pack_micro_batch(engine, micro_batch)
    model_ids, model_pos = packed.input_ids[None], packed.position_ids[None]
    rank, part, group = 0, None, None
    sp = engine.ulysses_sequence_parallel_size
    if sp > 1:
        model_ids, model_pos, _ = ulysses_pad_and_slice_inputs(model_ids, model_pos, sp_size=sp)
        group = get_ulysses_sequence_parallel_group()
        rank, part = get_ulysses_sequence_parallel_rank(group), model_ids.shape[1]
    plan = packed.plan(rank, part)
    set_dualkv_attention(engine, True)
    with_entropy = bool(tu.get_non_tensor_data(data=micro_batch, key="calculate_entropy", default=False))
    kernel = _row_kernel(engine, engine.module,
                         bool(tu.get_non_tensor_data(data=micro_batch, key="use_fused_kernels", default=False)))
    temperature = _temperature(micro_batch)

    def head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        return head_logprobs(hidden, weight, bias, plan, kernel, temperature=temperature, with_entropy=with_entropy,
                             sp_group=group)

    autocast_dtype = getattr(engine, "_autocast_dtype", torch.bfloat16)
    autocast = (nullcontext() if autocast_dtype == torch.float32
                else torch.autocast(device_type=get_device_name(), dtype=autocast_dtype))
    with autocast:
        logp, entropy = run_packed_model(engine.module, model_ids, model_pos, packed.layout, head)
        offsets = input_ids.offsets()
        model_output = {"log_probs": packed.to_rows(logp, offsets)}
        if with_entropy:
            model_output["entropy"] = packed.to_rows(entropy, offsets)
        if loss_function is not None:
            loss, metrics = loss_function(model_output=model_output, data=micro_batch,
                                          dp_group=engine.get_data_parallel_group())
        else:
            if not forward_only:
                raise ValueError("forward_only must be True when loss_function is None")
            loss, metrics = torch.tensor(1.0, device=get_device_name()), {}
        output = {"model_output": detach_tree(model_output), "loss": loss.detach().item(), "metrics": metrics}
    return loss, output


def group_prepare_micro_batches(data: Any, dp_group: Any = None, num_batches_divided_by: int | None = None,
                                same_micro_num_in_dp: bool = True, min_num_micro_batch: int | None = None,
                                use_dynamic_bsz_balance: bool = True) -> tuple[list, list[list[int]]]:
    """``prepare_micro_batches`` for dynamic batch size with dualkv: whole prompt groups per micro-batch, each
    counted as its P+ΣR tokens against ``max_token_len_per_gpu * sp`` (see :mod:`.micro_batches`)."""
    import torch.distributed as dist
    from verl.utils import tensordict_utils as tu
    from verl.utils.device import get_device_name
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

    if num_batches_divided_by not in (None, 1):
        raise NotImplementedError("dualkv micro-batching does not support num_batches_divided_by (pipeline stages)")
    sp_size = tu.get_non_tensor_data(data=data, key="sp_size", default=1)
    max_tokens = int(data["max_token_len_per_gpu"]) * int(sp_size)
    input_ids = data["input_ids"]
    rows = input_ids.offsets().numel() - 1
    prompt_lens = prompt_lengths(data["prompts"], data.get("attention_mask", None))
    response_lens = packed_response_lens(input_ids.offsets().diff().tolist(), prompt_lens)
    sync = dist.is_initialized() and same_micro_num_in_dp and dp_group is not None

    def agree(value: int, op) -> int:
        if not sync:
            return value
        t = torch.tensor([value], device=get_device_name())
        dist.all_reduce(t, op=op, group=dp_group)
        return int(t.item())

    try:
        batches = plan_micro_batches(
            group_ids_of(tu.get(data, "uid"), rows), prompt_lens, response_lens, max_tokens,
            partition=lambda loads, k: get_seqlen_balanced_partitions(loads, k, equal_size=False),
            agree_count=lambda k: agree(k, dist.ReduceOp.MAX),
            agree_ok=lambda ok: bool(agree(int(ok), dist.ReduceOp.MIN)),
            min_count=min_num_micro_batch)
    except ValueError as err:
        raise DualKVBatchError(f"dualkv dynamic micro-batching: {err}") from err
    return [tu.index_select_tensor_dict(data, b) for b in batches], batches
