"""Whole-model equivalence: a tiny random ``transformers`` model on the P+ΣR packing vs the stock model run on
each N-copy row. Checks log-probs and entropy of every response token, every parameter gradient, and the prompt
hidden-state invariant (appendix A.2)."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from ..integration.hf import apply_dualkv, packed_model_inputs
from ..integration.packing import PackedBatch, pack_varlen
from ..layout import GroupLayout
from ..testing import Comparison, compare, rel_err, tiny_causal_lm
from .checks import DTYPE_NAMES, Row

PredictorFn = Callable[[torch.Tensor, GroupLayout], torch.Tensor]


def random_rows(prompt_lens: Sequence[int], response_lens: Sequence[Sequence[int]], vocab: int, seed: int):
    """Rows (prompt, response) token tensors and group ids: every row of group g shares g's random prompt."""
    gen = torch.Generator().manual_seed(seed)
    rows, groups = [], []
    for g, (p, lens) in enumerate(zip(prompt_lens, response_lens)):
        prompt = torch.randint(0, vocab, (p,), generator=gen)
        for r in lens:
            rows.append((prompt, torch.randint(0, vocab, (r,), generator=gen)))
            groups.append(f"uid-{g}")
    return rows, groups


def pack_rows(rows, groups) -> PackedBatch:
    ids = torch.cat([torch.cat(pr) for pr in rows])
    lens = torch.tensor([len(p) + len(r) for p, r in rows])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    return pack_varlen(ids, cu, [len(p) for p, _ in rows], groups)


def _token_stats(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


def stock_forward(model, rows, *, hidden_states: bool = False):
    """Stock model, one N-copy row at a time: (log-probs, entropy) of all response tokens in row order."""
    lps, ents, hiddens = [], [], []
    for prompt, response in rows:
        ids = torch.cat([prompt, response]).to(model.device)[None]
        out = model(input_ids=ids, output_hidden_states=hidden_states)
        p, r = len(prompt), len(response)
        lp, ent = _token_stats(out.logits[0, p - 1:p + r - 1], response.to(model.device))
        lps.append(lp)
        ents.append(ent)
        if hidden_states:
            hiddens.append([h[0, :p] for h in out.hidden_states])
    return torch.cat(lps), torch.cat(ents), hiddens


def packed_forward(model, packed: PackedBatch, predictor: torch.Tensor, *, hidden_states: bool = False):
    """The model (already switched to the "dualkv" attention) on the packed batch: (log-probs, entropy, hidden)."""
    out = model(**packed_model_inputs(packed.to(model.device)), output_hidden_states=hidden_states)
    lp, ent = _token_stats(out.logits[0, predictor.to(model.device)], packed.response_ids.to(model.device))
    return lp, ent, (out.hidden_states if hidden_states else None)


def model_check(arch: str, prompt_lens: Sequence[int], response_lens: Sequence[Sequence[int]], *,
                dtype: torch.dtype = torch.float64, device: str = "cpu", seed: int = 0,
                predictor_fn: PredictorFn | None = None, check: str = "model", gradient_checkpointing: bool = False,
                backend: str = "dispatch") -> list[Row]:
    """Packed dualkv forward/backward vs the stock per-row forward/backward of the same tiny model."""
    model = tiny_causal_lm(arch, dtype=dtype, seed=seed).to(device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.train()
    vocab = model.config.vocab_size
    rows, groups = random_rows(prompt_lens, response_lens, vocab, seed)
    packed = pack_rows(rows, groups)
    predictor = packed.predictor_index if predictor_fn is None else predictor_fn(packed.predictor_index,
                                                                                 packed.layout)
    gen = torch.Generator().manual_seed(seed + 1)
    n_tok = packed.layout.total_response_tokens
    w_lp, w_ent = (torch.randn(n_tok, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
                   for _ in range(2))
    params = [p for p in model.parameters() if p.requires_grad]

    lp_ref, ent_ref, hid_ref = stock_forward(model, rows, hidden_states=True)
    grads_ref = torch.autograd.grad((lp_ref * w_lp).sum() + (ent_ref * w_ent).sum(), params)
    # The backward stays inside the block: with gradient checkpointing it re-runs the attention.
    with apply_dualkv(model):
        lp, ent, hid = packed_forward(model, packed, predictor, hidden_states=True)
        grads = torch.autograd.grad((lp * w_lp).sum() + (ent * w_ent).sum(), params)

    config = f"{arch} P{list(prompt_lens)} R{[list(r) for r in response_lens]}" + (" ckpt" if gradient_checkpointing
                                                                                   else "")
    bound_dtype = dtype if dtype in (torch.float64, torch.float32) else torch.float32
    items = [("logprobs", compare(lp, lp_ref, dtype=bound_dtype)), ("entropy", compare(ent, ent_ref, dtype=bound_dtype))]
    worst = max(range(len(params)), key=lambda i: _ranked(rel_err(grads[i], grads_ref[i])))
    items.append((f"param grads (worst of {len(params)})", compare(grads[worst], grads_ref[worst], dtype=bound_dtype)))
    items.append(("prompt hidden states", _hidden_invariant(packed.layout, hid, hid_ref, bound_dtype)))
    return [Row(check, config, q, backend, DTYPE_NAMES[dtype], c.error, c.bound, c.metric, c.passed)
            for q, c in items]


def _hidden_invariant(layout: GroupLayout, packed_hidden, copy_hidden, dtype) -> Comparison:
    """Every copy's prompt hidden states, at every layer, equal the packed prompt's (the invariant of A.2)."""
    worst = Comparison(0.0, 0.0, "rel")
    for row, g in enumerate(layout.response_group):
        p0, p1 = layout.prompt_range(g)
        for layer, h_copy in enumerate(copy_hidden[row]):
            cmp = compare(packed_hidden[layer][0, p0:p1], h_copy, dtype=dtype)
            if _ranked(cmp.error) >= _ranked(worst.error):
                worst = cmp
    return worst


def _ranked(error: float) -> float:
    """An error as the worst pick sees it: NaN (an oracle side with NaN) as the worst (NaN >= x is False)."""
    return math.inf if math.isnan(error) else error
