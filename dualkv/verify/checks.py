"""Equivalence checks: a DualKV computation against the independent N-copy oracle, one :class:`Row` per quantity.

Each check takes the function under test as an argument, so the same check runs on the reference, the CUDA
kernels and the known-wrong variants of :mod:`dualkv.verify.mutants` (which must fail it).

Gradients are checked the way the paper's Eq. 7 states them: every copy of the N-copy layout gets its own random
upstream gradient; the packed computation gets their sum at prompt rows; the packed gradients must equal the sums
over copies of the N-copy gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import context_attention, flash_attn_dualkv_varlen_func, shared_prefix_attention
from ..layout import GroupLayout
from ..reference import n_copy_attention
from ..testing import Comparison, cancellation_slack, compare, n_copy_oracle, random_qkv

DTYPE_NAMES = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class Row:
    """One verified quantity."""

    check: str
    config: str
    quantity: str
    backend: str
    dtype: str
    error: float
    bound: float
    metric: str
    passed: bool
    note: str = ""

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class AttentionCase:
    """A packed micro-batch shape for the attention checks."""

    prompt_lens: tuple[int, ...]
    response_lens: tuple[tuple[int, ...], ...]
    heads: int
    kv_heads: int
    head_dim: int
    window: tuple[int, int] = (-1, -1)
    tags: tuple[str, ...] = field(default=(), compare=False)

    @property
    def layout(self) -> GroupLayout:
        return GroupLayout.from_lengths(self.prompt_lens, self.response_lens)

    @property
    def name(self) -> str:
        groups = ";".join(f"P{p}:R{','.join(map(str, r))}" for p, r in zip(self.prompt_lens, self.response_lens))
        win = "" if self.window == (-1, -1) else f" win{self.window[0]}"
        return f"[{groups}] H{self.heads}/{self.kv_heads} d{self.head_dim}{win}"


# ---------------------------------------------------------------------------------------------- oracle side
@dataclass
class OracleResult:
    """float64 N-copy results read back on the packed layout (prompt rows: values of copy 1, gradients summed)."""

    out: torch.Tensor
    lse: torch.Tensor
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    d_out: torch.Tensor  # packed upstream gradient (sum over copies at prompt rows)


def _lse_oracle(q_std, k_std, cu, scale, left) -> torch.Tensor:
    """(H, T_std) float64 log-sum-exp of causal (windowed) scores, dense per row."""
    out = []
    g = q_std.shape[1] // k_std.shape[1]
    for a, b in zip(cu, cu[1:]):
        qs, ks = q_std[a:b], k_std[a:b].repeat_interleave(g, dim=1)
        s = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        pos = torch.arange(b - a, device=q_std.device)
        mask = pos[None, :] <= pos[:, None]
        if left >= 0:
            mask &= pos[None, :] >= pos[:, None] - left
        out.append(torch.logsumexp(s.masked_fill(~mask, float("-inf")), -1))
    return torch.cat(out, 1)


def n_copy_reference(layout: GroupLayout, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     window: tuple[int, int], seed: int, *, device: str | torch.device = "cpu",
                     with_grad: bool = True) -> OracleResult:
    """Run the N-copy layout in float64 with PyTorch SDPA (on ``device``), random per-copy upstream gradients,
    sums over copies. Results come back on the CPU."""
    expand = torch.from_numpy(layout.copy_token_index).to(device)
    back = torch.from_numpy(layout.first_copy_index).to(device)
    cu = layout.copy_cu_seqlens.tolist()
    q_std, k_std, v_std = (t.detach().to(device=device, dtype=torch.float64)[expand].requires_grad_(with_grad)
                           for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1])
    with torch.set_grad_enabled(with_grad):
        out_std = n_copy_oracle(q_std, k_std, v_std, cu, scale, window)
    gen = torch.Generator().manual_seed(seed + 7919)
    d_out_std = torch.randn(out_std.shape, generator=gen, dtype=torch.float64).to(device)
    grads_std = torch.autograd.grad(out_std, (q_std, k_std, v_std), d_out_std) if with_grad else ()

    def fold(x):  # sum the copies of each packed token
        return torch.zeros((layout.total_tokens, *x.shape[1:]), dtype=x.dtype, device=x.device).index_add_(
            0, expand, x).cpu()

    with torch.no_grad():
        lse = _lse_oracle(q_std, k_std, cu, scale, window[0])[:, back].cpu()
    return OracleResult(out_std.detach()[back].cpu(), lse, tuple(fold(g) for g in grads_std), fold(d_out_std))


def _rounded_qkv(case: AttentionCase, layout: GroupLayout, dtype: torch.dtype, seed: int):
    """Random packed q, k, v rounded to ``dtype`` and held in float64, so the oracle sees exactly the tested values."""
    return tuple(t.to(dtype).double() for t in random_qkv(layout, case.heads, case.kv_heads, case.head_dim,
                                                          dtype=torch.float64, seed=seed))


# ---------------------------------------------------------------------------------------------- checks
AttentionFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _rows(check, config, backend, dtype, items, note=""):
    rows = []
    for quantity, cmp in items:
        # a NaN/inf in PyTorch's low-precision baseline makes FlashAttention's bound inf (Comparison.passed fails it)
        why = note if math.isfinite(cmp.bound) else "; ".join(
            filter(None, [note, "bound not finite (low-precision baseline NaN/inf)"]))
        rows.append(Row(check, config, quantity, backend, DTYPE_NAMES[dtype], cmp.error, cmp.bound, cmp.metric,
                        cmp.passed, why))
    return rows


def _run_packed(fn: AttentionFn, q, k, v, layout, window, d_out):
    """Run ``fn`` on copies of q, k, v; with ``d_out`` (else forward only, no grad) also return (dq, dk, dv)."""
    q, k, v = (t.detach().clone().requires_grad_(d_out is not None) for t in (q, k, v))
    with torch.set_grad_enabled(d_out is not None):
        out, lse = fn(q, k, v, layout, window_size=window, return_lse=True)
    grads = None
    if d_out is not None:
        grads = torch.autograd.grad(out, (q, k, v), d_out.to(device=out.device, dtype=out.dtype))
    return out.detach(), lse.detach(), grads


def _lse_compare(lse: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> Comparison:
    high = dtype == torch.float64
    return compare(lse.double() if high else lse.float(), ref, dtype=torch.float64 if high else torch.float32)


def shared_prefix_check(case: AttentionCase, *, dtype: torch.dtype = torch.float64, device: str = "cpu",
                        attention_fn: AttentionFn | None = None, backend: str = "dispatch", seed: int = 0,
                        check: str = "shared_prefix", with_grad: bool = True) -> list[Row]:
    """``shared_prefix_attention`` (or ``attention_fn``) vs the N-copy oracle: out, lse[, dq, dk, dv]."""
    fn = attention_fn or shared_prefix_attention
    layout = case.layout
    q, k, v = _rounded_qkv(case, layout, dtype, seed)
    oracle = n_copy_reference(layout, q, k, v, case.window, seed, device=device, with_grad=with_grad)
    cast = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    d_out = oracle.d_out if with_grad else None
    out, lse, grads = _run_packed(fn, cast(q), cast(k), cast(v), layout, case.window, d_out)
    lowp = None
    if dtype not in (torch.float64, torch.float32):
        lowp = _run_packed(n_copy_attention, cast(q), cast(k), cast(v), layout, case.window, d_out)
    items = [("out", compare(out, oracle.out, dtype=dtype, ref_lowp=None if lowp is None else lowp[0])),
             ("lse", _lse_compare(lse, oracle.lse, dtype))]
    floor = cancellation_slack(q, k, v, d_out) if with_grad else 0.0
    for i, name in enumerate(("dq", "dk", "dv") if with_grad else ()):
        items.append((name, compare(grads[i], oracle.grads[i], dtype=dtype, ref_lowp=None if lowp is None else
                                    lowp[2][i], is_grad=True, fp32_floor=floor if name != "dv" else 0.0)))
    return _rows(check, case.name, backend, dtype, items)


Call2Fn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def two_call_check(case: AttentionCase, *, dtype: torch.dtype = torch.float64, device: str = "cpu",
                   call1: Callable | None = None, call2: Call2Fn | None = None, backend: str = "dispatch",
                   seed: int = 0, check: str = "two_call", with_grad: bool = True) -> list[Row]:
    """The paper's API for one group: ``context_attention`` + ``flash_attn_dualkv_varlen_func`` (five inputs) vs the
    N-copy oracle. K_c/V_c get call 1's and call 2's gradients summed by autograd (Eq. 7)."""
    if len(case.prompt_lens) != 1:
        raise ValueError("two_call_check takes single-group cases")
    call1 = call1 or context_attention
    call2 = call2 or flash_attn_dualkv_varlen_func
    layout = case.layout
    p, lens = layout.prompt_lens[0], layout.response_lens[0]
    q, k, v = _rounded_qkv(case, layout, dtype, seed)
    oracle = n_copy_reference(layout, q, k, v, case.window, seed, device=device, with_grad=with_grad)

    qc, kc, vc, qd, kd, vd = (t.detach()[sl].to(device=device, dtype=dtype).requires_grad_(with_grad)
                              for sl in (slice(0, p), slice(p, None)) for t in (q, k, v))
    cu = torch.tensor(layout.response_cu_seqlens(0), dtype=torch.int32, device=device)
    with torch.set_grad_enabled(with_grad):
        out_c = call1(qc, kc, vc, causal=True, window_size=case.window)
        out_d, lse_d = call2(qd, kc, vc, kd, vd, cu, cu, max(lens), p, max(lens), causal=True,
                             window_size=case.window, return_lse=True)
    lowp = None
    if dtype not in (torch.float64, torch.float32):
        lowp = _run_packed(n_copy_attention, *(t.to(device=device, dtype=dtype) for t in (q, k, v)), layout,
                           case.window, oracle.d_out if with_grad else None)
    low_out = None if lowp is None else lowp[0]
    items = [("out_c", compare(out_c, oracle.out[:p], dtype=dtype, ref_lowp=None if low_out is None else low_out[:p])),
             ("out_d", compare(out_d, oracle.out[p:], dtype=dtype, ref_lowp=None if low_out is None else low_out[p:])),
             ("lse_d", _lse_compare(lse_d, oracle.lse[:, p:], dtype))]
    if with_grad:
        d_out = oracle.d_out.to(device=device, dtype=dtype)
        grads = torch.autograd.grad((out_c, out_d), (qc, qd, kc, vc, kd, vd), (d_out[:p], d_out[p:]))
        refs = {"dq_c": oracle.grads[0][:p], "dq_d": oracle.grads[0][p:], "dk_c": oracle.grads[1][:p],
                "dv_c": oracle.grads[2][:p], "dk_d": oracle.grads[1][p:], "dv_d": oracle.grads[2][p:]}
        floor = cancellation_slack(q, k, v, oracle.d_out)
        for i, name in enumerate(refs):
            low = None
            if lowp is not None:
                index = {"dq": 0, "dk": 1, "dv": 2}[name[:2]]
                low = lowp[2][index][:p] if name.endswith("_c") else lowp[2][index][p:]
            items.append((name, compare(grads[i], refs[name], dtype=dtype, ref_lowp=low, is_grad=True,
                                        fp32_floor=floor if name[:2] != "dv" else 0.0)))
    return _rows(check, case.name, backend, dtype, items)
