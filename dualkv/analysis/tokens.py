"""Token counts of the two layouts and the token reduction ratio rho.

For one prompt of P tokens and N responses of R_1..R_N tokens:

* N-copy layout (every row carries its own prompt copy): ``T_std = N*P + sum_i R_i`` tokens;
* shared-prompt layout (dualkv, the prompt packed once): ``T_dk = P + sum_i R_i`` tokens;
* ``rho = T_std / T_dk`` (dimensionless), ``= N(P+R)/(P+NR)`` when every ``R_i = R``.

Every per-token operation (norms, projections, MLP, LM head, activation memory) scales with the token count, so
rho is the speedup and memory ratio of everything outside attention. Counts for a packed micro-batch come from
:class:`dualkv.layout.GroupLayout` (``tokens_std``, ``total_tokens``); the functions over plain numbers build one.
"""

from __future__ import annotations

from ..layout import GroupLayout
from .._checks import IntOrSeq, check_int, check_positive_array, response_lengths
from ..tree import PrefixTreeLayout

__all__ = [
    "group_layout",
    "tokens_std",
    "tokens_dualkv",
    "rho",
    "rho_layout",
    "rho_equal",
    "rho_limit_many_responses",
    "rho_limit_long_prompt",
    "micro_batch_layouts",
    "rho_micro_batched",
]


def group_layout(N: int | None, P: int, R: IntOrSeq) -> GroupLayout:
    """The one-group :class:`GroupLayout` of a prompt of ``P`` tokens and N responses (``R`` an int, repeated N
    times, or the list of the N response lengths)."""
    return GroupLayout.single(check_int(P, "P", 1), response_lengths(N, R))


def tokens_std(N: int | None, P: int, R: IntOrSeq) -> int:
    """Tokens of the N-copy layout, ``N*P + sum_i R_i``."""
    return group_layout(N, P, R).tokens_std


def tokens_dualkv(N: int | None, P: int, R: IntOrSeq) -> int:
    """Tokens of the shared-prompt layout, ``P + sum_i R_i``."""
    return group_layout(N, P, R).total_tokens


def rho_layout(layout: GroupLayout | PrefixTreeLayout) -> float:
    """``T_std / T_dk`` of a packed micro-batch (any number of groups; a tree: its root-to-leaf paths vs the tree)."""
    if not isinstance(layout, (GroupLayout, PrefixTreeLayout)):
        raise TypeError(f"layout must be a GroupLayout or a PrefixTreeLayout, got {type(layout).__name__}")
    return layout.tokens_std / layout.total_tokens


def rho(N: int | None, P: int, R: IntOrSeq) -> float:
    """Token reduction ratio ``(N*P + sum R_i) / (P + sum R_i)`` for equal (``R`` an int) or unequal responses."""
    return rho_layout(group_layout(N, P, R))


def rho_equal(N, P, R):
    """``N(P+R)/(P+NR)`` over numpy arrays (broadcast), for grids and plots; equal response lengths.

    N >= 1 and P, R > 0 (real numbers are allowed here: P/R ratios on a grid). Returns a float or an ndarray.
    """
    n = check_positive_array(N, "N", at_least_one=True)
    p = check_positive_array(P, "P")
    r = check_positive_array(R, "R")
    out = n * (p + r) / (p + n * r)
    return float(out) if out.ndim == 0 else out


def rho_limit_many_responses(P: float, R: float) -> float:
    """``lim_{N->inf} rho = 1 + P/R``: with many responses the ratio saturates at the prompt/response ratio."""
    p = float(check_positive_array(P, "P"))
    r = float(check_positive_array(R, "R"))
    return 1.0 + p / r


def rho_limit_long_prompt(N: int) -> float:
    """``lim_{P->inf} rho = N``: with a long prompt the N-copy layout carries N times the tokens."""
    return float(check_int(N, "N", 1))


def micro_batch_layouts(N: int, P: int, R: IntOrSeq, mb: int, prompts: int = 1) -> list[GroupLayout]:
    """The micro-batches a trainer forms from ``prompts`` groups of N rows each (rows kept prompt-contiguous, as
    dualkv's data pipeline requires), cut into micro-batches of ``mb`` rows; the last one may be shorter.

    With ``mb < N`` a group is split over several micro-batches, each sharing its prompt only among the rows it
    holds, so the achievable rho is bounded by the micro-batch size (the paper's LongReason runs: N=32, mb=4 or 8).
    """
    lens = response_lengths(N, R)
    p = check_int(P, "P", 1)
    mb = check_int(mb, "mb", 1)
    prompts = check_int(prompts, "prompts", 1)
    rows = [(g, r) for g in range(prompts) for r in lens]
    layouts = []
    for start in range(0, len(rows), mb):
        chunk = rows[start:start + mb]
        groups: list[list[int]] = []
        last = None
        for g, r in chunk:
            if g != last:
                groups.append([])
                last = g
            groups[-1].append(r)
        layouts.append(GroupLayout.from_lengths([p] * len(groups), groups))
    return layouts


def rho_micro_batched(N: int, P: int, R: IntOrSeq, mb: int) -> float:
    """rho over all micro-batches of one prompt group of N rows cut into micro-batches of ``mb`` rows:
    ``sum T_std / sum T_dk``. Equals :func:`rho` when ``mb >= N`` and ``rho(mb, P, R)`` when mb divides N."""
    layouts = micro_batch_layouts(N, P, R, mb)
    return sum(x.tokens_std for x in layouts) / sum(x.total_tokens for x in layouts)

