"""Symbolic proofs (sympy) for prefix trees, in the style of test_sympy_proofs.py:

* gradient equivalence on a symbolic depth-2 tree with a fan at each level (d = 1): per-node attention over the
  ancestor chain, fed the summed upstream gradient of the paths through each node, with ancestor dK/dV summed
  over every descendant, gives the N-copy layout's parameter gradients (obtained by direct differentiation) —
  the paper's appendix A theorem with more than one shared level; negative controls fail;
* rho of a uniform three-level tree: it reduces to the paper's N(P+R)/(P+NR) when a level has one node or no
  tokens, tends to the number of paths as the root grows, never exceeds the best two-level packing's tokens, and
  the analysis functions agree with the closed forms.
"""

from __future__ import annotations

import pytest
import sympy as sp

from dualkv import PrefixTreeLayout
from dualkv.analysis import (causal_row_pairs, system_prompt_workload, tree_n_copy_pairs, tree_rho,
                             tree_useful_pairs, two_level_counts)
from test_sympy_proofs import _is_zero, _rational_zero, attention_backward, attention_forward

#   x0 -> a -> {l1, l2};  x0 -> b.  One token per node: paths [x0, a, l1], [x0, a, l2], [x0, b].
TREE = PrefixTreeLayout((1, 1, 1, 1, 1), (-1, 0, 1, 1, 0))


def _tree_gradients(variant: str = "exact"):
    """Parameter gradients (w_q, w_k, w_v) of a one-layer, one-head, d = 1 model: N-copy by differentiation, and
    the per-node decomposition's backward. ``variant`` injects known-wrong versions."""
    wq, wk, wv = sp.symbols("w_q w_k w_v", real=True)
    x = list(sp.symbols(f"x0:{TREE.num_nodes}", real=True))      # one token per node
    rows = [TREE.path(leaf) for leaf in TREE.leaves]
    u = [sp.symbols(f"u{r}_0:{len(path)}", real=True) for r, path in enumerate(rows)]
    causal = lambda t: range(t + 1)  # noqa: E731

    loss = 0
    for r, path in enumerate(rows):
        tokens = [x[i] for i in path]
        out, _ = attention_forward([wq * s for s in tokens], [wk * s for s in tokens], [wv * s for s in tokens],
                                   causal)
        loss += sum(u[r][t] * out[t] for t in range(len(path)))
    reference = [sp.diff(loss, w) for w in (wq, wk, wv)]

    Q, K, V = ([w * s for s in x] for w in (wq, wk, wv))
    dQ, dK, dV = [0] * len(x), [0] * len(x), [0] * len(x)
    for i in range(TREE.num_nodes):
        path = TREE.path(i)
        through = [r for r, p in enumerate(rows) if i in p]            # the copies of node i
        if variant == "first_copy_dO":
            through = through[:1]
        d_out = sum(u[r][TREE.node_positions[i]] for r in through)
        keys, vals = [K[j] for j in path], [V[j] for j in path]
        out, probs = attention_forward([Q[i]], keys, vals, lambda t: range(len(path)))
        dq, dk, dv = attention_backward([Q[i]], keys, vals, out, probs, [d_out])
        dQ[i] += dq[0]
        first_child = TREE.parents[i] < 0 or TREE.children[TREE.parents[i]][0] == i
        for j, node in enumerate(path):
            if variant == "first_child_only" and node != i and not first_child:
                continue
            if variant == "missing_grandparent" and len(path) > 2 and j == 0 and node != i:
                continue
            dK[node] += dk[j]
            dV[node] += dv[j]
    packed = [sum(g[t] * x[t] for t in range(len(x))) for g in (dQ, dK, dV)]
    return reference, packed


def test_tree_gradient_equivalence():
    reference, packed = _tree_gradients()
    for name, ref, got in zip(("W_q", "W_k", "W_v"), reference, packed):
        assert _rational_zero(ref - got), f"dL/d{name} of the per-node backward differs from the N-copy gradient"


@pytest.mark.parametrize("variant", ["first_child_only", "first_copy_dO", "missing_grandparent"])
def test_tree_gradient_negative_controls(variant):
    reference, packed = _tree_gradients(variant)
    assert not all(_rational_zero(ref - got) for ref, got in zip(reference, packed))


# ---------------------------------------------------------------------------------------------------- rho
L1, L2, L3 = sp.symbols("L1 L2 L3", positive=True)
m, n = sp.symbols("m n", positive=True)                 # fans b2 = 1 + m, b3 = 1 + n (more than one child)
b2, b3 = sp.symbols("b2 b3", positive=True)

T_TREE = L1 + b2 * L2 + b2 * b3 * L3
T_STD = b2 * b3 * (L1 + L2 + L3)
RHO = T_STD / T_TREE
N, P, R = sp.symbols("N P R", positive=True)
PAPER = N * (P + R) / (P + N * R)


def test_uniform_tree_rho_reduces_to_the_paper():
    # one middle node per root: the root and middle merge into a prompt P = L1 + L2 with N = b3 responses
    assert _is_zero(RHO.subs(b2, 1) - PAPER.subs({N: b3, P: L1 + L2, R: L3}))
    # an empty middle level: one prompt, N = b2 b3 responses
    assert _is_zero(sp.limit(RHO, L2, 0) - PAPER.subs({N: b2 * b3, P: L1, R: L3}))
    # a long root: every path's root copy dominates, rho -> number of paths
    assert _is_zero(sp.limit(RHO, L1, sp.oo) - b2 * b3)
    # negative control: the limit is not b3 alone
    assert not _is_zero(sp.limit(RHO, L1, sp.oo) - b3)


def test_tree_never_packs_more_than_two_levels():
    fans = {b2: 1 + m, b3: 1 + n}
    at_root = L1 + b2 * b3 * (L2 + L3)                    # group prompt = the root
    at_middle = b2 * (L1 + L2) + b2 * b3 * L3              # one group per middle node
    assert sp.factor((at_root - T_TREE).subs(fans)).is_nonnegative
    assert sp.factor((at_middle - T_TREE).subs(fans)).is_nonnegative
    assert _is_zero((at_middle - T_TREE) - (b2 - 1) * L1)  # what the tree saves over per-prompt groups
    # negative control: with one middle node there is nothing to save at that level
    assert _is_zero((at_middle - T_TREE).subs(b2, 1))


def test_closed_forms_match_the_analysis():
    sizes = {L1: 2048, L2: 4096, L3: 2048, b2: 8, b3: 8}
    layout = system_prompt_workload()
    assert sp.Rational(tree_rho(layout)).limit_denominator(10**6) == RHO.subs(sizes)
    two = two_level_counts(layout)
    assert two["tokens"] == (b2 * (L1 + L2) + b2 * b3 * L3).subs(sizes)
    F = lambda s: causal_row_pairs(int(s))  # noqa: E731
    tree_pairs = F(2048) + 8 * (F(6144) - F(2048)) + 64 * (F(8192) - F(6144))
    assert tree_useful_pairs(layout) == tree_pairs
    assert tree_n_copy_pairs(layout) == 64 * F(8192)
    # the exact causal pair ratio of the uniform tree also tends to the number of paths as the root grows
    tri = lambda s: s * (s + 1) / 2  # noqa: E731
    pairs_tree = tri(L1) + b2 * (tri(L1 + L2) - tri(L1)) + b2 * b3 * (tri(L1 + L2 + L3) - tri(L1 + L2))
    ratio = b2 * b3 * tri(L1 + L2 + L3) / pairs_tree
    assert _is_zero(sp.limit(ratio, L1, sp.oo) - b2 * b3)
