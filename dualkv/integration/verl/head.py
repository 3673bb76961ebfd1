"""Log-probs and entropy of a packed micro-batch from the final hidden states, with or without Ulysses SP.

Response token k of a row is predicted by one packed position (``PackedBatch.predictor_index``): for k >= 1 the
previous response token ("shifted" rows, as in any causal LM), for k = 0 the group's last prompt token, one row
shared by the N responses of the group.

Under Ulysses sequence parallelism the packed stream (padded to a multiple of SP) is cut into SP contiguous
parts, so each rank holds T_pad/SP hidden states. Seed section 2.3, Eq. 9:

* shifted rows: every rank scores the rows it holds; the (ΣR,) results are summed over the SP group (each entry
  is written by exactly one rank, so the sum is exact);
* shared rows: group g's last prompt token p_g lives on rank p_g // part; each rank writes the shared rows it owns
  into a zero (G, D) buffer, an all-reduce gives every rank the exact SP=1 rows, and every rank scores the first
  tokens of all responses from them. Communication: G hidden vectors.

Both collectives are differentiable all-reduces (sum forward, sum backward). Every SP rank computes the same loss,
so a rank's gradient is SP times its own share, as with veRL's ``gather_outputs_and_unpad`` (``grad_scaler``).
At SP = 1 the same code runs without collectives, so first-token values are bit-identical across SP sizes
whenever the hidden rows are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from ..._gather import gather_rows
from ..logprobs import DEFAULT_CHUNK, token_logprobs
from ..packing import PackedBatch

__all__ = ["HeadPlan", "RowKernel", "dualkv_row_kernel", "verl_fused_row_kernel", "head_logprobs"]

#: kernel(hidden (T, D), weight (V, D), bias, rows (M,), targets (M,), temperature, with_entropy)
#:   -> (logp (M,), entropy (M,) or None), scoring hidden[rows[m]] against targets[m].
RowKernel = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor, torch.Tensor, float, bool],
                     tuple[torch.Tensor, Optional[torch.Tensor]]]


@dataclass(frozen=True)
class HeadPlan:
    """Which hidden rows of this rank score which response tokens (all index tensors on the device).

    Attributes:
        num_values: ΣR, the length of the row-order output.
        shifted_rows / shifted_slots / shifted_targets: local hidden rows, output slots and target tokens of the
            k >= 1 entries this rank holds.
        owned_groups / owned_rows: groups whose last prompt token is on this rank, and its local row.
        first_groups / first_slots / first_targets: for every response, its group, its k = 0 slot and token.
        num_groups: G.
    """

    num_values: int
    shifted_rows: torch.Tensor
    shifted_slots: torch.Tensor
    shifted_targets: torch.Tensor
    owned_groups: torch.Tensor
    owned_rows: torch.Tensor
    first_groups: torch.Tensor
    first_slots: torch.Tensor
    first_targets: torch.Tensor
    num_groups: int

    @classmethod
    def build(cls, packed: PackedBatch, *, rank: int = 0, part: int | None = None,
              device: torch.device | str | None = None) -> "HeadPlan":
        """Plan for SP rank ``rank`` holding packed positions [rank * part, (rank + 1) * part) (part = T at SP 1)."""
        layout = packed.layout
        part = layout.total_tokens if part is None else int(part)
        if part < 1 or rank < 0:
            raise ValueError(f"need part >= 1 and rank >= 0; got part={part}, rank={rank}")
        lo, hi = rank * part, (rank + 1) * part
        predictor = packed.predictor_index.cpu().numpy()
        targets = packed.response_ids.cpu().numpy()
        cu = np.asarray(packed.response_cu_seqlens.cpu().numpy(), dtype=np.int64)
        first = cu[:-1]
        is_first = np.zeros(predictor.shape[0], dtype=bool)
        is_first[first] = True
        mine = (~is_first) & (predictor >= lo) & (predictor < hi)
        slots = np.nonzero(mine)[0]
        last_prompt = np.asarray([layout.last_prompt_index(g) for g in range(layout.num_groups)], dtype=np.int64)
        owned = np.nonzero((last_prompt >= lo) & (last_prompt < hi))[0]
        dev = packed.input_ids.device if device is None else torch.device(device)

        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(dev)

        return cls(num_values=int(predictor.shape[0]), shifted_rows=t(predictor[slots] - lo), shifted_slots=t(slots),
                   shifted_targets=t(targets[slots]), owned_groups=t(owned), owned_rows=t(last_prompt[owned] - lo),
                   first_groups=t(np.asarray(layout.response_group, dtype=np.int64)), first_slots=t(first),
                   first_targets=t(targets[first]), num_groups=layout.num_groups)


    @classmethod
    def for_predictors(cls, predictor_index: torch.Tensor, target_ids: torch.Tensor, *, rank: int = 0,
                       part: int | None = None, total: int | None = None,
                       device: torch.device | str | None = None) -> "HeadPlan":
        """Plan for values each scored from one packed row and none shared (e.g. a prefix trie's targets, each
        packed token scored once: :class:`dualkv.tree.TreeTargets`): every value is a "shifted" entry of the rank
        holding its predictor row, summed over the SP group.

        Args:
            predictor_index: (M,) packed row predicting each value; target_ids: (M,) its token.
            total: packed tokens (T; ``part`` defaults to it at SP 1).
        """
        predictor = predictor_index.cpu().numpy().astype(np.int64)
        targets = target_ids.cpu().numpy().astype(np.int64)
        if predictor.shape != targets.shape or predictor.ndim != 1 or (predictor < 0).any():
            raise ValueError(f"predictor_index {tuple(predictor.shape)} and target_ids {tuple(targets.shape)} must be "
                             "(M,) each, every predictor a packed row >= 0")
        part = (int(total) if total is not None else int(predictor.max(initial=0)) + 1) if part is None else int(part)
        if part < 1 or rank < 0:
            raise ValueError(f"need part >= 1 and rank >= 0; got part={part}, rank={rank}")
        lo, hi = rank * part, (rank + 1) * part
        slots = np.nonzero((predictor >= lo) & (predictor < hi))[0]
        dev = predictor_index.device if device is None else torch.device(device)
        empty = torch.zeros(0, dtype=torch.int64, device=dev)

        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(dev)

        return cls(num_values=int(predictor.shape[0]), shifted_rows=t(predictor[slots] - lo), shifted_slots=t(slots),
                   shifted_targets=t(targets[slots]), owned_groups=empty, owned_rows=empty, first_groups=empty,
                   first_slots=empty, first_targets=empty, num_groups=0)


def dualkv_row_kernel(chunk_size: int = DEFAULT_CHUNK, logit_softcap: float | None = None) -> RowKernel:
    """dualkv's chunked head (:func:`dualkv.integration.logprobs.token_logprobs`, fused backward)."""

    def kernel(hidden, weight, bias, rows, targets, temperature, with_entropy):
        return token_logprobs(hidden, weight, rows, targets, temperature=temperature, bias=bias,
                              logit_softcap=logit_softcap, chunk_size=chunk_size, with_entropy=with_entropy,
                              fused=True)

    return kernel


