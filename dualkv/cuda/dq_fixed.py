"""The fixed-point dQ mode of the mma.sync dK/dV kernel (``mma_backward("fixed")``; csrc/bwd_dkdv.cu DKV_DQ_FIXED):
deterministic dQ without an order between the CTAs that add into one row.

Each step's dQ partial of a row i (before the softmax scale) is added as the 64-bit integer round(partial * u_i),
where the row's unit u_i = 2^e_i is chosen before the backward (csrc/bwd_prep.cu) so that the row's whole sum stays
below 2^62 in magnitude. Integer addition is associative, so the CTAs add with plain REDs in whatever order they
arrive and the int64 sum has the same bits every run; the cast (csrc/bwd_dq_fixed_cast.cu) writes
dQ_i = scale * sum / u_i in 16 bits.

The bound. The kernel's sum is acc_i = sum_j dS_ij K_j with dS_ij = P_ij (dP_ij - D_i), dP_ij = dO_i . V_j,
P_ij >= 0, sum_j P_ij = 1 (up to fp32 rounding) and D_i = dO_i . O_i - dLSE_i. So, per column,
|acc_i| <= max|K| (max_j |dP_ij| + |D_i|) <= max|K| (||dO_i||_1 max|V| + |D_i|), and every partial sum (any subset of
the keys) too. x_i = 2 max|K| (||dO_i||_1 max|V| + |D_i|) covers that with room for the roundings (dS rounded to 16
bits, P's and the products' fp32 rounding: together well under 1%). With e_i = 61 - floor(log2 x_i),
|acc_i u_i| < x_i 2^(61 - floor(log2 x_i)) < 2^62; each add rounds by at most 1/2, so the int64 sum never leaves
(-2^63, 2^63) for fewer than 2^62 adds, and its error is at most (adds / 2) / u_i, about adds * 2^-62 * x_i: far
below the fp32 sum's rounding for any row whose dQ is not 2^30 times smaller than its bound.
e_i is clamped to [-126, 126] (u_i and 1/u_i are then normal fp32 powers of two); x_i = 0 (dO_i = 0, so every
partial is 0) takes 126. Where x_i or the row's LSE is not finite, u_i is NaN and the cast writes NaN (an overflow or
a NaN in the inputs is not turned into a silent number: cvt of a NaN to an integer would give 0).
"""

from __future__ import annotations

import math

import torch

from .dq_layout import TAIL_ROWS

#: e_i = TOP_BIT - floor(log2 x_i): every row's |sum * u_i| < 2^(TOP_BIT + 1).
TOP_BIT = 61
#: The clamp of e_i (u_i and 1 / u_i stay normal fp32).
MAX_EXP = 126


def kv_amax(*tensors: torch.Tensor) -> torch.Tensor:
    """float32 (2,) on the tensors' device: (max |K|, max |V|) over ``tensors`` = (k, ..., v, ...) given as two equal
    halves (K tensors first, then V tensors; empty ones skipped), without a device-to-host copy. A NaN propagates."""
    half = len(tensors) // 2
    if len(tensors) != 2 * half or half == 0:
        raise ValueError("kv_amax takes the K tensors, then as many V tensors")

    def amax(ts) -> torch.Tensor:
        parts = [torch.stack(torch.aminmax(t)).float().abs().amax() for t in ts if t.numel()]
        return torch.stack(parts).amax() if parts else torch.zeros((), device=tensors[0].device)

    return torch.stack([amax(tensors[:half]), amax(tensors[half:])])


def new_units(tokens: int, heads: int, device) -> torch.Tensor:
    """Zeroed float32 (H, tokens + TAIL_ROWS) for bwd_prep.cu to fill: rows past the last token read unit 0 (a query
    step's rows past its segment add zeros, dq_layout.TAIL_ROWS)."""
    return torch.zeros((heads, tokens + TAIL_ROWS), dtype=torch.float32, device=device)


def row_units(dout: torch.Tensor, delta: torch.Tensor, lse: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """float32 (H, T): the units bwd_prep.cu writes, in PyTorch (the kernel's reference). dout (T, H, d) 16-bit;
    delta (H, T) = D (minus dLSE) fp32; lse (H, T) natural-log LSE; amax from :func:`kv_amax`."""
    l1 = dout.float().abs().sum(-1).t()
    x = 2.0 * amax[0] * (l1 * amax[1] + delta.abs())
    finite = torch.isfinite(x) & torch.isfinite(lse)
    _, exp = torch.frexp(x)  # x = m 2^exp, m in [0.5, 1): floor(log2 x) = exp - 1
    e = (TOP_BIT - (exp - 1)).clamp(-MAX_EXP, MAX_EXP)
    e = torch.where(x == 0, torch.full_like(e, MAX_EXP), e)
    units = torch.ldexp(torch.ones_like(x), e.to(torch.float32))
    return torch.where(finite, units, torch.full_like(units, math.nan))


def to_fixed(partial: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """int64: round-half-even(partial * unit), the kernel's cvt.rni.s64.f32 of an fp32 partial (float32 in)."""
    return torch.round(partial.double() * unit.double()).to(torch.int64)
