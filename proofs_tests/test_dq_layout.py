"""The fragment-order dQ accumulator of the atomic and ordered dQ modes (dualkv/cuda/dq_layout.py): one-to-one; the kernel's lane
addresses (modelled as the kernel spells them, the warp layout taken from the dK/dV tiles) land where the layout says,
make one run of 32 floats per add instruction on slabs that start a token group, and on whole steps of segments that
start anywhere put every existing row exactly once where the cast reads it, the rows past a segment (zeros) on later
rows or the tail rows and nothing out of bounds; the kernel and the cast spell the layout as the model does; and on a
GPU the cast kernel reads it back exactly."""

import re

import numpy as np
import pytest
import torch

from dualkv.cuda.configs import ATOMIC_HEAD_DIMS, DKDV_TILES
from dualkv.cuda.dq_layout import TAIL_ROWS, acc_rows, frag_offset, from_rows, kernel_add_offset, new_frag_acc, to_rows


def _dq_warps(head_dim: int) -> tuple[int, int, int]:
    """bwd_dkdv.cu's dQ warp layout at this head dim's tile: (row slabs, column parts, columns per part)."""
    tile = DKDV_TILES[head_dim]
    slabs = tile.block_m // 16
    parts = tile.warps // slabs
    return slabs, parts, head_dim // parts


@pytest.mark.parametrize("head_dim", ATOMIC_HEAD_DIMS)
@pytest.mark.parametrize("tokens", [1, 7, 8, 13, 64, 129])
def test_layout_is_one_to_one(head_dim, tokens):
    offsets = frag_offset(np.arange(acc_rows(tokens))[:, None], np.arange(head_dim)[None, :], head_dim)
    assert sorted(offsets.ravel().tolist()) == list(range(acc_rows(tokens) * head_dim))


