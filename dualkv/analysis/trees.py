"""Token, pair and FLOP models of prefix trees: the paper's rho generalised to a :class:`dualkv.PrefixTreeLayout`.

Node i has L_i tokens starting at logical position pos_i (its ancestors' summed length), so its path holds
S_i = pos_i + L_i tokens. With ``F(S)`` the causal pairs of an S-token row (:func:`dualkv.analysis.causal_row_pairs`,
window-aware):

* tree packing: ``T_tree = sum_i L_i`` tokens and ``sum_i [F(S_i) - F(pos_i)]`` (query, key) pairs — each token
  once, against every key of its path;
* N-copy layout: every *row* as its own sequence — by default the root-to-leaf paths, ``T_std = sum_leaves S_l``
  and ``sum_leaves F(S_l)`` pairs; ``rows`` (e.g. a :class:`dualkv.tree.TreeIndex` from ``from_sequences``) counts
  a batch's own sequences instead, duplicates and prefix sequences included;
* ``rho = T_std / T_tree``, the attention ratio ``pairs_std / pairs_tree``; whole-model FLOPs via
  :func:`dualkv.analysis.model_flops`, which accepts a tree.

For a two-level tree (a prompt of P with N leaves of R) these are the paper's ``N(P+R)/(P+NR)`` and useful pairs.
:func:`two_level_counts` gives what the best :class:`dualkv.GroupLayout` packing of the same paths costs (each
path shares only one prefix: today's dualkv), so a table can show what trees add on top.

The three benchmark workloads of issue #14 are named constructors: :func:`system_prompt_workload` (a),
:func:`branching_workload` (b), :func:`multi_turn_workload` (c); :func:`workload_table` puts their counts side by side.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

from ..tree import PrefixTreeLayout, TreeIndex
from .._checks import IntOrSeq, check_int, check_window_left, response_lengths
from .models import load_model, model_flops
from .pairs import causal_row_pairs

__all__ = [
    "tree_rows",
    "tree_tokens_ncopy",
    "tree_rho",
    "tree_useful_pairs",
    "tree_n_copy_pairs",
    "tree_attn_ratio",
    "two_level_counts",
    "system_prompt_workload",
    "branching_workload",
    "multi_turn_workload",
    "WORKLOADS",
    "workload_table",
    "format_workload_table",
]

#: N-copy rows: None (the leaves), a TreeIndex (its sequences) or explicit end nodes.
Rows = Optional[Union[Sequence[int], TreeIndex]]


def _check_tree(layout: object) -> PrefixTreeLayout:
    if not isinstance(layout, PrefixTreeLayout):
        raise TypeError(f"layout must be a PrefixTreeLayout, got {type(layout).__name__}")
    return layout


def tree_rows(layout: PrefixTreeLayout, rows: Rows = None) -> tuple[int, ...]:
    """End nodes of the N-copy rows: the leaves (default), a TreeIndex's sequences (its ``end_nodes``, one per
    sequence), or an explicit list of nodes (repeats allowed: a duplicated sequence is a row twice)."""
    layout = _check_tree(layout)
    if rows is None:
        return layout.leaves
    if isinstance(rows, TreeIndex):
        if rows.layout is not layout:
            raise ValueError("rows is the TreeIndex of another layout")
        return rows.end_nodes
    nodes = tuple(check_int(r, f"rows[{i}]", 0) for i, r in enumerate(rows))
    if not nodes:
        raise ValueError("rows is empty: need at least one row")
    bad = [r for r in nodes if r >= layout.num_nodes]
    if bad:
        raise ValueError(f"rows[...] = {bad[0]} is not a node of the {layout.num_nodes}-node layout")
    return nodes


def tree_tokens_ncopy(layout: PrefixTreeLayout, rows: Rows = None) -> int:
    """Tokens of the N-copy layout: ``sum_rows S_r`` (each row's whole root-to-node path)."""
    return sum(layout.path_lens[r] for r in tree_rows(layout, rows))


def tree_rho(layout: PrefixTreeLayout, rows: Rows = None) -> float:
    """``T_std / T_tree``: the per-token (norms, projections, MLP, LM head, activations) reduction of the tree."""
    return tree_tokens_ncopy(layout, rows) / _check_tree(layout).total_tokens


def tree_useful_pairs(layout: PrefixTreeLayout, window_left: int = -1) -> int:
    """(query, key) pairs of tree attention: ``sum_i F(S_i) - F(pos_i)``, exact for a causal window of
    ``window_left`` keys before the query (-1 unbounded)."""
    layout = _check_tree(layout)
    left = check_window_left(window_left)
    return sum(causal_row_pairs(s, left) - causal_row_pairs(p, left)
               for s, p in zip(layout.path_lens, layout.node_positions))


def tree_n_copy_pairs(layout: PrefixTreeLayout, window_left: int = -1, rows: Rows = None) -> int:
    """(query, key) pairs the N-copy layout computes: ``sum_rows F(S_r)``."""
    left = check_window_left(window_left)
    return sum(causal_row_pairs(layout.path_lens[r], left) for r in tree_rows(layout, rows))


def tree_attn_ratio(layout: PrefixTreeLayout, window_left: int = -1, rows: Rows = None) -> float:
    """Attention FLOP ratio N-copy / tree (the per-pair cost is the same)."""
    return tree_n_copy_pairs(layout, window_left, rows) / tree_useful_pairs(layout, window_left)


def two_level_counts(layout: PrefixTreeLayout, window_left: int = -1) -> dict:
    """Tokens and pairs of the best :class:`dualkv.GroupLayout` packing of the tree's root-to-leaf paths.

    A two-level packing gives each leaf one *group prompt*: the path to one of its strict ancestors a, stored once
    per group; the rest of the path is the leaf's response. Choosing the set A of group prompts, a leaf uses its
    deepest ancestor in A (or shares nothing), so the packing costs ``sum_{a in A} S_a + sum_l (S_l - S_{a(l)})``
    tokens. A dynamic programme over (node, deepest chosen ancestor) finds the A with the fewest tokens (ties:
    fewer pairs); its pairs are ``sum_{a in A} F(S_a) + sum_l (F(S_l) - F(S_{a(l)}))``.

    Returns ``{"tokens", "pairs", "prompts"}`` (``prompts``: the chosen group-prompt nodes, sorted).
    """
    layout = _check_tree(layout)
    left = check_window_left(window_left)
    S = layout.path_lens
    F = [causal_row_pairs(s, left) for s in S]
    memo: dict[tuple[int, int], tuple[int, int, tuple[int, ...]]] = {}

    def solve(v: int, a: int) -> tuple[int, int, tuple[int, ...]]:
        """(tokens, pairs, chosen) of v's subtree when a (-1: none) is the deepest chosen prompt above v."""
        key = (v, a)
        if key in memo:
            return memo[key]
        if not layout.children[v]:
            best = (S[v] - (S[a] if a >= 0 else 0), F[v] - (F[a] if a >= 0 else 0), ())
        else:
            skip = _sum(solve(c, a) for c in layout.children[v])
            take = _sum([(S[v], F[v], (v,))] + [solve(c, v) for c in layout.children[v]])
            best = min(skip, take, key=lambda x: (x[0], x[1]))
        memo[key] = best
        return best

    order = sorted(range(layout.num_nodes), key=lambda i: -layout.depths[i])   # leaves first: no deep recursion
    for v in order:
        for a in (-1, *layout.ancestors(v)):
            solve(v, a)
    tokens, pairs, chosen = _sum(solve(r, -1) for r in layout.roots)
    return {"tokens": tokens, "pairs": pairs, "prompts": tuple(sorted(chosen))}


def _sum(parts) -> tuple[int, int, tuple[int, ...]]:
    tokens = pairs = 0
    chosen: tuple[int, ...] = ()
    for t, p, c in parts:
        tokens, pairs, chosen = tokens + t, pairs + p, chosen + c
    return tokens, pairs, chosen


# ---------------------------------------------------------------------------------------------- workloads
def _levels(level_lens: Sequence[int], level_fans: Sequence[int], leaf_lens: IntOrSeq) -> PrefixTreeLayout:
    """A uniform tree: one root of ``level_lens[0]``, each node of level d having ``level_fans[d]`` children of
    ``level_lens[d + 1]`` tokens; the leaves' lengths are ``leaf_lens`` (an int, or one per leaf in DFS order)."""
    lens: list[int] = []
    parents: list[int] = []
    leaves = 1
    for fan in level_fans:
        leaves *= fan
    leaf_list = list(response_lengths(leaves, leaf_lens))
    depth = len(level_lens)

    def add(level: int, parent: int) -> None:
        node = len(lens)
        lens.append(leaf_list.pop(0) if level == depth - 1 else level_lens[level])
        parents.append(parent)
        if level < depth - 1:
            for _ in range(level_fans[level]):
                add(level + 1, node)

    add(0, -1)
    return PrefixTreeLayout(lens, parents)


def system_prompt_workload(system: int = 2048, prompts: int = 8, prompt_len: int = 4096, responses: int = 8,
                           response_len: IntOrSeq = 2048) -> PrefixTreeLayout:
    """(a) A system prompt shared by ``prompts`` prompts, each with ``responses`` responses: root (``system``) ->
    prompt nodes (``prompt_len``, the prompt after the system prompt) -> responses (``response_len``, an int for
    all or one per response; the issue's "<= 2K" is modelled at its bound, 2048)."""
    check_int(system, "system", 1)
    check_int(prompt_len, "prompt_len", 1)
    return _levels([system, prompt_len, 0], [check_int(prompts, "prompts", 1),
                                             check_int(responses, "responses", 1)], response_len)


def branching_workload(prompt: int = 4096, responses: int = 4, branch_at: int = 512, continuations: int = 4,
                       continuation_len: IntOrSeq = 1536) -> PrefixTreeLayout:
    """(b) Tree rollouts that branch mid-response: prompt -> ``responses`` response stems of ``branch_at`` tokens
    -> ``continuations`` continuations each (``continuation_len``; "<= 1.5K more" at its bound, 1536)."""
    check_int(prompt, "prompt", 1)
    check_int(branch_at, "branch_at", 1)
    return _levels([prompt, branch_at, 0], [check_int(responses, "responses", 1),
                                            check_int(continuations, "continuations", 1)], continuation_len)


def multi_turn_workload(turns: int = 3, turn_len: int = 1024, branches: int = 8,
                        branch_len: IntOrSeq = 1024) -> PrefixTreeLayout:
    """(c) A multi-turn trace: ``turns`` turns of ``turn_len`` tokens of history, one node per turn, shared by every
    branch; then ``branches`` branches of ``branch_len`` tokens at the last turn. A chain followed by one fan holds
    no more sharing than one prompt: its tokens equal the best two-level packing's."""
    turns = check_int(turns, "turns", 1)
    check_int(turn_len, "turn_len", 1)
    return _levels([turn_len] * turns + [0], [1] * (turns - 1) + [check_int(branches, "branches", 1)], branch_len)


#: The issue's three benchmark workloads at their default sizes.
WORKLOADS = {"a: system prompt": system_prompt_workload, "b: branching rollouts": branching_workload,
             "c: multi-turn": multi_turn_workload}


def workload_table(model: str = "qwen3-8b", window_left: int = -1, mode: str = "fwdbwd",
                   layouts: dict[str, PrefixTreeLayout] | None = None) -> list[dict]:
    """One row per workload: tokens and pairs of the tree, the N-copy and the best two-level packing, their ratios
    and the whole-model FLOP ratio N-copy / tree for ``model`` (default: the three :data:`WORKLOADS`)."""
    cfg = load_model(model)
    layouts = layouts if layouts is not None else {name: make() for name, make in WORKLOADS.items()}
    out = []
    for name, layout in layouts.items():
        two = two_level_counts(layout, window_left)
        tree_pairs = tree_useful_pairs(layout, window_left)
        std = model_flops(cfg, layout, mode, "ncopy")
        tree = model_flops(cfg, layout, mode, "dualkv")
        out.append({
            "workload": name, "nodes": layout.num_nodes, "paths": layout.num_paths,
            "tokens_tree": layout.total_tokens, "tokens_ncopy": tree_tokens_ncopy(layout),
            "tokens_two_level": two["tokens"],
            "rho": tree_rho(layout), "rho_two_level": tree_tokens_ncopy(layout) / two["tokens"],
            "pairs_tree": tree_pairs, "pairs_ncopy": tree_n_copy_pairs(layout, window_left),
            "pairs_two_level": two["pairs"],
            "attn_ratio": tree_attn_ratio(layout, window_left),
            "attn_ratio_two_level": tree_n_copy_pairs(layout, window_left) / two["pairs"],
            "flop_ratio": std["total"] / tree["total"], "model": cfg.name, "mode": mode,
        })
    return out


def format_workload_table(rows: list[dict]) -> str:
    """:func:`workload_table` rows as a Markdown table (what docs/trees.md shows)."""
    lines = ["| workload | nodes | paths | tokens: tree | best two-level | N-copy | rho | rho two-level "
             "| attn pairs N-copy/tree | N-copy/two-level | model FLOPs N-copy/tree |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['nodes']} | {r['paths']} | {r['tokens_tree']:,} | "
                     f"{r['tokens_two_level']:,} | {r['tokens_ncopy']:,} | {r['rho']:.2f} | {r['rho_two_level']:.2f} | "
                     f"{r['attn_ratio']:.2f} | {r['attn_ratio_two_level']:.2f} | {r['flop_ratio']:.2f} |")
    return "\n".join(lines)
