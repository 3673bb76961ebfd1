"""The paper's full API for ``flash_attn_dualkv_varlen_func``, on the CPU in float64.

* The reference: any L_i <= P + R_i query rows per sequence, aligned bottom-right (query row j of sequence i at
  logical position P + R_i - L_i + j), ``causal=True`` and ``causal=False``, windows — against an independent
  oracle (torch SDPA with an explicit mask), and known-wrong alignments are caught.
* The CUDA path's mapping onto the segment table (:mod:`dualkv.cuda.call2`), head-dim zero-padding, and the
  non-causal (DKV_CAUSAL=0) schedule, run through the kernels' CPU mirrors (forward block schedule and dK/dV key
  tiles) against the reference: outputs, LSE and the K/V gradients.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dualkv
from dualkv.cuda import call2, schedule
from dualkv.cuda.configs import DKDV_TILES, FWD_TILES, kernel_head_dim
from dualkv.cuda.mirror import mirror_dkdv, mirror_forward
from dualkv.reference import context_attention, flash_attn_dualkv_varlen_func, standard_varlen_attention

P = 13
CASES = {                          # (R_i, L_i) per sequence
    "training": ((5, 1, 9), (5, 1, 9)),
    "prompt_rows": ((5, 1, 9), (5 + P, 1 + 4, 9 + 2)),   # prompt tails of different lengths with the responses
    "same_prompt_rows": ((5, 1, 9), (5 + 3, 1 + 3, 9 + 3)),
    "fewer_rows": ((5, 1, 9), (2, 1, 0)),
    "mixed": ((6, 2, 0, 9), (6 + P, 1, 4, 9)),
}


def _inputs(r, l, h=4, hk=2, d=8, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    make = lambda n, heads: torch.randn(n, heads, d, generator=gen, dtype=torch.float64).to(dtype)  # noqa: E731
    cu_q = torch.tensor([0, *np.cumsum(l)], dtype=torch.int32)
    cu_k = torch.tensor([0, *np.cumsum(r)], dtype=torch.int32)
    return dict(q=make(sum(l), h), k_context=make(P, hk), v_context=make(P, hk), k_decoded=make(sum(r), hk),
                v_decoded=make(sum(r), hk), cu_seqlens_q=cu_q, cu_seqlens_k_decoded=cu_k, max_seqlen_q=max(l),
                context_seqlen=P, max_seqlen_k_decoded=max(r))


def _oracle(a, causal, window, scale, align="bottom_right"):
    """Per sequence with torch SDPA and an explicit boolean mask over [context; decoded] (no dualkv code)."""
    q, cu_q, cu_k = a["q"], a["cu_seqlens_q"].tolist(), a["cu_seqlens_k_decoded"].tolist()
    outs = []
    for i in range(len(cu_q) - 1):
        lq, lk = cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]
        k = torch.cat([a["k_context"], a["k_decoded"][cu_k[i]:cu_k[i + 1]]])
        v = torch.cat([a["v_context"], a["v_decoded"][cu_k[i]:cu_k[i + 1]]])
        first = P + lk - lq if align == "bottom_right" else P
        qi, kj = torch.arange(first, first + lq)[:, None], torch.arange(P + lk)[None, :]
        mask = torch.ones(lq, P + lk, dtype=torch.bool)
        if causal:
            mask &= kj <= qi
        if window[0] >= 0:
            mask &= kj >= qi - window[0]
        if window[1] >= 0:
            mask &= kj <= qi + window[1]
        rows = q[cu_q[i]:cu_q[i + 1]].transpose(0, 1)
        out = F.scaled_dot_product_attention(rows, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                             scale=scale, enable_gqa=True)
        outs.append(out.transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (True, (4, -1)), (False, (-1, -1)), (False, (3, 2)),
                                           (False, (-1, 0))])
def test_reference_matches_an_independent_oracle(case, causal, window):
    a = _inputs(*CASES[case])
    got = flash_attn_dualkv_varlen_func(**a, causal=causal, window_size=window, softmax_scale=0.4)
    expect_window = (window[0], 0) if causal else window
    assert (got - _oracle(a, causal, expect_window, 0.4)).abs().max().item() < 1e-12


def test_prompt_rows_with_the_response_rows_equal_standard_causal_attention():
    """The paper's use: L_i = P + R_i rows (the whole row) give plain causal attention of [prompt; response_i]."""
    r = (5, 1, 9)
    a = _inputs(r, tuple(P + x for x in r))
    full_k = torch.cat([torch.cat([a["k_context"], a["k_decoded"][s:e]]) for s, e in
                        zip(a["cu_seqlens_k_decoded"][:-1].tolist(), a["cu_seqlens_k_decoded"][1:].tolist())])
    full_v = torch.cat([torch.cat([a["v_context"], a["v_decoded"][s:e]]) for s, e in
                        zip(a["cu_seqlens_k_decoded"][:-1].tolist(), a["cu_seqlens_k_decoded"][1:].tolist())])
    cu = a["cu_seqlens_q"]
    ref = standard_varlen_attention(a["q"], full_k, full_v, cu, cu, P + 9, P + 9)
    assert (flash_attn_dualkv_varlen_func(**a) - ref).abs().max().item() < 1e-12