@pytest.mark.parametrize("head_dim", ATOMIC_HEAD_DIMS)
@pytest.mark.parametrize("slab_tok", [0, 8, 16, 3, 65, 127])
def test_kernel_lanes_add_where_the_layout_says(head_dim, slab_tok):
    """Lane (g, t4)'s register (nt, e) holds row g + 8 (e / 2), column 8 nt + 2 t4 + e % 2 of its part's slab (the
    m16n8 accumulator); the kernel's address for it is the layout's. On a slab starting a token group an add
    instruction covers 32 consecutive floats; otherwise two runs."""
    _, parts, dq_cols = _dq_warps(head_dim)
    for dq_part in range(parts):
        for nt in range(dq_cols // 8):
            for e in range(4):
                got = [kernel_add_offset(slab_tok, lane // 4, lane % 4, nt, e, dq_part, dq_cols, head_dim)
                       for lane in range(32)]
                want = [int(frag_offset(slab_tok + lane // 4 + 8 * (e >> 1),
                                        dq_part * dq_cols + nt * 8 + 2 * (lane % 4) + (e & 1), head_dim))
                        for lane in range(32)]
                assert got == want
                runs = 1 + sum(b != a + 1 for a, b in zip(got, got[1:]))
                assert runs == (1 if slab_tok % 8 == 0 else 2)


def _simulate_steps(head_dim: int, seg_lens: list[int], heads: int, past_rows_value: float = 0.0) -> np.ndarray:
    """Every query step (block_m rows from each segment's start, segments back to back at any token) of every head
    adds each (token, head, column)'s id through the kernel's addresses into a float64 model of the allocation
    (accumulator + tail rows); rows past the step's last query add ``past_rows_value`` (the kernel's: a zero).
    Returns it."""
    slabs, parts, dq_cols = _dq_warps(head_dim)
    block_m = DKDV_TILES[head_dim].block_m
    tokens = sum(seg_lens)
    head_stride = acc_rows(tokens) * head_dim
    flat = np.zeros(heads * head_stride + TAIL_ROWS * head_dim)
    q_start = 0
    for seg_len in seg_lens:
        for pos in range(0, seg_len, block_m):
            p_hi = seg_len - 1  # the step's last existing query
            for head in range(heads):
                for warp in range(slabs * parts):
                    dq_slab, dq_part = warp % slabs, warp // slabs
                    slab_tok = q_start + pos + dq_slab * 16
                    valid = p_hi - pos - dq_slab * 16 + 1
                    for lane in range(32):
                        g, t4 = lane // 4, lane % 4
                        for nt in range(dq_cols // 8):
                            for e in range(4):
                                row = g + 8 * (e >> 1)
                                col = dq_part * dq_cols + nt * 8 + 2 * t4 + (e & 1)
                                value = ((slab_tok + row) * heads + head) * head_dim + col + 1 if row < valid \
                                    else past_rows_value
                                off = kernel_add_offset(slab_tok, g, t4, nt, e, dq_part, dq_cols, head_dim, head,
                                                        head_stride)
                                assert 0 <= off < flat.size
                                flat[off] += value
        q_start += seg_len
    return flat


@pytest.mark.parametrize("head_dim", ATOMIC_HEAD_DIMS)
def test_whole_steps_put_every_row_once(head_dim):
    """Segments of awkward lengths back to back (the last one ending in a partial step, one of a single token): every
    existing row lands once where the cast reads it, and the adds of rows past a segment, zeros, stay inside the
    allocation (the next segment's rows, the next head's, or the tail rows). Known wrong: if those rows added anything
    but zero, the next segment's rows would change."""
    seg_lens, heads = [13, 70, 1, 129], 2
    tokens = sum(seg_lens)
    ids = torch.arange(tokens * heads * head_dim, dtype=torch.float64).view(tokens, heads, head_dim) + 1

    def rows_of(flat):
        acc = torch.from_numpy(flat[:heads * acc_rows(tokens) * head_dim]).view(heads, acc_rows(tokens), head_dim)
        return acc, to_rows(acc, tokens)

    acc, got = rows_of(_simulate_steps(head_dim, seg_lens, heads))
    assert torch.equal(got, ids)
    assert int((acc != 0).sum()) == ids.numel()  # the padding rows of the last token group hold nothing
    assert not torch.equal(rows_of(_simulate_steps(head_dim, seg_lens, heads, past_rows_value=1.0))[1], ids)


@pytest.mark.parametrize("head_dim", ATOMIC_HEAD_DIMS)
def test_tail_rows_hold_every_add_past_the_last_token(head_dim):
    """A step that starts at the last token adds its other 63 rows behind the last head's block: inside the tail rows
    for every register of every column part and lane, whatever the token count's remainder modulo 8."""
    _, parts, dq_cols = _dq_warps(head_dim)
    for tokens in (1, 7, 8, 13):
        heads = 3
        stride = acc_rows(tokens) * head_dim
        step = DKDV_TILES[head_dim].block_m
        offsets = [kernel_add_offset(tokens - 1 + slab * 16, lane // 4, lane % 4, nt, e, dq_part, dq_cols, head_dim,
                                     heads - 1, stride)
                   for slab in range(step // 16) for dq_part in range(parts) for nt in range(dq_cols // 8)
                   for e in range(4) for lane in range(32)]
        assert max(offsets) < (heads * acc_rows(tokens) + TAIL_ROWS) * head_dim
    acc = new_frag_acc(13, 3, head_dim, "cpu")
    assert acc.shape == (3, 16, head_dim)
    assert acc.untyped_storage().nbytes() == (acc.numel() + TAIL_ROWS * head_dim) * 4
    # a tile with a longer query step (a dkdv_tile override) gets the rows its step can add past the last token
    assert new_frag_acc(13, 3, head_dim, "cpu", step_rows=100).untyped_storage().nbytes() == \
        (acc.numel() + 104 * head_dim) * 4


def _one_scratch_offset(slab_tok, valid_rows, g, t4, nt, e, dq_part, dq_cols, head_dim):
    """Known wrong (what the kernel did before): rows past the step's last query, every lane at one address."""
    if g + 8 * (e >> 1) < valid_rows:
        return kernel_add_offset(slab_tok, g, t4, nt, e, dq_part, dq_cols, head_dim)
    return nt * 64 + (e & 1) * 32


@pytest.mark.parametrize("head_dim", ATOMIC_HEAD_DIMS)
@pytest.mark.parametrize("spelling", ["kernel", "one scratch"])
def test_adds_past_a_segment_do_not_share_an_address(head_dim, spelling):
    """The adds of a slab's missing rows (every response of a ragged micro-batch ends in some) must not serialize:
    within an add instruction the 32 lanes hit 32 distinct floats, one run when the slab starts a token group. The
    earlier spelling, every such lane at one scratch address, is caught."""
    _, parts, dq_cols = _dq_warps(head_dim)
    distinct = []
    for slab_tok in (0, 3):
        for nt, e in ((0, 0), (dq_cols // 8 - 1, 3)):
            for dq_part in range(parts):
                if spelling == "kernel":
                    lanes = [kernel_add_offset(slab_tok, lane // 4, lane % 4, nt, e, dq_part, dq_cols, head_dim)
                             for lane in range(32)]
                else:
                    lanes = [_one_scratch_offset(slab_tok, 0, lane // 4, lane % 4, nt, e, dq_part, dq_cols, head_dim)
                             for lane in range(32)]
                distinct.append(len(set(lanes)) == 32)
                if slab_tok == 0 and spelling == "kernel":
                    assert sorted(lanes) == list(range(min(lanes), min(lanes) + 32))
    assert all(distinct) == (spelling == "kernel")


def test_round_trip_and_a_wrong_reader_is_caught():
    rows = torch.randn(13, 3, 64, dtype=torch.float64)
    acc = from_rows(rows)
    assert acc.shape == (3, 16, 64) and torch.equal(to_rows(acc, 13), rows)
    assert int((acc != 0).sum()) == rows.numel()  # the padding group's last 3 rows hold nothing
    wrong = acc.reshape(3, -1, 2, 32).flip(2).reshape(acc.shape)  # even and odd columns swapped
    assert not torch.equal(to_rows(wrong, 13), rows)


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_rows_past_a_step_are_zero_where_the_kernel_relies_on_it():
    """bwd_dkdv.cu adds a step's rows past its last query in place (not into scratch), which is exact only because
    those rows contribute +-0: their Q and dO rows are zero-filled (cp.async with a source size of 0) and their LSE is
    infinite and D zero (P = 0, dS = 0). The sources must keep saying so."""
    from dualkv.cuda.build import CSRC

    common, keywalk = (_squash((CSRC / name).read_text()) for name in ("common.cuh", "keywalk.cuh"))
    assert "const int src_bytes = valid ? 16 : 0;" in common
    assert "const bool ok = r0 + i * kRowsPerPass < count; cp_async_16(dst + i * kDstStep, ok ? src : any_valid, ok);" \
        in common
    assert "return r < count ? first + r * row_stride : nullptr;" in common
    assert "const int n = min(kStep, c.p_hi + 1 - c.pos);" in keywalk
    for staged in ("if (r >= n) { sLse[r] = kInf; sDelta[r] = 0.f; } else {",):
        assert keywalk.count(staged) == 2, staged  # both ways of staging LSE / D (one row per thread, strided loop)
    for call in ("load_strided_rows<kStep, kSwizzle>(sQ, q + tok0 * q_st + head * q_sh, q_st, n, q);",
                 "load_strided_rows<kStep, kSwizzle>(sdO, dout + tok0 * do_st + head * do_sh, do_st, n, q);"):
        assert call in keywalk, call


def test_kernel_and_cast_spell_the_model():
    """The kernel's and the cast's index expressions are the model's (whitespace aside)."""
    from dualkv.cuda.build import CSRC

    kernel, cast = (_squash((CSRC / name).read_text()) for name in ("bwd_dkdv.cu", "bwd_dq_frag_cast.cu"))
    for expr in ("float* lane_lo = dq_acc + head * dqa_sh + (tok >> 3) * (8 * kHeadDim) + (tok & 7) * 4 + t4 + "
                 "dq_part * kDqCols * 8;",
                 "float* at = lane_lo + (e >> 1) * 8 * kHeadDim + nt * 64 + (e & 1) * 32;",
                 "red_add(at, acc_dq[sl][nt][e]);", "atomicAdd(at, acc_dq[sl][nt][e]);",
                 "const int slab = dq_rw * kDqSlabs + sl;",
                 "const long long tok = sg.seg.q_start + cur.pos + slab * 16 + g;"):
        assert expr in kernel, expr
    assert "scratch" not in kernel.split("const int slab = dq_rw * kDqSlabs + sl;")[1].split("cur = nxt;")[0]
    for expr in ("const float* src = acc + h * acc_sh + (t >> 3) * (8 * kHeadDim) + 64 * c + 4 * r8;",
                 "const float4 odd = *reinterpret_cast<const float4*>(src + 32);",
                 "make_uint4(pack2(even.x * scale, odd.x * scale), pack2(even.y * scale, odd.y * scale), "
                 "pack2(even.z * scale, odd.z * scale), pack2(even.w * scale, odd.w * scale));"):
        assert expr in cast, expr


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", ATOMIC_HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("tokens", [1, 13, 64, 1000])
def test_cast_kernel_reads_the_layout_back(head_dim, dtype, tokens):
    """bwd_dq_frag_cast.cu: dq = scale * rows in 16 bits, bit for bit what PyTorch's rounding of the same fp32
    products gives, on a poisoned output with a token stride that is not the packed one."""
    from dualkv.cuda.launch import _cast_dq_frag

    torch.manual_seed(tokens + head_dim)
    rows = torch.randn(tokens, 5, head_dim, device="cuda")
    acc = new_frag_acc(tokens, 5, head_dim, "cuda")
    acc.copy_(from_rows(rows))
    out = torch.full((tokens, 6, head_dim), float("nan"), dtype=dtype, device="cuda")[:, 1:]
    _cast_dq_frag(acc, out, 0.125)
    torch.testing.assert_close(out, (rows * 0.125).to(dtype), rtol=0, atol=0)


def test_frag_cast_refuses_head_dims_without_an_atomic_mode():
    from dualkv.cuda.configs import dq_frag_cast_spec

    assert dq_frag_cast_spec(128, torch.bfloat16, "sm_80").kernel == "bwd_dq_frag_cast"
    for head_dim in (192, 256, 512):
        with pytest.raises(ValueError, match=f"atomic dQ mode exists at head dims .* not {head_dim}"):
            dq_frag_cast_spec(head_dim, torch.bfloat16, "sm_80")
    with pytest.raises(ValueError, match="not supported by the CUDA kernels"):
        dq_frag_cast_spec(80, torch.bfloat16, "sm_80")