def verl_fused_row_kernel(backend: str) -> RowKernel:
    """veRL's own fused linear log-prob kernels (``use_fused_kernels=True``): the predicting hidden rows (the shared
    last-prompt row expanded to the N first response tokens) are gathered and handed to ``FusedLinearForPPO``
    ("torch"/"liger") or ``linear_cross_entropy`` ("triton")."""
    if backend not in ("torch", "liger", "triton"):
        raise ValueError(f"fused_kernel_options.impl_backend = {backend!r}: expected 'torch', 'liger' or 'triton'")

    def kernel(hidden, weight, bias, rows, targets, temperature, with_entropy):
        if bias is not None:
            raise NotImplementedError("veRL's fused log-prob kernels take no lm_head bias")
        h = gather_rows(hidden, rows)
        if backend == "triton":
            from verl.utils.kernel.linear_cross_entropy import linear_cross_entropy

            logp, entropy = linear_cross_entropy(h, weight, targets, temperature, "none")
        else:
            from verl.utils.experimental.torch_functional import FusedLinearForPPO

            logp, entropy = FusedLinearForPPO(impl_backend=backend)(h, weight, targets, temperature=temperature)
        return logp.float(), (entropy.float() if with_entropy else None)

    return kernel


class _AllReduceSum(torch.autograd.Function):
    """Sum over a process group; the gradient is summed the same way (every rank's loss is the same)."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        out = values.clone()
        torch.distributed.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


def _sum_over(values: torch.Tensor, group) -> torch.Tensor:
    """Differentiable all-reduce (sum) over ``group``; identity without one."""
    return values if group is None else _AllReduceSum.apply(values, group)


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, plan: HeadPlan,
                  kernel: RowKernel, *, temperature: float, with_entropy: bool,
                  sp_group=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ΣR,) log-probs (and entropy) in row order from this rank's (T_local, D) final hidden states.

    ``sp_group``: the Ulysses group (None at SP = 1). The result is the same on every rank of the group.
    """
    if hidden.dim() == 3:
        if hidden.shape[0] != 1:
            raise ValueError(f"hidden states must be (T, D) or (1, T, D); got {tuple(hidden.shape)}")
        hidden = hidden[0]
    m = plan.num_values
    lp_s, ent_s = kernel(hidden, weight, bias, plan.shifted_rows, plan.shifted_targets, temperature, with_entropy)
    logp = _sum_over(lp_s.new_zeros(m).index_add(0, plan.shifted_slots, lp_s), sp_group)
    entropy = None
    if with_entropy:
        entropy = _sum_over(ent_s.new_zeros(m).index_add(0, plan.shifted_slots, ent_s), sp_group)
    if plan.num_groups == 0:      # nothing shared (HeadPlan.for_predictors)
        return logp, entropy
    shared = hidden.new_zeros(plan.num_groups, hidden.shape[1])
    shared = _sum_over(shared.index_copy(0, plan.owned_groups, hidden.index_select(0, plan.owned_rows)), sp_group)
    lp_f, ent_f = kernel(shared, weight, bias, plan.first_groups, plan.first_targets, temperature, with_entropy)
    logp = logp.index_add(0, plan.first_slots, lp_f)
    if with_entropy:
        entropy = entropy.index_add(0, plan.first_slots, ent_f)
    return logp, entropy
