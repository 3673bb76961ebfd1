"""The kernels' block schedule, mirrored on the CPU (numba), equals the reference — and schedule bugs are caught."""

import random

import pytest
import torch

from dualkv import GroupLayout
from dualkv.cuda import schedule
from dualkv.cuda.configs import FWD_TILES, SM90_FWD_TILES, SM90_WS_FWD_TILES, TileConfig
from dualkv.cuda.mirror import make_mirror, mirror_forward
from dualkv.reference import context_attention, flash_attn_dualkv_varlen_func, shared_prefix_attention


def _qkv(layout, h, hk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = layout.total_tokens
    return (torch.randn(t, h, d, generator=g, dtype=torch.float64), torch.randn(t, hk, d, generator=g, dtype=torch.float64),
            torch.randn(t, hk, d, generator=g, dtype=torch.float64))


def _mirror_error(layout, h, hk, d, window, tile, pack=None, mirror=None, seed=0):
    q, k, v = _qkv(layout, h, hk, d, seed)
    out, lse, visits, _ = mirror_forward(q, k, v, k, v, layout.segment_table, tile, scale=d ** -0.5,
                                         window_left=window, pack=pack, mirror=mirror)
    ref, ref_lse = shared_prefix_attention(q, k, v, layout, window_size=(window, 0), return_lse=True)
    return max((out - ref).abs().max().item(), (lse - ref_lse).abs().max().item()), visits


@pytest.mark.parametrize("head_dim", sorted(FWD_TILES))
def test_mirror_matches_reference_for_every_head_dim(head_dim):
    layout = GroupLayout.from_lengths([65, 2], [[63, 1, 129], [70]])
    err, _ = _mirror_error(layout, 4, 2, head_dim, -1, FWD_TILES[head_dim])
    assert err < 1e-12


@pytest.mark.parametrize("head_dim", sorted(SM90_FWD_TILES))
@pytest.mark.parametrize("window", [-1, 100])
def test_mirror_of_the_hopper_forward_tiles(head_dim, window):
    """The wgmma forward's schedule (128-key blocks, 128 query rows): partial blocks on both sides of 128."""
    layout = GroupLayout.from_lengths([129, 127, 1], [[1, 127, 128, 257], [129], [64, 2]])
    err, _ = _mirror_error(layout, 8, 2, head_dim, window, SM90_FWD_TILES[head_dim], pack=4)
    assert err < 1e-12


@pytest.mark.parametrize("head_dim", sorted(SM90_WS_FWD_TILES))
@pytest.mark.parametrize("window", [-1, 100])
def test_mirror_of_the_warp_specialised_forward_tiles(head_dim, window):
    """The warp-specialised forward's schedule at its own key blocks (192 keys at head dim 64, 128 at 96 and 128, 112 at
    192, 80 at 256): prompts and responses with partial blocks on both sides of 64, 80, 112, 128 and 192 keys."""
    tile = SM90_WS_FWD_TILES[head_dim]
    layout = GroupLayout.from_lengths([193, 191, 1], [[1, 79, 113, 192, 385], [129], [64, 2]])
    err, _ = _mirror_error(layout, 8, 2, head_dim, window, tile, pack=4)
    assert err < 1e-12


@pytest.mark.parametrize("seed", range(6))
def test_mirror_random_layouts_windows_and_packs(seed):
    rng = random.Random(seed)
    lens = (1, 2, 31, 32, 33, 63, 64, 65, 127, 129, 200)
    layout = GroupLayout.from_lengths([rng.choice(lens) for _ in range(2)],
                                      [[rng.choice(lens) for _ in range(rng.randint(1, 3))] for _ in range(2)])
    window = rng.choice([-1, 0, 7, 64, 150, 1000])
    tile = rng.choice([FWD_TILES[64], TileConfig(32, 4, 1), TileConfig(64, 8, 1)])
    pack = rng.choice([1, 2, 4])
    err, _ = _mirror_error(layout, 8, 2, 32, window, tile, pack=pack, seed=seed)
    assert err < 1e-12


def test_mirror_through_the_paper_api_segments():
    q, k, v = _qkv(GroupLayout.single(1, [96]), 4, 1, 32)  # 97 tokens: 7 context + 90 decoded
    ctx_len, lens = 7, [50, 1, 39]
    cu = [0, 50, 51, 90]
    out, lse, _, _ = mirror_forward(q[ctx_len:], k[:ctx_len], v[:ctx_len], k[ctx_len:], v[ctx_len:],
                                    schedule.segments_from_cu_seqlens(cu, ctx_len), FWD_TILES[32], scale=0.3)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    ref = flash_attn_dualkv_varlen_func(q[ctx_len:], k[:ctx_len], v[:ctx_len], k[ctx_len:], v[ctx_len:], cu_t, cu_t,
                                        50, ctx_len, 50, softmax_scale=0.3)
    assert (out - ref).abs().max() < 1e-12


def test_window_skips_blocks():
    layout = GroupLayout.single(1024, [256, 256])
    _, full = _mirror_error(layout, 1, 1, 32, -1, FWD_TILES[32])
    _, windowed = _mirror_error(layout, 1, 1, 32, 64, FWD_TILES[32])
    assert windowed.sum() < full.sum() / 4


def test_vectorised_ranges_equal_scalar_key_range():
    rng = random.Random(1)
    for _ in range(50):
        layout = GroupLayout.from_lengths([rng.randint(1, 300)], [[rng.randint(1, 300) for _ in range(3)]])
        ppt, bn, w = rng.choice([8, 32, 128]), rng.choice([32, 64]), rng.choice([-1, 0, 9, 200])
        for s, m, *rng_vals in schedule.tile_ranges(layout.segment_table, ppt, bn, w).tolist():
            q_len, ctx_len = layout.segment_table[s, 1], layout.segment_table[s, 3]
            lo = m * ppt
            assert tuple(rng_vals) == schedule.key_range(q_len, ctx_len, lo, min(q_len, lo + ppt) - 1, bn, w)


def test_tiles_heaviest_first_and_complete():
    layout = GroupLayout.from_lengths([300, 5], [[100, 100, 40], [9]])
    tiles = schedule.tile_table(layout.segment_table, 32, 64)
    ranges = schedule.tile_ranges(layout.segment_table, 32, 64)
    work = {(s, m): (oe - of) + (ce - cf) for s, m, of, oe, cf, ce in ranges.tolist()}
    ordered = [work[tuple(t)] for t in tiles.tolist()]
    assert ordered == sorted(ordered, reverse=True)
    assert sorted(map(tuple, tiles.tolist())) == sorted(work)


# ---- known-wrong schedules: each must make the mirror disagree with the reference -------------------------------
def _wrong_own_end(q_len, ctx_len, pos_lo, pos_hi, block_n, window_left, causal=True):
    """Causal pruning from the tile's FIRST row instead of its last (drops needed own keys)."""
    own_end = (pos_lo + block_n) // block_n
    ctx_end = (ctx_len + block_n - 1) // block_n
    return 0, own_end, 0, ctx_end


def _wrong_ctx_first(q_len, ctx_len, pos_lo, pos_hi, block_n, window_left, causal=True):
    """Window skipping one context block too many."""
    own_lo = max(0, pos_lo - window_left) if window_left >= 0 else 0
    ctx_end = (ctx_len + block_n - 1) // block_n
    ctx_lo = ctx_len + pos_lo - window_left
    ctx_first = 0 if ctx_lo <= 0 else (ctx_end if ctx_lo >= ctx_len else ctx_lo // block_n)
    return own_lo // block_n, (pos_hi + block_n) // block_n, min(ctx_end, ctx_first + 1), ctx_end


def _wrong_partial_mask(is_own, count, key_base, i_min, i_max, block_n, window_left, causal=True):
    return (is_own and key_base + block_n - 1 > i_min) or (window_left >= 0 and key_base < i_max - window_left)


@pytest.mark.parametrize("wrong", ["own_end", "ctx_first", "partial_mask"])
def test_known_wrong_schedules_are_caught(wrong):
    kr, nm = schedule.key_range, schedule.needs_mask
    if wrong == "own_end":
        kr = _wrong_own_end
    elif wrong == "ctx_first":
        kr = _wrong_ctx_first
    else:
        nm = _wrong_partial_mask
    mirror = make_mirror(kr, nm)
    layout = GroupLayout.from_lengths([130], [[100, 65]])
    window = 70 if wrong == "ctx_first" else -1
    err, _ = _mirror_error(layout, 2, 1, 32, window, FWD_TILES[32], pack=1, mirror=mirror)
    assert err > 1e-3, f"the mirror did not catch the '{wrong}' schedule bug"


@pytest.mark.parametrize("q_scale", [1.0, 8.0, 64.0])
def test_lazy_rescale_with_moving_maxima(q_scale):
    """q scaled up makes the running row max move past the lazy threshold at some blocks and not at others (and at
    q * 1 rarely): the kernels' lazy softmax, mirrored, still equals the reference, and a softmax that never
    rescales the output (softmax.cuh's DKV_SOFTMAX_LAZY=2) is caught wherever the max moves."""
    layout = GroupLayout.from_lengths([700], [[1, 129, 300]])
    q, k, v = _qkv(layout, 2, 1, 32)
    q = q * q_scale
    ref, ref_lse = shared_prefix_attention(q, k, v, layout, return_lse=True)
    errors = {}
    for name, mirror in (("lazy", None), ("never", make_mirror(rescale=False))):
        out, lse, _, _ = mirror_forward(q, k, v, k, v, layout.segment_table, FWD_TILES[32], scale=32 ** -0.5,
                                        pack=1, mirror=mirror)
        errors[name] = max(((out - ref).abs().max() / ref.abs().max()).item(), (lse - ref_lse).abs().max().item())
    assert errors["lazy"] < 1e-12
    if q_scale > 1:
        assert errors["never"] > 1e-3, "the never-rescaling softmax was not caught"


def test_lazy_rescale_constant_matches_the_kernels():
    """The mirror's threshold is softmax.cuh's kLazyRescale, and the kernels build the lazy softmax by default."""
    import re
    from pathlib import Path

    from dualkv.cuda.mirror import LAZY_RESCALE

    source = (Path(schedule.__file__).parent / "csrc" / "softmax.cuh").read_text()
    assert float(re.search(r"constexpr float kLazyRescale = ([\d.]+)f;", source).group(1)) == LAZY_RESCALE
    assert re.search(r"#ifndef DKV_SOFTMAX_LAZY\n#define DKV_SOFTMAX_LAZY 1\n", source)


# ---- the non-causal (DKV_CAUSAL=0) schedule ------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim", sorted(FWD_TILES))
def test_non_causal_mirror_matches_reference_for_every_head_dim(head_dim):
    """Call 2 (segments with a context) and call 1 (several prompts, no context) without the causal mask."""
    q, k, v = _qkv(GroupLayout.single(1, [140]), 4, 2, head_dim)  # 141 tokens: 9 context + 132 decoded
    ctx_len, cu = 9, [0, 70, 71, 132]
    out, lse, _, _ = mirror_forward(q[ctx_len:], k[:ctx_len], v[:ctx_len], k[ctx_len:], v[ctx_len:],
                                    schedule.segments_from_cu_seqlens(cu, ctx_len), FWD_TILES[head_dim], scale=0.3,
                                    causal=False)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    ref, ref_lse = flash_attn_dualkv_varlen_func(q[ctx_len:], k[:ctx_len], v[:ctx_len], k[ctx_len:], v[ctx_len:],
                                                 cu_t, cu_t, 70, ctx_len, 70, softmax_scale=0.3, causal=False,
                                                 return_lse=True)
    assert max((out - ref).abs().max().item(), (lse - ref_lse).abs().max().item()) < 1e-12
    cu1 = [0, 65, 141]
    out1, _, _, _ = mirror_forward(q, k, v, k, v, schedule.segments_from_cu_seqlens(cu1, 0), FWD_TILES[head_dim],
                                   scale=0.3, causal=False)
    ref1 = context_attention(q, k, v, torch.tensor(cu1, dtype=torch.int32), 76, softmax_scale=0.3, causal=False)
    assert (out1 - ref1).abs().max().item() < 1e-12


def _causal_range_always(q_len, ctx_len, pos_lo, pos_hi, block_n, window_left, causal=True):
    """Own blocks pruned causally whatever ``causal`` says."""
    return 0, (pos_hi + block_n) // block_n, 0, (ctx_len + block_n - 1) // block_n


def test_causal_pruning_in_the_non_causal_schedule_is_caught():
    """Known-wrong: the non-causal kernels with the causal key range (own blocks past the tile's last row
    skipped)."""
    q, k, v = _qkv(GroupLayout.single(1, [200]), 2, 1, 32)
    seg = schedule.segments_from_cu_seqlens([0, 130, 190], 11)
    cu_t = torch.tensor([0, 130, 190], dtype=torch.int32)
    ref = flash_attn_dualkv_varlen_func(q[11:], k[:11], v[:11], k[11:], v[11:], cu_t, cu_t, 130, 11, 130,
                                        softmax_scale=0.3, causal=False)
    out, _, _, _ = mirror_forward(q[11:], k[:11], v[:11], k[11:], v[11:], seg, FWD_TILES[32], scale=0.3,
                                  causal=False, pack=1, mirror=make_mirror(_causal_range_always, schedule.needs_mask))
    assert (out - ref).abs().max().item() > 1e-3


@pytest.mark.parametrize("causal", [True, False])
def test_dkdv_key_tiles_match_reference_gradients(causal):
    """The dK/dV kernel's decomposition (key tiles writing rows from their listed source segments) on the shared
    prefix layout (context rows are another segment's own rows) and on the paper's call 2 (a separate context)."""
    from dualkv.cuda.configs import DKDV_TILES
    from dualkv.cuda.mirror import mirror_dkdv

    layout = GroupLayout.from_lengths([70, 9], [[33, 1, 80], [20]])
    q, k, v = (t.requires_grad_() for t in _qkv(layout, 4, 2, 32))
    d_out = torch.randn(q.shape, dtype=torch.float64)
    if causal:
        out, lse = shared_prefix_attention(q, k, v, layout, softmax_scale=0.3, return_lse=True)
        dk, dv, _, _, writes = mirror_dkdv(q, k, v, k, v, d_out, out, lse, layout.segment_table,
                                           block_keys=DKDV_TILES[32].block_keys, ctx_shared=True, scale=0.3)
        ref = torch.autograd.grad(out, (k, v), d_out)
    else:
        ctx_len, cu = 11, [0, 64, 65, layout.total_tokens - 11]
        cu_t = torch.tensor(cu, dtype=torch.int32)
        out, lse = flash_attn_dualkv_varlen_func(q[ctx_len:], k[:ctx_len], v[:ctx_len], k[ctx_len:], v[ctx_len:],
                                                 cu_t, cu_t, 200, ctx_len, 200, softmax_scale=0.3, causal=False,
                                                 return_lse=True)
        dk_own, dv_own, dk_ctx, dv_ctx, writes = mirror_dkdv(
            q[ctx_len:], k[:ctx_len], v[:ctx_len], k[ctx_len:], v[ctx_len:], d_out[ctx_len:], out, lse,
            schedule.segments_from_cu_seqlens(cu, ctx_len), block_keys=DKDV_TILES[32].block_keys, ctx_shared=False,
            scale=0.3, causal=False)
        dk, dv = torch.cat([dk_ctx, dk_own]), torch.cat([dv_ctx, dv_own])
        ref = torch.autograd.grad(out, (k, v), d_out[ctx_len:])
    assert (writes[:k.shape[0]] == 1).all()
    assert (dk - ref[0]).abs().max().item() < 1e-12 and (dv - ref[1]).abs().max().item() < 1e-12