def test_a_wrong_alignment_is_caught():
    """Known-wrong variant: rows aligned at the first decoded position (top-left, what L_i = R_i alone suggests)
    instead of bottom-right; the oracle tells them apart."""
    a = _inputs(*CASES["prompt_rows"])
    got = flash_attn_dualkv_varlen_func(**a)
    assert (got - _oracle(a, True, (-1, 0), 1 / math.sqrt(8))).abs().max().item() < 1e-12
    assert (got - _oracle(a, True, (-1, 0), 1 / math.sqrt(8), align="top_left")).abs().max().item() > 1e-2


def test_context_attention_without_causal_mask():
    x = torch.randn(11, 2, 8, dtype=torch.float64)
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    got = context_attention(x, x, x, cu, 7, causal=False)
    for s, e in ((0, 4), (4, 11)):
        rows = x[s:e].transpose(0, 1)
        ref = F.scaled_dot_product_attention(rows, rows, rows).transpose(0, 1)
        assert (got[s:e] - ref).abs().max().item() < 1e-12


def test_more_rows_than_keys_are_refused():
    a = _inputs((2, 3), (2 + P + 1, 3))
    with pytest.raises(ValueError, match=f"sequence 0 has {P + 3} query rows but only {P} \\+ 2 keys"):
        flash_attn_dualkv_varlen_func(**a)


def test_the_paper_default_differs_and_is_explicit():
    """dualkv keeps causal=True as its default (training); the paper's default is causal=False: both are reachable,
    and they differ."""
    import inspect

    assert inspect.signature(dualkv.flash_attn_dualkv_varlen_func).parameters["causal"].default is True
    a = _inputs(*CASES["training"])
    assert (flash_attn_dualkv_varlen_func(**a) - flash_attn_dualkv_varlen_func(**a, causal=False)).abs().max() > 1e-2


# ---- the CUDA path's mapping and schedules, on the CPU ---------------------------------------------------------
def _cuda_path_on_cpu(a, causal, window_left, head_dim, with_grad=True, mapping=None):
    """map_call2 -> gather_inputs -> zero-pad to the kernel head dim -> the kernels' forward and dK/dV schedules
    (CPU mirrors) -> the caller's rows. Returns out, lse, a random d_out and the K/V gradients (context and
    decoded) it gives, carried back through the padding and the gather by autograd. (dQ runs the forward's
    query-tile schedule, which the forward mirror covers.)"""
    cu_q, cu_k = a["cu_seqlens_q"].tolist(), a["cu_seqlens_k_decoded"].tolist()
    m = mapping or call2.map_call2(cu_q, cu_k, P)
    leaves = [a[n].detach().clone().requires_grad_() for n in ("q", "k_context", "v_context", "k_decoded",
                                                                 "v_decoded")]
    padded = kernel_head_dim(head_dim)
    ext = [F.pad(t, (0, padded - head_dim)) for t in call2.gather_inputs(m, *leaves)]
    scale = head_dim ** -0.5
    out_e, lse_e, _, _ = mirror_forward(*ext, m.segments, FWD_TILES[padded], scale=scale, window_left=window_left,
                                        causal=causal)
    out, lse = call2.scatter_outputs(m, out_e, lse_e)
    if not with_grad:
        return out[..., :head_dim], lse
    d_out = torch.randn(out.shape[0], out.shape[1], head_dim, dtype=torch.float64)
    d_out_e = torch.zeros_like(out_e)
    index = torch.arange(out_e.shape[0]) if m.out_index is None else torch.from_numpy(m.out_index)
    d_out_e[index, :, :head_dim] = d_out
    dk_own, dv_own, dk_ctx, dv_ctx, writes = mirror_dkdv(*ext, d_out_e, out_e, lse_e, m.segments,
                                                         block_keys=DKDV_TILES[padded].block_keys, ctx_shared=False,
                                                         scale=scale, window_left=window_left, causal=causal)
    assert (writes == 1).all(), "every own and context row is written by exactly one key tile"
    grads = torch.autograd.grad(ext[1:], leaves[1:], (dk_ctx, dv_ctx, dk_own, dv_own), allow_unused=True)
    return out[..., :head_dim], lse, d_out, grads


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("causal,window_left", [(True, -1), (True, 6), (False, -1)])
@pytest.mark.parametrize("head_dim", [32, 40])
def test_cuda_mapping_through_the_kernel_mirrors(case, causal, window_left, head_dim):
    a = _inputs(*CASES[case], d=head_dim, seed=1)
    out, lse, d_out, grads = _cuda_path_on_cpu(a, causal, window_left, head_dim)
    leaves = {n: a[n].clone().requires_grad_() for n in ("q", "k_context", "v_context", "k_decoded", "v_decoded")}
    ref, ref_lse = flash_attn_dualkv_varlen_func(**{**a, **leaves}, causal=causal, window_size=(window_left, -1),
                                                 return_lse=True)
    assert (out - ref).abs().max().item() < 1e-12 and (lse - ref_lse).abs().max().item() < 1e-12
    ref_grads = torch.autograd.grad(ref, [leaves[n] for n in ("k_context", "v_context", "k_decoded", "v_decoded")],
                                    d_out)
    for name, g, r in zip(("dk_context", "dv_context", "dk_decoded", "dv_decoded"), grads, ref_grads):
        g = torch.zeros_like(r) if g is None else g
        assert (g - r).abs().max().item() < 1e-12, name


