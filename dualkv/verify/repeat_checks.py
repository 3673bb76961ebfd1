"""Run-to-run reproducibility of the deterministic default: the same backward, run again on the same inputs, gives
the same bits. Checked for the fused kernels' dQ / dK / dV and for the log-prob head's gradient, whose gather of a
group's last prompt row once per response sums repeated rows (an atomic sum there made two TRL runs of one seed
part at step 5: experiments/results/checks/s40b-*). One :class:`~dualkv.verify.checks.Row` per quantity: the largest
|difference| from the first run, bound 0 (bit-identical)."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from .. import shared_prefix_attention
from ..integration.logprobs import token_logprobs
from ..testing import random_qkv
from .checks import DTYPE_NAMES, AttentionCase, Row
from .model_checks import pack_rows, random_rows

#: Backward runs compared with the first.
RUNS = 3

HeadFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def repeat_cases(cases: Sequence[AttentionCase], count: int = 3) -> list[AttentionCase]:
    """The first ``count`` cases with more than one response and no window: where a prompt's dK / dV sums several
    responses' contributions."""
    return [c for c in cases if sum(map(len, c.response_lens)) > 1 and c.window == (-1, -1)][:count]


def repeat_rows(check: str, config: str, run: Callable[[], Sequence[torch.Tensor]], quantities: Sequence[str],
                backend: str, dtype: str, runs: int = RUNS) -> list[Row]:
    """``run()`` ``runs`` times; a row per returned tensor: passed when every run returned the first run's bits."""
    first = [t.detach().clone() for t in run()]
    if len(first) != len(quantities):
        raise ValueError(f"run() returned {len(first)} tensors for {len(quantities)} quantities")
    worst = [0.0] * len(first)
    same = [True] * len(first)
    for _ in range(runs - 1):
        for i, (a, b) in enumerate(zip(first, run())):
            if not torch.equal(a, b):
                same[i] = False
                diff = float((a.double() - b.double()).abs().max())
                worst[i] = max(worst[i], diff if math.isfinite(diff) else math.inf)
    return [Row(check, config, f"{q} bitwise over {runs} runs", backend, dtype, worst[i], 0.0, "max |run - run 1|",
                same[i]) for i, q in enumerate(quantities)]


def attention_repeat_check(case: AttentionCase, *, dtype: torch.dtype, device: str = "cuda", backend: str = "dispatch",
                           seed: int = 0) -> list[Row]:
    """``shared_prefix_attention``'s backward (the deterministic default) on ``case``, run :data:`RUNS` times."""
    layout = case.layout
    q, k, v = random_qkv(layout, case.heads, case.kv_heads, case.head_dim, dtype=dtype, device=device, seed=seed)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    d_out = d_out.to(device=device, dtype=dtype)

    def run():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = shared_prefix_attention(*leaves, layout, window_size=case.window)
        return torch.autograd.grad(out, leaves, d_out)

    return repeat_rows("repeat", case.name, run, ("dq", "dk", "dv"), backend, DTYPE_NAMES[dtype])


def fused_head(hidden, weight, predictors, targets):
    """The log-prob head as the veRL / TRL integrations call it (fused backward)."""
    return token_logprobs(hidden, weight, predictors, targets, fused=True)


def head_repeat_check(*, groups: int = 8, responses: int = 16, response_len: int = 64, hidden_dim: int = 256,
                      vocab: int = 1000, device: str = "cuda", head: HeadFn = fused_head, check: str = "repeat",
                      seed: int = 0, runs: int = RUNS) -> list[Row]:
    """The log-prob head's gradient w.r.t. the packed hidden states, run ``runs`` times, on the P+ΣR packing of
    ``groups`` one-token prompts with ``responses`` responses of ``response_len`` tokens each (every response's first
    token predicted by its group's prompt row, so that row is gathered ``responses`` times)."""
    rows, group_ids = random_rows((1,) * groups, ((response_len,) * responses,) * groups, vocab, seed)
    packed = pack_rows(rows, group_ids)
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(packed.layout.total_tokens, hidden_dim, generator=gen, dtype=torch.float64).to(
        device=device, dtype=torch.float32)
    weight = (torch.randn(vocab, hidden_dim, generator=gen, dtype=torch.float64) / hidden_dim ** 0.5).to(
        device=device, dtype=torch.float32)
    predictors, targets = packed.predictor_index.to(device), packed.response_ids.to(device)

    def run():
        leaf = hidden.detach().requires_grad_()
        logp, ent = head(leaf, weight, predictors, targets)
        return torch.autograd.grad(logp.sum() + ent.sum(), leaf)

    config = f"log-prob head: {groups} groups x {responses} responses x {response_len} tokens, D{hidden_dim} V{vocab}"
    return repeat_rows(check, config, run, ("d hidden",), "cuda" if str(device).startswith("cuda") else "cpu", "fp32",
                       runs)
