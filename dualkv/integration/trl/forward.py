"""One TRL log-prob call (policy, old or reference) computed on P+ΣR packed chunks.

``GRPOTrainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, batch_size,
compute_entropy)`` returns (B, C) per-token log-probs (and entropies) of the completion tokens, 0 on padding, with
C = ``logits_to_keep``. :func:`packed_call_logps` returns exactly that, computed as:

1. the rows are grouped by prompt (:func:`.rows.group_rows`) and cut into chunks of whole groups
   (:func:`.rows.plan_chunks`) of at most the tokens of one stock chunk (``batch_size`` rows x L; all rows at once
   when ``batch_size`` is None, as TRL's policy call);
2. each chunk is packed with :func:`dualkv.integration.packing.pack_padded` and run through the model's decoder with
   the ``"dualkv"`` attention, then through a log-prob head on the ΣR predicting rows (each response's first token
   from its group's shared last prompt row), in place of TRL's fused LM head;
3. the (ΣR,) values go back to (rows, C) (:func:`dualkv.integration.logprobs.to_padded`) and into the rows' slots.

The model is called through its outermost wrapper (DDP, PEFT, accelerate) with the innermost causal LM's
``forward`` and its ``lm_head``'s ``forward`` temporarily replaced, so every wrapper's hooks run as for a stock call
(gradient synchronisation, FSDP unsharding, LoRA layers, adapters disabled for the reference).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ..._gather import gather_rows
from ..hf import LAYOUT_KWARG
from ..logprobs import DEFAULT_CHUNK, to_padded
from ..packing import PackedBatch, pack_padded
from ..verl.engine import _forward_replaced
from ..verl.head import RowKernel, dualkv_row_kernel
from .rows import RowGroups, group_rows, plan_chunks

__all__ = ["HEADS", "row_kernel", "trl_row_kernel", "packed_call_logps"]

#: Log-prob heads: "trl" = TRL's own ChunkedLogProbFunction (stock's numerics), "dualkv" = dualkv's chunked head.
HEADS = ("trl", "dualkv")


def trl_row_kernel(logit_softcap: float | None = None) -> RowKernel:
    """TRL's ``ChunkedLogProbFunction`` (the kernel of its fused LM head) on the gathered predicting rows."""
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    def kernel(hidden, weight, bias, rows, targets, temperature, with_entropy):
        outputs = ("log_probs", "entropy") if with_entropy else ("log_probs",)
        logp, entropy, *_ = ChunkedLogProbFunction.apply(gather_rows(hidden, rows), weight, bias, targets,
                                                         temperature, _CHUNKED_LOGPROB_CHUNK_SIZE, logit_softcap,
                                                         1.0, outputs)
        return logp, entropy

    return kernel


def row_kernel(head: str, logit_softcap: float | None) -> RowKernel:
    """The row kernel named ``head`` (one of :data:`HEADS`)."""
    if head == "trl":
        return trl_row_kernel(logit_softcap)
    if head == "dualkv":
        return dualkv_row_kernel(chunk_size=DEFAULT_CHUNK, logit_softcap=logit_softcap)
    raise ValueError(f"head must be one of {HEADS}; got {head!r}")


def _run_packed(outer: torch.nn.Module, inner: torch.nn.Module, packed: PackedBatch, kernel: RowKernel, *,
                temperature: float, with_entropy: bool, fp32_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ΣR,) log-probs (and entropies) of ``packed``'s response tokens, in row order, through ``outer``'s call."""
    decoder = inner.get_decoder()
    lm_head = inner.get_output_embeddings()
    predictor = packed.predictor_index
    targets = packed.response_ids

    def root_forward(input_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                     **passed: Any) -> Any:
        unexpected = sorted(k for k, v in passed.items() if v is not None and v is not False)
        if unexpected:  # wrappers (PEFT) pass their own arguments as None; anything real would be dropped
            raise ValueError(f"dualkv's packed TRL forward got unexpected model inputs {unexpected}")
        hidden = decoder(input_ids=input_ids, position_ids=position_ids, attention_mask=None, use_cache=False,
                         **{LAYOUT_KWARG: packed.layout}).last_hidden_state
        return lm_head(hidden)

    def head_forward(hidden: torch.Tensor) -> Any:
        weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
        if isinstance(weight, DTensor):   # as TRL's fused head: gather a sharded head
            weight = weight.full_tensor()
            bias = None if bias is None else bias.full_tensor()
        autocast = nullcontext()
        if fp32_head:   # TRL's cast_lm_head_to_fp32: the head runs in float32, outside autocast
            hidden = hidden.float()
            autocast = torch.autocast(hidden.device.type, enabled=False)
        with autocast:
            return kernel(hidden[0], weight, bias, predictor, targets, temperature, with_entropy)

    with _forward_replaced(inner, root_forward), _forward_replaced(lm_head, head_forward):
        return outer(input_ids=packed.input_ids[None], position_ids=packed.position_ids[None])


def packed_call_logps(outer: torch.nn.Module, inner: torch.nn.Module, input_ids: torch.Tensor,
                      attention_mask: torch.Tensor, logits_to_keep: int, *, batch_size: int | None,
                      kernel: RowKernel, temperature: float, with_entropy: bool, fp32_head: bool = False,
                      row_groups: RowGroups | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """TRL's (B, C) completion log-probs and entropies (0 on padding) from P+ΣR packed forwards.

    Args:
        outer: the model as TRL passes it (possibly DDP/PEFT-wrapped); ``inner``: its innermost causal LM, already
            running the ``"dualkv"`` attention.
        input_ids, attention_mask: (B, L) ``cat(prompt, completion)`` ids and 0/1 mask, prompts left-padded and
            completions right-padded.
        logits_to_keep: C, the completion width.
        batch_size: TRL's chunk size in rows (None: all rows at once); a chunk packs at most ``batch_size * L``
            tokens.
        kernel: the log-prob head (:func:`row_kernel`).
    Raises:
        ValueError: no row has a completion token (the caller runs the stock path instead).
    """
    rows_total, width = input_ids.shape
    prompt_width = width - logits_to_keep
    groups = group_rows(attention_mask, input_ids, prompt_width) if row_groups is None else row_groups
    if not groups.groups:
        raise ValueError("no row has a completion token; nothing to pack")
    budget = None if batch_size is None or batch_size >= rows_total else batch_size * width
    device = input_ids.device
    order: list[int] = []
    logps, entropies = [], []
    for chunk in plan_chunks(groups, budget):
        rows = [row for group in chunk for row in group]
        group_ids = [g for g, group in enumerate(chunk) for _ in group]
        index = torch.tensor(rows, device=device)
        packed = pack_padded(input_ids.index_select(0, index), attention_mask.index_select(0, index), prompt_width,
                             group_ids)
        logp, entropy = _run_packed(outer, inner, packed, kernel, temperature=temperature,
                                    with_entropy=with_entropy, fp32_head=fp32_head)
        logps.append(to_padded(logp, packed))
        if with_entropy:
            entropies.append(to_padded(entropy, packed))
        order.extend(rows)
    index = torch.tensor(order, device=device)

    def assemble(parts: list[torch.Tensor]) -> torch.Tensor:
        values = torch.cat(parts)
        return values.new_zeros(rows_total, logits_to_keep).index_copy(0, index, values)

    return assemble(logps), (assemble(entropies) if with_entropy else None)

