"""Attention (query, key) pair counts and FLOPs of the N-copy and shared-prompt layouts.

A *pair* is one q·k dot product (and one row of the P·V product) that causal attention needs. Positions are the
logical ones of :mod:`dualkv.layout` (prompt 0..P-1, response i at P..P+R_i-1). With a causal window of
``window_left`` (FlashAttention's ``window_size=(left, 0)``, -1 unbounded) the query at position t sees keys
``max(0, t-left) .. t``, i.e. ``c(t) = min(t, left) + 1`` keys, and a row of S tokens holds

    F(S) = sum_{t<S} c(t) = S(S+1)/2                              (unbounded, or S <= left + 1)
         = (left+1)(left+2)/2 + (S-left-1)(left+1)                (otherwise)

pairs. Per group the N-copy layout computes ``sum_i F(P+R_i)``; the shared-prompt layout computes the prompt once
and each response's rows once: ``F(P) + sum_i (F(P+R_i) - F(P))``, which unwindowed is
``P(P+1)/2 + sum_i (R_i*P + R_i(R_i+1)/2)`` — the "useful pairs" of /work/shared/notes/baselines.md.

FLOPs follow FlashAttention's convention: forward ``4*d*H`` per pair (QK^T and PV, 2 FLOPs per multiply-add),
backward 2.5x the forward, forward+backward 3.5x.
"""

from __future__ import annotations

from ..layout import GroupLayout
from .._checks import IntOrSeq, check_int, check_mode, check_positive_array, check_window_left
from ..tree import PrefixTreeLayout
from .tokens import group_layout

__all__ = [
    "causal_row_pairs",
    "useful_pairs",
    "n_copy_pairs",
    "pairs_dualkv",
    "pairs_ncopy",
    "attention_flops",
    "MODE_FACTOR",
    "attn_speedup_theory",
    "attn_speedup_pairs",
]

#: Attention FLOPs of a mode as a multiple of the forward's ``4*d*H`` per pair.
MODE_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


def causal_row_pairs(S: int, window_left: int = -1) -> int:
    """``F(S)``: (query, key) pairs of causal self-attention over one row of ``S`` tokens (positions 0..S-1)."""
    s = check_int(S, "S", 0)
    left = check_window_left(window_left)
    if left < 0 or s <= left + 1:
        return s * (s + 1) // 2
    return (left + 1) * (left + 2) // 2 + (s - left - 1) * (left + 1)


def _check_layout(layout: object) -> GroupLayout:
    if not isinstance(layout, GroupLayout):
        raise TypeError(f"layout must be a GroupLayout, got {type(layout).__name__}")
    return layout


def useful_pairs(layout: GroupLayout | PrefixTreeLayout, window_left: int = -1) -> int:
    """(query, key) pairs shared-prompt attention needs for a packed micro-batch (every group's prompt once, every
    response against [its prompt; itself]), exact for a causal window of ``window_left`` keys before the query.
    A PrefixTreeLayout: :func:`dualkv.analysis.trees.tree_useful_pairs`."""
    if isinstance(layout, PrefixTreeLayout):
        from .trees import tree_useful_pairs

        return tree_useful_pairs(layout, window_left)
    layout = _check_layout(layout)
    total = 0
    for p, lens in zip(layout.prompt_lens, layout.response_lens):
        prompt = causal_row_pairs(p, window_left)
        total += prompt + sum(causal_row_pairs(p + r, window_left) - prompt for r in lens)
    return total


def n_copy_pairs(layout: GroupLayout | PrefixTreeLayout, window_left: int = -1) -> int:
    """(query, key) pairs the N-copy layout computes for the same rows (each row's prompt copy attended again).
    A PrefixTreeLayout: its root-to-leaf paths (:func:`dualkv.analysis.trees.tree_n_copy_pairs`)."""
    if isinstance(layout, PrefixTreeLayout):
        from .trees import tree_n_copy_pairs

        return tree_n_copy_pairs(layout, window_left)
    layout = _check_layout(layout)
    return sum(causal_row_pairs(p + r, window_left)
               for p, lens in zip(layout.prompt_lens, layout.response_lens) for r in lens)


def pairs_dualkv(N: int | None, P: int, R: IntOrSeq, window_left: int = -1) -> int:
    """:func:`useful_pairs` of one prompt group given as numbers (``R`` an int or the list of R_i)."""
    return useful_pairs(group_layout(N, P, R), window_left)


def pairs_ncopy(N: int | None, P: int, R: IntOrSeq, window_left: int = -1) -> int:
    """:func:`n_copy_pairs` of one prompt group given as numbers."""
    return n_copy_pairs(group_layout(N, P, R), window_left)


def attention_flops(pairs: int, heads: int, head_dim: int, mode: str) -> float:
    """FLOPs of attention over ``pairs`` (query, key) pairs: ``4*head_dim*heads`` per pair forward, 2.5x that
    backward, 3.5x forward+backward (``mode`` in {"fwd", "bwd", "fwdbwd"})."""
    pairs = check_int(pairs, "pairs", 0)
    heads = check_int(heads, "heads", 1)
    head_dim = check_int(head_dim, "head_dim", 1)
    return 4.0 * head_dim * heads * pairs * MODE_FACTOR[check_mode(mode)]


def attn_speedup_theory(N, P, R):
    """The paper's closed form ``N(P+R)^2 / (P^2 + N R (P+R))`` (appendix "Speedup Scaling"), equal R; numpy
    arrays broadcast. It counts full squares, not causal triangles: compare :func:`attn_speedup_pairs`."""
    n = check_positive_array(N, "N", at_least_one=True)
    p = check_positive_array(P, "P")
    r = check_positive_array(R, "R")
    out = n * (p + r) ** 2 / (p ** 2 + n * r * (p + r))
    return float(out) if out.ndim == 0 else out


def attn_speedup_pairs(N: int | None, P: int, R: IntOrSeq, window_left: int = -1) -> float:
    """Exact causal attention-FLOP ratio N-copy / shared-prompt (pairs ratio; the per-pair cost is the same)."""
    layout = group_layout(N, P, R)
    return n_copy_pairs(layout, window_left) / useful_pairs(layout, window_left)
