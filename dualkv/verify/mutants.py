"""Known-wrong variants of DualKV. Every equivalence check must FAIL on each of them (negative controls): a check
that passes a mutant cannot tell right from wrong.

* ``no_context_grad`` — call 2 without the gradient into the shared context K/V (only call 1's part reaches it).
* ``shifted_mask`` — the response queries' causal mask shifted by one (each sees one future response key).
* ``own_row_first_token`` — a response's first token predicted from its own first row instead of the group's
  shared last prompt row.
* ``atomic_gather_head`` — the log-prob head gathering its predicting rows with ``index_select``, whose CUDA backward
  sums a repeated row with atomics (the run-to-run repeat check must catch it on a GPU).
"""

from __future__ import annotations

import torch

from .._checks import check_layout_tensors, check_window, resolve_scale
from ..layout import GroupLayout
from ..reference import flash_attn_dualkv_varlen_func
from ..reference.attention import per_group_attention
from ..reference.core import masked_attention


def _decoded(qd, kc, vc, kd, vd, cu, scale, causal, window, *, shift=0, detach_context=False):
    """Call 2 per sequence, optionally with the context detached or the query positions shifted."""
    if detach_context:
        kc, vc = kc.detach(), vc.detach()
    p = kc.shape[0]
    outs, lses = [], []
    for a, b in zip(cu, cu[1:]):
        keys, values = torch.cat([kc, kd[a:b]], 0), torch.cat([vc, vd[a:b]], 0)
        q_pos = torch.arange(p + shift, p + b - a + shift, device=qd.device)
        k_pos = torch.arange(0, p + b - a, device=qd.device)
        out, lse = masked_attention(qd[a:b], keys, values, q_pos, k_pos, scale=scale, causal=causal, window=window)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, 0), torch.cat(lses, 1)


def _mutant(q, k, v, layout, softmax_scale, window_size, return_lse, **how):
    _, _, d = check_layout_tensors(q, k, v, layout)
    out, lse = per_group_attention(q, k, v, layout, resolve_scale(softmax_scale, d), check_window(window_size, True),
                                   decoded=lambda *a: _decoded(*a, **how))
    return (out, lse) if return_lse else out


def no_context_grad(q, k, v, layout, softmax_scale=None, window_size=(-1, -1), return_lse=False):
    """shared_prefix_attention whose call 2 sends no gradient into the shared context K/V."""
    return _mutant(q, k, v, layout, softmax_scale, window_size, return_lse, detach_context=True)


def shifted_mask(q, k, v, layout, softmax_scale=None, window_size=(-1, -1), return_lse=False):
    """shared_prefix_attention whose response queries sit one position late (see one future key)."""
    return _mutant(q, k, v, layout, softmax_scale, window_size, return_lse, shift=1)


def no_context_grad_call2(q, k_context, v_context, *args, **kwargs):
    """The paper's call 2 with the shared context detached."""
    return flash_attn_dualkv_varlen_func(q, k_context.detach(), v_context.detach(), *args, **kwargs)


def own_row_first_token(predictor_index: torch.Tensor, layout: GroupLayout) -> torch.Tensor:
    """Predictor index whose first response token is predicted from the response's own first row."""
    index = predictor_index.clone()
    offsets = torch.tensor([0, *torch.tensor(layout.flat_response_lens).cumsum(0)[:-1].tolist()],
                           device=index.device)
    index[offsets] = torch.tensor(layout.response_starts, device=index.device)
    return index


ATTENTION_MUTANTS = {"no_context_grad": no_context_grad, "shifted_mask": shifted_mask}


def atomic_gather_head(hidden: torch.Tensor, weight: torch.Tensor, predictors: torch.Tensor, targets: torch.Tensor):
    """The fused log-prob head on rows gathered by ``index_select`` (atomic backward on CUDA) rather than
    :func:`dualkv._gather.gather_rows`."""
    from ..integration.logprobs import token_logprobs

    rows = hidden.index_select(0, predictors)
    return token_logprobs(rows, weight, torch.arange(rows.shape[0], device=rows.device), targets, fused=True)