def test_distinct_context_lengths_read_separate_copies():
    """Sequences passing different numbers of prompt rows read context runs of different lengths; one shared run
    would have two key tiles write the same context rows (the known-wrong map is caught by the dK/dV mirror)."""
    a = _inputs(*CASES["prompt_rows"])
    m = call2.map_call2(a["cu_seqlens_q"].tolist(), a["cu_seqlens_k_decoded"].tolist(), P)
    assert m.context_lens == (P - 2, P - 4) and sorted(set(m.segments[:, 3].tolist())) == [0, P - 4, P - 2]
    same = call2.map_call2(*(a[n].tolist() for n in ("cu_seqlens_q", "cu_seqlens_k_decoded")), P)
    wrong = call2.Call2Map(np.stack([same.segments[:, 0], same.segments[:, 1], 0 * same.segments[:, 2],
                                     same.segments[:, 3]], 1).astype(np.int32), same.own_index, same.query_index,
                           same.out_index, (P,))
    with pytest.raises(AssertionError, match="exactly one key tile"):
        _cuda_path_on_cpu(a, True, -1, 8, mapping=wrong)
    one = call2.map_call2(*(_inputs(*CASES["same_prompt_rows"])[n].tolist()
                            for n in ("cu_seqlens_q", "cu_seqlens_k_decoded")), P)
    assert one.context_lens == (P - 3,) and set(one.segments[:, 3].tolist()) == {P - 3}   # rows 0..P-4 in place


def test_training_shape_maps_to_the_inputs_as_they_are():
    m = call2.map_call2([0, 5, 6, 15], [0, 5, 6, 15], P)
    assert m.own_index is None and m.query_index is None and m.out_index is None
    assert m.segments.tolist() == schedule.segments_from_cu_seqlens([0, 5, 6, 15], P).tolist()


def test_fewer_rows_than_keys_pad_zero_query_rows_in_front():
    m = call2.map_call2([0, 2, 3], [0, 5, 1], P)         # L = (2, 1), R = (5, 1)
    assert m.segments[:, 1].tolist() == [5, 1] and m.query_index.tolist() == [-1, -1, -1, 0, 1, 2]
    assert m.out_index.tolist() == [3, 4, 5]


@pytest.mark.parametrize("head_dim", [8, 80, 136, 256, 264])
def test_head_dims_pad_to_the_next_kernel_head_dim(head_dim):
    padded = kernel_head_dim(head_dim)
    assert padded >= head_dim and padded in FWD_TILES
    a = _inputs((4, 7), (4, 7 + 2), d=head_dim, seed=3)
    out, lse = _cuda_path_on_cpu(a, True, -1, head_dim, with_grad=False)
    ref, ref_lse = flash_attn_dualkv_varlen_func(**a, return_lse=True)
    assert (out - ref).abs().max().item() < 1e-12 and (lse - ref_lse).abs().max().item() < 1e-12


@pytest.mark.parametrize("head_dim", [0, 12, 100, 520])
def test_head_dims_the_kernels_cannot_serve_are_refused(head_dim):
    with pytest.raises(ValueError, match=f"head_dim {head_dim} is not supported by the CUDA kernels: it must be a "
                                         "multiple of 8 up to 512"):
        kernel_head_dim(head_dim)


def test_non_causal_key_ranges_cover_every_own_key():
    """The non-causal schedule visits all own blocks of a segment from every query tile; the vectorised ranges
    agree with the scalar ones."""
    layout = dualkv.GroupLayout.from_lengths([70], [[130, 3]])
    for s, m, *ranges in schedule.tile_ranges(layout.segment_table, 32, 64, -1, causal=False).tolist():
        q_len, ctx_len = layout.segment_table[s, 1], layout.segment_table[s, 3]
        lo = m * 32
        assert tuple(ranges) == schedule.key_range(q_len, ctx_len, lo, min(q_len, lo + 32) - 1, 64, -1, False)
        assert ranges[:2] == [0, (q_len + 63) // 64]
