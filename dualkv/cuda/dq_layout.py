"""The fp32 dQ accumulator layout of the mma.sync dK/dV kernel's atomic and ordered dQ modes, "fragment order"
(csrc/bwd_dkdv.cu with DKV_DQ_ATOMIC or DKV_DQ_ORDERED adds into it, csrc/bwd_dq_frag_cast.cu reads it back).

Per head, a flat block of ``acc_rows(tokens) * head_dim`` floats: tokens in groups of 8, columns in chunks of 8, and
the (group, chunk) block of 64 floats holds the chunk's even columns first (token t's column c at 4 (t % 8) + c / 2),
then its odd ones (32 floats on). It is the order in which an ``mma.sync`` m16n8 accumulator fragment leaves a warp:
fragment register (nt, e) of lane (g, t4) is row g + 8 (e / 2), column 8 nt + 2 t4 + e % 2, so one add instruction
covers 32 consecutive floats when a 16-row slab starts a token group (two runs of them otherwise), with no staging.
"""

from __future__ import annotations

import numpy as np
import torch

#: Tokens per group (the fragment's 8 rows g) and columns per chunk (the fragment's n8 tile).
GROUP = 8


def acc_rows(tokens: int) -> int:
    """Rows of the accumulator per head: ``tokens`` rounded up to whole groups of 8."""
    return -(-tokens // GROUP) * GROUP


#: Rows behind the accumulator (a query step of the default tiles, 64; :func:`new_frag_acc` takes a larger step's).
#: A slab's rows past its step's last query add where their tokens' rows are, instead of being branched around: into
#: the next segment's rows, the next head's first rows, or, past the last head, these rows. Their Q and dO rows are
#: zero-filled and their LSE infinite, so they add exactly +0 or -0, which leaves every nonzero value as it is (a
#: zero's sign could change only were an ordered add's result a negative subnormal, which red.add flushes to -0).
#: (One shared scratch block with every lane at one address had serialized those adds: on ragged micro-batches, where
#: every response ends in a partial query tile, the ordered backward took 2.2-3.6x the FA2 cascade's; H200,
#: experiments/results/checks/s27rl-h200-20261129T0734Z.log.)
TAIL_ROWS = 64


def new_frag_acc(tokens: int, heads: int, head_dim: int, device, step_rows: int = TAIL_ROWS) -> torch.Tensor:
    """A zeroed accumulator (H, acc_rows(tokens), d), fp32, in fragment order, with the rows a query step of
    ``step_rows`` can add past the last token behind it in the same allocation (at least :data:`TAIL_ROWS`)."""
    rows = acc_rows(tokens)
    tail = max(TAIL_ROWS, acc_rows(step_rows))
    flat = torch.zeros((heads * rows + tail) * head_dim, dtype=torch.float32, device=device)
    return flat[:heads * rows * head_dim].view(heads, rows, head_dim)


def frag_offset(token, col, head_dim: int):
    """Float offset of (``token``, ``col``) within a head's block (ints or integer arrays, broadcast)."""
    token, col = np.asarray(token, dtype=np.int64), np.asarray(col, dtype=np.int64)
    return ((token // GROUP) * GROUP * head_dim + (col // GROUP) * 64 + (col % 2) * 32 + (token % GROUP) * 4
            + (col % GROUP) // 2)


def kernel_add_offset(slab_tok: int, g: int, t4: int, nt: int, e: int, dq_part: int, dq_cols: int, head_dim: int,
                      head: int = 0, head_stride: int = 0) -> int:
    """The float offset (from the accumulator's start) at which bwd_dkdv.cu's lane (g, t4) of column part ``dq_part``
    adds fragment register (nt, e) of the 16-row slab whose row 0 is token ``slab_tok`` (rows past the step's last
    query too: they add zeros, see :data:`TAIL_ROWS`). Spelled as the kernel spells it (``lane_lo`` plus a
    constant)."""
    tok = slab_tok + g
    lane_lo = head * head_stride + (tok >> 3) * (8 * head_dim) + (tok & 7) * 4 + t4 + dq_part * dq_cols * 8
    return lane_lo + (e >> 1) * 8 * head_dim + nt * 64 + (e & 1) * 32


def _offsets(tokens: int, head_dim: int, device) -> torch.Tensor:
    """int64 (tokens, head_dim): each (token, column)'s offset within a head's block."""
    return torch.as_tensor(frag_offset(np.arange(tokens)[:, None], np.arange(head_dim)[None, :], head_dim),
                           device=device)


def to_rows(acc: torch.Tensor, tokens: int) -> torch.Tensor:
    """(tokens, H, d) rows from an accumulator (H, acc_rows(tokens), d) in fragment order: the reference of the cast
    kernel (without its scale and 16-bit rounding)."""
    heads, rows, head_dim = acc.shape
    return acc.reshape(heads, rows * head_dim)[:, _offsets(tokens, head_dim, acc.device)].permute(1, 0, 2)


def from_rows(rows_thd: torch.Tensor) -> torch.Tensor:
    """The accumulator (H, acc_rows(T), d) in fragment order holding ``rows_thd`` (T, H, d); padding rows are 0."""
    tokens, heads, head_dim = rows_thd.shape
    acc = rows_thd.new_zeros((heads, acc_rows(tokens) * head_dim))
    acc[:, _offsets(tokens, head_dim, rows_thd.device).reshape(-1)] = rows_thd.permute(1, 0, 2).reshape(heads, -1)
    return acc.reshape(heads, acc_rows(tokens), head_dim)
