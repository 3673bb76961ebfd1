"""The wgmma_v1 kernels' shared-memory tiles, on the CPU: every descriptor read hits the element the loads put there
(dualkv/cuda/swizzle.py models both sides), at every head dim of the wgmma_v1 tables, and in particular at head dim
96, whose tiles are two 64-column atoms wide (128 columns, 96 loaded). Known-wrong layouts must be caught."""

import re
from pathlib import Path

import pytest
import torch

from dualkv.cuda import swizzle as sw
from dualkv.cuda.configs import (SM90_DKDV_TILES, SM90_DQ_TILES, SM90_FWD_TILES, SM90_WS_FWD_TILES, WGMMA_V1_KERNELS,
                                 dkdv_spec, dq_spec, fwd_spec, kernel_family, tile_head_dim)

CSRC = Path(sw.__file__).resolve().parent / "csrc"


def kmajor_mismatches(rows: int, loaded: dict, row0: int, m: int, steps: int) -> int:
    """Elements of the k-steps 0 .. steps - 1 of a K-major operand (rows row0 .. row0 + m - 1 of a tile of ``rows``
    rows) that the hardware reads from anywhere but where the loads put them (unloaded elements count)."""
    bad = 0
    for s in range(steps):
        reads = sw.read_kmajor(sw.Descriptor.decode(sw.kmajor_desc(0, row0, rows, s)), m)
        bad += sum(loaded.get((row0 + i, 16 * s + k)) != addr for (i, k), addr in reads.items())
    return bad


