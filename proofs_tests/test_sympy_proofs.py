"""Symbolic proofs (sympy) of the statements dualkv rests on. Each test fails if its statement is false; the
negative controls check that the comparison used can tell a wrong statement from a right one.

* rho = N(P+R)/(P+NR): limits (N -> inf: 1 + P/R; P -> inf: N), monotonicity, bounds;
* the attention speedup -> N as P/R -> inf (the paper's closed form and the exact causal pair ratio);
* the windowed pair-count closed form used by :mod:`dualkv.analysis.pairs`;
* the log-sum-exp merge: softmax attention over two disjoint key sets equals the LSE-weighted combination of the
  two partial results — why splitting a response's keys into [prompt; own response] is exact;
* the attention backward is linear in dO (the step of the paper's appendix A equivalence proof);
* the gradient-equivalence theorem on a symbolic instance (P=2, R=1, N=2, d=1): the two-call decomposition's
  backward (call 1 fed the summed prompt dO, call 2's context dK/dV summed over responses) gives the N-copy
  layout's parameter gradients, obtained by direct differentiation.
"""

from __future__ import annotations

import pytest
import sympy as sp

from dualkv.analysis import attn_speedup_theory, causal_row_pairs, rho_equal

N, P, R = sp.symbols("N P R", positive=True)
m = sp.symbols("m", positive=True)          # N = 1 + m: more than one response
x = sp.symbols("x", positive=True)          # P = x * R

RHO = N * (P + R) / (P + N * R)


def _is_zero(expr: sp.Expr) -> bool:
    return sp.simplify(expr) == 0


def _numeric(expr: sp.Expr, seed: int = 0) -> float:
    """``expr`` at a fixed pseudo-random point (for negative controls: a nonzero value disproves an identity)."""
    import random

    rng = random.Random(seed)
    point = {s: sp.Rational(rng.randint(-9, 9) or 1, rng.randint(2, 7)) for s in sorted(expr.free_symbols, key=str)}
    return float(sp.N(expr.subs(point), 30))


# ---------------------------------------------------------------------------------------------------- rho


def test_rho_limits():
    assert _is_zero(sp.limit(RHO, N, sp.oo) - (1 + P / R))
    assert _is_zero(sp.limit(RHO, P, sp.oo) - N)
    assert _is_zero(RHO.subs(N, 1) - 1)                       # one response: nothing to share
    assert _is_zero(sp.limit(RHO, P, 0) - 1)                  # no prompt: nothing to share


def test_rho_monotone_and_bounded():
    rho = RHO.subs(N, 1 + m)
    assert sp.factor(sp.diff(rho, m)).is_positive             # more responses, more reduction
    assert sp.factor(sp.diff(rho, P)).is_positive             # longer prompt, more reduction (N > 1)
    assert sp.factor(sp.diff(rho, R)).is_negative             # longer responses, less
    assert sp.factor((1 + m) - rho).is_positive               # rho < N
    assert sp.factor(1 + P / R - rho).is_positive             # rho < 1 + P/R
    assert sp.factor(rho - 1).is_positive                     # rho > 1
    # negative control: the reverse claim (rho grows with R) is refuted the same way
    assert not sp.factor(sp.diff(rho, R)).is_positive


def test_rho_formula_matches_token_counts():
    t_std, t_dk = N * P + N * R, P + N * R
    assert _is_zero(t_std / t_dk - RHO)
    assert abs(rho_equal(16, 65536, 512) - float(RHO.subs({N: 16, P: 65536, R: 512}))) < 1e-12


# ---------------------------------------------------------------------------------------------------- attention speedup


def test_attention_speedup_tends_to_N():
    paper = N * (P + R) ** 2 / (P ** 2 + N * R * (P + R))
    assert _is_zero(sp.limit(paper.subs(P, x * R), x, sp.oo) - N)
    # the exact causal pair ratio: N rows of (P+R)(P+R+1)/2 pairs vs P(P+1)/2 + N(RP + R(R+1)/2)
    exact = (N * (P + R) * (P + R + 1) / 2) / (P * (P + 1) / 2 + N * (R * P + R * (R + 1) / 2))
    assert _is_zero(sp.limit(exact.subs(P, x * R), x, sp.oo) - N)
    assert _is_zero(sp.limit(exact, P, sp.oo) - N)
    assert abs(float(paper.subs({N: 16, P: 32768, R: 2048})) - attn_speedup_theory(16, 32768, 2048)) < 1e-12
    # negative control: the limit is not N/2
    assert not _is_zero(sp.limit(exact.subs(P, x * R), x, sp.oo) - N / 2)


