"""The atomic dQ mode's fragment-order accumulator (dualkv/cuda/dq_layout.py): one-to-one, the kernel's lane
addresses land where the layout says and make one run of 32 floats per add instruction on slabs that start a token
group, the scratch block holds every redirected add, the kernel and the cast spell the layout as the model does; and
on a GPU the cast kernel reads it back exactly."""

import numpy as np
import pytest
import torch

from dualkv.cuda.dq_layout import (SCRATCH_PER_HEAD_DIM, acc_rows, frag_offset, from_rows, kernel_lane_offset,
                                   new_frag_acc, to_rows)

HEAD_DIMS = (32, 64, 96, 128)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("tokens", [1, 7, 8, 13, 64, 129])
def test_layout_is_one_to_one(head_dim, tokens):
    offsets = frag_offset(np.arange(acc_rows(tokens))[:, None], np.arange(head_dim)[None, :], head_dim)
    assert sorted(offsets.ravel().tolist()) == list(range(acc_rows(tokens) * head_dim))


def _lane_offsets(slab_tok: int, nt: int, e: int, dq_part: int, dq_cols: int, head_dim: int) -> list[int]:
    return [kernel_lane_offset(slab_tok, lane // 4, lane % 4, nt, e, dq_part, dq_cols, head_dim) for lane in range(32)]


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("slab_tok", [0, 8, 16, 3, 65, 127])
def test_kernel_lanes_add_where_the_layout_says(head_dim, slab_tok):
    """Lane (g, t4)'s register (nt, e) holds row g + 8 (e / 2), column 8 nt + 2 t4 + e % 2 of its part's slab (the
    m16n8 accumulator); the kernel's address for it is the layout's. On a slab starting a token group an add
    instruction covers 32 consecutive floats; otherwise two runs."""
    dq_cols = head_dim // 2  # bwd_dkdv.cu's dQ warp layout at 8 warps and 64-query steps: 4 slabs x 2 column parts
    for dq_part in range(2):
        for nt in range(dq_cols // 8):
            for e in range(4):
                got = _lane_offsets(slab_tok, nt, e, dq_part, dq_cols, head_dim)
                want = [int(frag_offset(slab_tok + lane // 4 + 8 * (e >> 1),
                                        dq_part * dq_cols + nt * 8 + 2 * (lane % 4) + (e & 1), head_dim))
                        for lane in range(32)]
                assert got == want
                runs = 1 + sum(b != a + 1 for a, b in zip(got, got[1:]))
                assert runs == (1 if slab_tok % 8 == 0 else 2)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_scratch_holds_every_redirected_add(head_dim):
    """A slab's rows past its step's last query add at scratch + nt * 64 + (e % 2) * 32 (their pointer is the
    scratch block itself): below the block's size for every register of every column part."""
    dq_cols = head_dim // 2
    top = max(nt * 64 + (e & 1) * 32 for nt in range(dq_cols // 8) for e in range(4))
    assert top < SCRATCH_PER_HEAD_DIM * head_dim
    acc = new_frag_acc(13, 3, head_dim, "cpu")
    assert acc.shape == (3, 16, head_dim) and acc.untyped_storage().nbytes() == (acc.numel() + 8 * head_dim) * 4


def test_round_trip_and_a_wrong_reader_is_caught():
    rows = torch.randn(13, 3, 64, dtype=torch.float64)
    acc = from_rows(rows)
    assert acc.shape == (3, 16, 64) and torch.equal(to_rows(acc, 13), rows)
    assert int((acc != 0).sum()) == rows.numel()  # the padding group's last 3 rows hold nothing
    wrong = acc.reshape(3, -1).clone()
    wrong = wrong.view(3, -1, 2, 32).flip(2).reshape(acc.shape)  # even and odd columns swapped
    assert not torch.equal(to_rows(wrong, 13), rows)


def test_kernel_and_cast_spell_the_model():
    from dualkv.cuda.build import CSRC

    kernel, cast = (CSRC / "bwd_dkdv.cu").read_text(), (CSRC / "bwd_dq_frag_cast.cu").read_text()
    assert ("(tok >> 3) * (8 * kHeadDim) + (tok & 7) * 4 + t4 +\n                                 dq_part * kDqCols * 8"
            in kernel)
    assert "lane_lo + 8 * kHeadDim" in kernel and "+ nt * 64 + (e & 1) * 32, acc_dq[0][nt][e]" in kernel
    assert "(t >> 3) * (8 * kHeadDim) + 64 * c + 4 * r8" in cast and "src + 32" in cast


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
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