def nmajor_check(rows: int, loaded: dict, head_dim: int, n: int) -> tuple[int, set]:
    """The N-major B operand of N = ``n`` over all k-steps of a ``rows``-row tile: (mismatches among the columns
    < head_dim, the addresses read for the columns >= head_dim)."""
    bad, extra = 0, set()
    for s in range(rows // 16):
        for (k, j), addr in sw.read_nmajor(sw.Descriptor.decode(sw.nmajor_desc(0, rows, s)), n).items():
            if j < head_dim:
                bad += loaded[(16 * s + k, j)] != addr
            else:
                extra.add(addr)
    return bad, extra


def operands(kernel: str, d: int) -> list[tuple[int, str, int, int]]:
    """(tile rows, how it is read, row0s or -, m) per smem tile of a wgmma_v1 kernel (csrc/*_sm90.cu)."""
    if kernel == "fwd_sm90":
        t = SM90_FWD_TILES[d]
        return [(t.block_m, "A", 64, 2), (t.block_n, "B", t.block_n, 1), (t.block_n, "N", 0, 0)]  # Q; K; V
    if kernel == "bwd_dq_sm90":
        t = SM90_DQ_TILES[d]
        return [(t.block_m, "A", 64, 2), (t.block_n, "B", t.block_n, 1), (t.block_n, "N", 0, 0)]  # Q, dO; K, V; K
    t = SM90_DKDV_TILES[d]
    return [(t.block_keys, "A", 64, 2), (t.block_m, "B", t.block_m, 1), (t.block_m, "N", 0, 0)]  # K, V; Q, dO; Q, dO


@pytest.mark.parametrize("kernel", WGMMA_V1_KERNELS)
@pytest.mark.parametrize("d", (64, 96, 128))
def test_descriptors_read_what_the_loads_wrote(kernel, d):
    cols = tile_head_dim(d)
    assert cols == (128 if d == 96 else d)
    for rows, role, m, groups in operands(kernel, d):
        loaded = sw.loaded_elements(rows, d)
        addrs = sorted(loaded.values())
        # every loaded element has its own 2 bytes, inside the tile's rows x cols x 2 bytes (the next tile starts there)
        assert len(set(addrs)) == len(addrs) and 0 <= addrs[0] and addrs[-1] < rows * cols * sw.ELEM
        if role in "AB":  # S = Q K^T-like: d / 16 k-steps over the head dim, per warpgroup (A) or whole (B)
            for g in range(groups):
                assert kmajor_mismatches(rows, loaded, g * m if role == "A" else 0, m, d // 16) == 0
        else:  # O += P V-like: N = the tile's columns
            bad, extra = nmajor_check(rows, loaded, d, cols)
            assert bad == 0
            # the padded columns read only bytes no loaded element owns, inside this tile
            assert not extra & set(addrs) and all(0 <= a < rows * cols * sw.ELEM for a in extra)
            assert len(extra) == (cols - d) * rows


@pytest.mark.parametrize("d", sorted(SM90_WS_FWD_TILES))
def test_warp_specialised_forward_key_blocks(d):
    """The warp-specialised forward's K and V slots (TMA writes the same 128-byte-swizzle layout the loads model) at
    its key blocks, whatever their row count (192, 112, 80: not multiples of 64): S = Q K^T reads K as the whole-block
    K-major B operand over d / 16 k-steps, O += P V reads V as the N-major B operand over its rows; each slot is a
    whole number of 1024-byte swizzle periods, so the stages of fwd_sm90_ws.cu's ring keep the layout. A descriptor
    built for another row count reads the second atom from elsewhere (caught)."""
    rows, cols = SM90_WS_FWD_TILES[d].block_n, tile_head_dim(d)
    assert rows % 16 == 0 and (rows * cols * sw.ELEM) % 1024 == 0 and (rows * 128) % 1024 == 0
    loaded = sw.loaded_elements(rows, d)
    assert kmajor_mismatches(rows, loaded, 0, rows, d // 16) == 0
    bad, extra = nmajor_check(rows, loaded, d, cols)
    assert bad == 0 and not extra & set(loaded.values())
    if d // 16 > 4:  # a second 64-column atom, whose place depends on the row count: k-step 4 is its first
        wrong = 128 if rows != 128 else 64
        reads = sw.read_kmajor(sw.Descriptor.decode(sw.kmajor_desc(0, 0, wrong, 4)), rows)
        assert sum(loaded.get((i, 64 + k)) != addr for (i, k), addr in reads.items()) > 0


@pytest.mark.parametrize("d", (64, 96, 128))
def test_strided_loads_cover_the_tile_once(d):
    """The unrolled cp.async loop (each thread one chunk column, its destination stepped by a constant) puts every
    (row, chunk < d / 8) exactly where swizzled_offset says, once, for the key-side tiles of the wgmma_v1 kernels
    (256 threads; 64- and 128-row tiles)."""
    cols = tile_head_dim(d)
    for rows in (64, 128):
        writes = sw.strided_load_writes(rows, d, cols, 256)
        assert writes, (rows, d)  # the fast path applies (the kernel would take the generic loop otherwise)
        assert sorted((r, c) for r, c, _ in writes) == [(r, c) for r in range(rows) for c in range(d // 8)]
        assert all(off == sw.swizzled_offset(rows, r, c) for r, c, off in writes)
    # tiled by its own 12 chunk columns, a 96 head dim does not divide 256 threads: the kernel would fall back to the
    # generic loop, which made the dK/dV kernel spill (72-132 bytes a thread, measured with ptxas -v)
    assert sw.strided_load_writes(128, 96, 96, 256) == []


def test_specs_of_head_dim_96_route_to_wgmma_v1_with_padded_tiles():
    for dtype in (torch.bfloat16, torch.float16):
        with kernel_family("wgmma_v1"):
            specs = [fwd_spec(96, dtype, 4, False, "sm_90"), dq_spec(96, dtype, 4, False, "sm_90"),
                     dkdv_spec(96, dtype, False, "sm_90")]
        assert [s.kernel for s in specs] == list(WGMMA_V1_KERNELS)
        for s in specs:
            assert s.arch == "sm_90a" and s.tile_head_dim == 128 and ("DKV_HEAD_DIM_ACC", "128") in s.defines()
            # descriptors hold (address >> 4) in 14 bits: the whole allocation must stay below 256 KB
            assert s.smem_bytes <= 227 * 1024
        # the default family routes the windowed backward the same way (the warp-specialised backward at 96 serves
        # causal calls without a window; the forward is the warp-specialised one, also on 128-column tiles)
        ws = fwd_spec(96, dtype, 4, False, "sm_90")
        assert ws.kernel == "fwd_sm90_ws" and ws.tile_head_dim == 128 and ("DKV_HEAD_DIM_ACC", "128") in ws.defines()
        # the same layout as head dim 128's: 128 query rows + 2 stages of 128-key K and V tiles of 128 columns,
        # mbarriers (the query's, and full K / full V / empty K / empty V per stage), 1 KB alignment slack
        assert ws.smem_bytes == fwd_spec(128, dtype, 4, False, "sm_90").smem_bytes == (128 + 512) * 256 + 72 + 1024
        assert dq_spec(96, dtype, 4, False, "sm_90").kernel == "bwd_dq_sm90"
        assert dkdv_spec(96, dtype, False, "sm_90").kernel == "bwd_dkdv_sm90"
        with kernel_family("mma"):
            assert fwd_spec(96, dtype, 4, False, "sm_90").kernel == "fwd"
    # head dims that are whole atoms keep their tiles (and their macro set: no DKV_HEAD_DIM_ACC)
    spec = fwd_spec(128, torch.bfloat16, 4, False, "sm_90", kernel="fwd_sm90")
    assert spec.tile_head_dim == 128 and all(k != "DKV_HEAD_DIM_ACC" for k, _ in spec.defines())
    assert fwd_spec(96, torch.bfloat16, 4, False, "sm_80").tile_head_dim == 96  # the mma.sync kernel: unpadded


def test_known_wrong_layouts_are_caught():
    rows, d = 128, 96
    loaded = sw.loaded_elements(rows, d)
    # 1. tiles sized by the head dim (96 columns) instead of whole atoms: atom 1 runs into the next tile
    assert max(loaded.values()) >= rows * d * sw.ELEM
    # 2. eight k-steps (the padded width) over the head dim: steps 6 and 7 read columns nobody loaded
    assert kmajor_mismatches(rows, loaded, 0, 64, 6) == 0
    assert kmajor_mismatches(rows, loaded, 0, 64, 8) == 2 * 64 * 16
    # 3. a compact tile whose 32-column tail is a 64-byte-swizzle atom (rows of 64 bytes), read through the
    #    kernels' 128-byte-swizzle descriptors: the tail's k-steps miss
    compact = {(r, col): (sw.swizzled_offset(rows, r, col // 8) + (col % 8) * 2 if col < 64 else
                          sw.swizzle(rows * 128 + r * 64 + (col - 64) * 2, 64))
               for r in range(rows) for col in range(d)}
    assert kmajor_mismatches(rows, compact, 0, 64, 4) == 0           # atom 0 is the same layout
    assert kmajor_mismatches(rows, compact, 0, 64, 6) > 0            # the 128-byte swizzle applied to the tail
    # ... while a 64-byte-swizzle descriptor (8-row groups 512 bytes apart) does read that tail right: the model
    #     tells the two swizzles apart rather than failing every non-default layout
    for s in (4, 5):
        desc = sw.Descriptor(rows * 128 + (s - 4) * 32, 16, 512, 64)
        reads = {(i, k): sw.swizzle(desc.start + (i % 8) * 64 + (i // 8) * desc.stride + k * 2, 64)
                 for i in range(64) for k in range(16)}
        assert all(compact[(i, 16 * s + k)] == a for (i, k), a in reads.items())
    # 4. a swizzle-free load (chunk c of row r at its canonical place) read through the swizzled descriptors
    plain = {(r, c * 8 + e): (c // 8) * rows * 128 + r * 128 + (c % 8) * 16 + 2 * e
             for r in range(rows) for c in range(d // 8) for e in range(8)}
    assert kmajor_mismatches(rows, plain, 0, 64, 6) > 0
    assert nmajor_check(rows, plain, d, 128)[0] > 0


def test_the_model_transcribes_the_cuda_source():
    """swizzle.py's transcriptions are the kernels' expressions (a drift guard), and the wgmma_v1 and warp-specialised
    kernels take kHeadDim / 16 k-steps over the head dim while their accumulators and tiles are kHeadDimAcc wide."""
    common, sm90 = (CSRC / "common.cuh").read_text(), (CSRC / "sm90.cuh").read_text()
    assert "return (c / 8) * kRows * 128 + r * 128 + (((c % 8) ^ (r % 8)) << 4);" in common
    for line in ("return smem_desc(tile + row0 * 128, 16, 1024);",
                 "return tile_desc + ((((s / 4) * kRows * 128) + (s % 4) * 32) >> 4);",
                 "return smem_desc(tile, kRows * 128, 1024);",
                 "return tile_desc + ((s * 16 * 128) >> 4);",
                 "((unsigned long long)((stride >> 4) & 0x3FFF) << 32) | (1ull << 62);"):
        assert line in sm90, line
    for line in ("constexpr int kSlots = kSwizzle ? kHeadDimAcc / 8 : kChunksPerRow;",
                 "const int r0 = threadIdx.x / kSlots, c = threadIdx.x % kSlots;",
                 "if (c >= kChunksPerRow) return;",
                 "constexpr int kDstStep = kSwizzle ? kRowsPerPass * 128"):
        assert line in common, line
    for name in ("fwd_sm90.cu", "bwd_dq_sm90.cu", "bwd_dkdv_sm90.cu", "fwd_sm90_ws.cu", "bwd_sm90_ws.cu"):
        src = (CSRC / name).read_text()
        assert "kHeadDimAcc / 16" not in src and re.search(r"st? < kHeadDim / 16;", src), name
        assert not re.search(r"acc_\w+\[(1\]\[)?kHeadDim / 8\]", src), name  # accumulators: kHeadDimAcc / 8
        assert not re.search(r"\* kHeadDim \* 2", src), name                  # tile bytes: kHeadDimAcc


def mma_swizzled_reads(head_dim: int, rows: int = 64, rows_fn=None, smem_fn=None) -> tuple[int, int]:
    """The mma.sync dK/dV kernel's swizzled Q / dO tiles (DKV_QDO_SWIZZLE, FA2-like layout: warps of 32 queries in the
    S^T / dP^T products, of head_dim / 2 columns in the dV / dK products): (lane addresses that are not where
    swizzled_offset put the chunk the padded form reads, 8-lane ldmatrix phases whose rows share a bank group)."""
    rows_fn, smem_fn = rows_fn or sw.rows_swz_lane_address, smem_fn or sw.smem_swz_lane_address
    bad = conflicts = 0

    def tally(addrs, chunks):
        nonlocal bad, conflicts
        bad += sum(a != sw.swizzled_offset(rows, r, c) for a, (r, c) in zip(addrs, chunks))
        conflicts += sum(len({(a // 16) % 8 for a in addrs[8 * m:8 * m + 8]}) != 8 for m in range(4))

    for b_row0 in range(0, rows, 32):          # gemm_rows_swz: S^T = K Q^T, dP^T = V dO^T
        for kk in range(head_dim // 16):
            for np_ in range(2):
                tally([rows_fn(rows, b_row0, kk, np_, lane) for lane in range(32)],
                      [sw.rows_lane_chunk(b_row0, kk, np_, lane) for lane in range(32)])
    cols = head_dim // 2
    for col0 in range(0, head_dim, cols):     # gemm_smem_swz: dV += P^T dO, dK += dS^T Q
        for kk in range(rows // 16):
            for np_ in range(cols // 16):
                tally([smem_fn(rows, col0, kk, np_, lane) for lane in range(32)],
                      [sw.smem_lane_chunk(col0, kk, np_, lane) for lane in range(32)])
    return bad, conflicts


@pytest.mark.parametrize("d", [64, 128])
def test_mma_swizzled_q_do_tiles_read_what_the_loads_wrote(d):
    """Every ldmatrix lane address of the swizzled B operands (common.cuh gemm_rows_swz / gemm_smem_swz, transcribed in
    swizzle.py) is where the strided loads put the (row, chunk) the padded helpers read, without bank conflicts; known
    wrong variants (no XOR, the matrix bits swapped, the XOR by the k-step rather than k-step mod 4 with no atom
    offset: the same at d = 64, one atom wide) are caught."""
    assert mma_swizzled_reads(d) == (0, 0)

    def no_xor(rows, b_row0, kk, np_, lane):
        lrow, lmat = lane % 8, lane // 8
        row = b_row0 + np_ * 16 + (lmat // 2) * 8 + lrow
        return (kk // 4) * rows * 128 + row * 128 + ((2 * kk + lmat % 2) % 8) * 16

    def swapped(rows, col0, kk, np_, lane):
        return sw.smem_swz_lane_address(rows, col0, kk, np_, (lane % 8) + 8 * [0, 2, 1, 3][lane // 8])

    def whole_k(rows, b_row0, kk, np_, lane):
        lrow, lmat = lane % 8, lane // 8
        b0 = (b_row0 + (lmat // 2) * 8 + lrow) * 128 + (((lmat % 2) ^ lrow) << 4)
        return (b0 ^ (kk * 32)) + np_ * 16 * 128

    assert mma_swizzled_reads(d, rows_fn=no_xor)[1] > 0
    assert mma_swizzled_reads(d, smem_fn=swapped)[0] > 0
    assert mma_swizzled_reads(d, rows_fn=whole_k)[0] > 0 if d > 64 else mma_swizzled_reads(d, rows_fn=whole_k)[0] == 0


def test_the_mma_swizzle_model_transcribes_the_cuda_source():
    """swizzle.py's lane addresses of the swizzled mma.sync reads are common.cuh's expressions (a drift guard)."""
    common = (CSRC / "common.cuh").read_text()
    for line in ("const unsigned b0 = smem_addr(sB) + (b_row0 + (lmat / 2) * 8 + lrow) * 128 + "
                 "(((lmat % 2) ^ lrow) << 4);",
                 "const unsigned bk = (b0 ^ ((kk % 4) * 32)) + (kk / 4) * kRowsB * 128;",
                 "ldmatrix_x4(b, bk + np * 16 * 128);",
                 "const int c0 = col0 / 8 + lmat / 2;",
                 "ldmatrix_x4_trans(b, (b0 ^ (np * 32)) + kk * 16 * 128);"):
        assert line in common, line
    assert re.search(r"const unsigned b0 = smem_addr\(sB\) \+ \(c0 / 8\) \* kRowsB \* 128 \+ "
                     r"\(\(lmat % 2\) \* 8 \+ lrow\) \* 128 \+\s+\(\(\(c0 % 8\) \^ lrow\) << 4\);", common)