def test_window_pair_count_closed_form():
    """F(S) = sum_{t<S} (min(t, w) + 1): a full triangle up to w + 1 rows, then w + 1 keys per row."""
    S, w, t = sp.symbols("S w t", integer=True, nonnegative=True)
    long_row = sp.summation(t + 1, (t, 0, w)) + sp.summation(w + 1, (t, w + 1, S - 1))
    closed = (w + 1) * (w + 2) / 2 + (S - w - 1) * (w + 1)
    assert _is_zero(long_row - closed)
    assert _is_zero(sp.summation(t + 1, (t, 0, S - 1)) - S * (S + 1) / 2)
    for s_val, w_val in ((10, 3), (4, 3), (3, 3), (1, 0), (7, 0)):
        brute = sum(min(tt, w_val) + 1 for tt in range(s_val))
        assert causal_row_pairs(s_val, w_val) == brute
    # useful pairs of one response: F(P+R) - F(P) = R*P + R(R+1)/2 (unwindowed)
    tri = lambda n: n * (n + 1) / 2  # noqa: E731
    assert _is_zero(tri(P + R) - tri(P) - (R * P + R * (R + 1) / 2))


# ---------------------------------------------------------------------------------------------------- LSE merge


@pytest.mark.parametrize("na,nb", [(1, 1), (2, 3), (3, 2)])
def test_lse_merge_is_exact(na, nb):
    s = sp.symbols(f"s0:{na + nb}", real=True)
    v = sp.symbols(f"v0:{na + nb}", real=True)
    c = sp.symbols("c", real=True)                            # any shift (kernels use the running max)
    a, b = range(na), range(na, na + nb)

    def part(idx):
        z = sum(sp.exp(s[j]) for j in idx)
        return sum(sp.exp(s[j]) * v[j] for j in idx) / z, sp.log(z)

    o_all, lse_all = part(range(na + nb))
    (o_a, l_a), (o_b, l_b) = part(a), part(b)
    wa, wb = sp.exp(l_a - c), sp.exp(l_b - c)
    merged = (wa * o_a + wb * o_b) / (wa + wb)
    assert _is_zero(merged - o_all)
    assert _is_zero(sp.exp(c + sp.log(wa + wb)) - sp.exp(lse_all))   # merged LSE = LSE over the union
    # negative control: averaging the two partial outputs is not attention over the union
    assert abs(_numeric((o_a + o_b) / 2 - o_all)) > 1e-6


# ---------------------------------------------------------------------------------------------------- backward


class E(sp.Function):
    """exp without sympy's automatic exp(a)*exp(b) -> exp(a+b) rewriting: d/du E(u) = E(u). Identities built
    from it are identities of exp; replacing each E(.) by a positive symbol keeps them rational (fast to check)."""

    def fdiff(self, argindex=1):
        return E(self.args[0])


def _rational_zero(expr: sp.Expr) -> bool:
    atoms = sorted(expr.atoms(E), key=str)
    gens = sp.symbols(f"e0:{len(atoms)}", positive=True)
    num, _ = sp.fraction(sp.together(expr.subs(dict(zip(atoms, gens)))))
    return sp.expand(num) == 0


def attention_forward(q, k, v, visible):
    """Rows ``t``: softmax over keys ``visible(t)`` of q_t.k_j (d = 1, scale 1), times v. Returns (O, probs)."""
    out, probs = [], []
    for t in range(len(q)):
        js = list(visible(t))
        e = [E(q[t] * k[j]) for j in js]
        z = sum(e)
        probs.append({j: ej / z for ej, j in zip(e, js)})
        out.append(sum(probs[t][j] * v[j] for j in js))
    return out, probs


def attention_backward(q, k, v, out, probs, d_out):
    """FlashAttention's backward: dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = dS K, dK = dS^T Q."""
    dq, dk, dv = [0] * len(q), [0] * len(k), [0] * len(v)
    for t, row in enumerate(probs):
        delta = d_out[t] * out[t]
        for j, p in row.items():
            dv[j] += p * d_out[t]
            ds = p * (d_out[t] * v[j] - delta)
            dq[t] += ds * k[j]
            dk[j] += ds * q[t]
    return dq, dk, dv


def test_attention_backward_is_the_gradient_and_linear_in_dO():
    q = sp.symbols("q0:2", real=True)
    k = sp.symbols("k0:3", real=True)
    v = sp.symbols("v0:3", real=True)
    g1, g2 = sp.symbols("g0:2", real=True), sp.symbols("h0:2", real=True)
    alpha, beta = sp.symbols("alpha beta", real=True)
    visible = lambda t: range(t + 2)  # noqa: E731  (query 0 sees keys 0-1, query 1 sees 0-2)
    out, probs = attention_forward(q, k, v, visible)

    def bwd(d_out):
        return [x for grads in attention_backward(q, k, v, out, probs, d_out) for x in grads]

    # the formulas are the vector-Jacobian product of the forward
    functional = sum(gi * oi for gi, oi in zip(g1, out))
    autodiff = [sp.diff(functional, s) for s in (*q, *k, *v)]
    assert all(_rational_zero(a - b) for a, b in zip(bwd(list(g1)), autodiff))
    # linear in dO: f(alpha g1 + beta g2) = alpha f(g1) + beta f(g2)
    mixed = bwd([alpha * a + beta * b for a, b in zip(g1, g2)])
    assert all(_rational_zero(mx - alpha * a - beta * b) for mx, a, b in zip(mixed, bwd(list(g1)), bwd(list(g2))))
    # negative control: the backward is not linear in the keys
    d1 = attention_backward(q, [2 * kk for kk in k], v, *attention_forward(q, [2 * kk for kk in k], v, visible),
                            list(g1))[1]
    d2 = attention_backward(q, k, v, out, probs, list(g1))[1]
    assert not _rational_zero(d1[0] - 2 * d2[0])


def _ncopy_and_dualkv_gradients(variant: str = "exact"):
    """Parameter gradients (w_q, w_k, w_v) of a one-layer, one-head, d = 1 model on P=2, R=1, N=2.

    N-copy: rows [x0, x1, y_i]; loss sum_i sum_t u_i,t * o_i,t with arbitrary upstream gradients u (the copies'
    prompt rows get different dO from the layers above, as in the paper's proof). Reference: direct
    differentiation. dualkv: packed [x0, x1, y1, y2]; call 1 over the prompt fed dO = sum_i u_i (prompt rows),
    call 2 per response over [prompt; own]; context dK/dV of both calls summed; dW = sum_t dQKV_t * token_t.
    ``variant`` injects the known-wrong versions (negative controls).
    """
    wq, wk, wv = sp.symbols("w_q w_k w_v", real=True)
    prompt = list(sp.symbols("x0:2", real=True))
    resp = list(sp.symbols("y1:3", real=True))
    u = [sp.symbols(f"u{i}_0:3", real=True) for i in range(2)]
    causal = lambda t: range(t + 1)  # noqa: E731

    loss = 0
    for i in range(2):
        row = prompt + [resp[i]]
        out, _ = attention_forward([wq * s for s in row], [wk * s for s in row], [wv * s for s in row], causal)
        loss += sum(u[i][t] * out[t] for t in range(3))
    reference = [sp.diff(loss, w) for w in (wq, wk, wv)]

    tokens = prompt + resp
    Q, K, V = ([w * s for s in tokens] for w in (wq, wk, wv))
    dQ, dK, dV = [0] * 4, [0] * 4, [0] * 4
    o_c, p_c = attention_forward(Q[:2], K[:2], V[:2], causal)
    d_oc = [u[0][t] + u[1][t] for t in range(2)] if variant != "call1_one_copy" else [u[0][t] for t in range(2)]
    for grads, acc in zip(attention_backward(Q[:2], K[:2], V[:2], o_c, p_c, d_oc), (dQ, dK, dV)):
        for t in range(2):
            acc[t] += grads[t]
    for i in range(2):
        keys, vals = K[:2] + [K[2 + i]], V[:2] + [V[2 + i]]
        o_d, p_d = attention_forward([Q[2 + i]], keys, vals, lambda t: range(3))
        dq, dk, dv = attention_backward([Q[2 + i]], keys, vals, o_d, p_d, [u[i][2]])
        dQ[2 + i] += dq[0]
        dK[2 + i] += dk[2]
        dV[2 + i] += dv[2]
        if variant != "no_context_grad":
            for j in range(2):
                dK[j] += dk[j]
                dV[j] += dv[j]
    packed = [sum(g[t] * tokens[t] for t in range(4)) for g in (dQ, dK, dV)]
    return reference, packed


def test_gradient_equivalence_theorem():
    reference, packed = _ncopy_and_dualkv_gradients()
    for name, ref, got in zip(("W_q", "W_k", "W_v"), reference, packed):
        assert _rational_zero(ref - got), f"dL/d{name} of the two-call backward differs from the N-copy gradient"


@pytest.mark.parametrize("variant", ["no_context_grad", "call1_one_copy"])
def test_gradient_equivalence_negative_controls(variant):
    reference, packed = _ncopy_and_dualkv_gradients(variant)
    assert not all(_rational_zero(ref - got) for ref, got in zip(reference, packed))
