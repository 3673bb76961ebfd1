"""CPU model of the wgmma_v1 kernels' shared-memory tiles: where the cp.async loads put each element, and which
address each wgmma descriptor makes the tensor cores read for each operand element.

Two independent halves, so that a test can check one against the other:

- the kernels' own arithmetic, transcribed from ``csrc/common.cuh`` (``swizzled_offset``) and ``csrc/sm90.cuh``
  (``kmajor_tile`` / ``kmajor_desc`` / ``nmajor_tile`` / ``nmajor_desc``, and the ``smem_desc`` bit fields);
- the hardware's reading of a descriptor (PTX ISA, "shared memory matrix layout"): a canonical, unswizzled address
  per element from the start address, the leading and stride byte offsets, then the swizzle as an XOR of address
  bits: 128-byte mode flips bits 4-6 with bits 7-9, 64-byte mode bits 4-5 with bits 7-8 (patterns anchored to
  1024-byte boundaries; every tile here starts on one).

Elements are 2 bytes (fp16 / bf16). Addresses are byte offsets from a 1024-byte-aligned base.
"""

from __future__ import annotations

from dataclasses import dataclass

ELEM = 2          # bytes per element
ATOM_COLS = 64    # columns of a 128-byte-swizzle atom (128-byte rows)
SWIZZLE_BITS = {128: (3, 7), 64: (2, 7)}  # mode -> (how many bits, lowest source bit); destination bits start at 4


def swizzle(addr: int, mode: int = 128) -> int:
    """The hardware swizzle of a canonical byte address (``mode`` 128 or 64 bytes)."""
    bits, src = SWIZZLE_BITS[mode]
    return addr ^ (((addr >> src) & ((1 << bits) - 1)) << 4)


# ---- the kernels' arithmetic (transcribed) ----

def swizzled_offset(rows: int, r: int, c: int) -> int:
    """common.cuh ``swizzled_offset<kRows>(r, c)``: byte offset of 16-byte chunk ``c`` of row ``r``."""
    return (c // 8) * rows * 128 + r * 128 + (((c % 8) ^ (r % 8)) << 4)


def smem_desc(addr: int, leading: int, stride: int) -> int:
    """sm90.cuh ``smem_desc``: 14-bit fields of (bytes >> 4), layout type 1 (128-byte swizzle) in bits 62-63."""
    return ((addr >> 4) & 0x3FFF) | (((leading >> 4) & 0x3FFF) << 16) | (((stride >> 4) & 0x3FFF) << 32) | (1 << 62)


@dataclass(frozen=True)
class Descriptor:
    """A decoded shared-memory matrix descriptor (byte units)."""

    start: int
    leading: int
    stride: int
    mode: int  # swizzle bytes

    @classmethod
    def decode(cls, desc: int) -> "Descriptor":
        layout = desc >> 62
        if layout != 1:
            raise ValueError(f"layout type {layout} is not the 128-byte swizzle the kernels use")
        return cls((desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4, 128)


def kmajor_desc(tile: int, row0: int, rows: int, s: int) -> int:
    """sm90.cuh ``kmajor_desc<kRows>(kmajor_tile(tile, row0), s)``: k-step ``s`` of a K-major operand."""
    return smem_desc(tile + row0 * 128, 16, 1024) + ((((s // 4) * rows * 128) + (s % 4) * 32) >> 4)


def nmajor_desc(tile: int, rows: int, s: int) -> int:
    """sm90.cuh ``nmajor_desc(nmajor_tile<kRows>(tile), s)``: k-step ``s`` (rows 16s .. 16s + 15) of a tile read
    as the N-major B operand."""
    return smem_desc(tile, rows * 128, 1024) + ((s * 16 * 128) >> 4)


def loaded_elements(rows: int, head_dim: int, tile: int = 0) -> dict[tuple[int, int], int]:
    """Where the loads (``load_rows_async`` / ``load_strided_rows`` with kSwizzle: chunks c < head_dim / 8 of
    every row) put element (row, column): {(r, col): byte address}."""
    return {(r, c * 8 + e): tile + swizzled_offset(rows, r, c) + e * ELEM
            for r in range(rows) for c in range(head_dim // 8) for e in range(8)}


def strided_load_writes(rows: int, head_dim: int, tile_cols: int, threads: int) -> list[tuple[int, int, int]]:
    """common.cuh ``load_strided_rows<kRows, true>``'s fast path, thread by thread: each thread takes chunk column
    ``tid % slots`` (slots = tile_cols / 8), rows ``tid / slots + i * rows_per_pass``, destination stepping by
    ``rows_per_pass * 128`` bytes from ``swizzled_offset`` of its first row; threads of chunk columns past the head
    dim load nothing. Returns (row, chunk, byte offset) per copy; [] where the kernel takes the generic path."""
    slots = tile_cols // 8
    per_pass = threads // slots
    if threads % slots or rows % per_pass or per_pass % 8:
        return []
    out = []
    for tid in range(threads):
        r0, c = tid // slots, tid % slots
        if c >= head_dim // 8:
            continue
        out += [(r0 + i * per_pass, c, swizzled_offset(rows, r0, c) + i * per_pass * 128)
                for i in range(rows // per_pass)]
    return out


# ---- the hardware's reading of a descriptor (independent of the above) ----

def read_kmajor(desc: Descriptor, m: int = 64) -> dict[tuple[int, int], int]:
    """Addresses a K-major operand (``m`` rows x 16 k) is read from: row i at (i % 8) * 128 + (i // 8) * stride,
    k at 2 k bytes within the 128-byte row (the 16 k of one step never reach the leading offset), then swizzled."""
    return {(i, k): swizzle(desc.start + (i % 8) * 128 + (i // 8) * desc.stride + k * ELEM, desc.mode)
            for i in range(m) for k in range(16)}


def read_nmajor(desc: Descriptor, n: int) -> dict[tuple[int, int], int]:
    """Addresses an N-major B operand (16 k x ``n``) is read from: n in 128-byte-row atoms of 64 columns
    ``leading`` bytes apart, k rows 128 bytes apart in groups of 8 ``stride`` bytes apart, then swizzled."""
    per_row = desc.mode // ELEM  # columns per swizzle row
    return {(k, j): swizzle(desc.start + (j % per_row) * ELEM + (j // per_row) * desc.leading
                            + (k % 8) * desc.mode + (k // 8) * desc.stride, desc.mode)
            for k in range(16) for j in range(n)}


# ---- the mma.sync dK/dV kernel's swizzled Q / dO tiles (bwd_dkdv.cu DKV_QDO_SWIZZLE; common.cuh gemm_rows_swz,
# gemm_smem_swz): the byte address each lane gives ldmatrix, transcribed. An x4 ldmatrix reads four 8 x 8 matrices;
# lane l gives the address of row l % 8 of matrix l // 8 (16 contiguous bytes).

def rows_swz_lane_address(rows: int, b_row0: int, kk: int, np_: int, lane: int) -> int:
    """gemm_rows_swz's B read (non-transposed; rows b_row0 + 16 np + ..., k-step kk of 16 columns)."""
    lrow, lmat = lane % 8, lane // 8
    b0 = (b_row0 + (lmat // 2) * 8 + lrow) * 128 + (((lmat % 2) ^ lrow) << 4)
    bk = (b0 ^ ((kk % 4) * 32)) + (kk // 4) * rows * 128
    return bk + np_ * 16 * 128


def smem_swz_lane_address(rows: int, col0: int, kk: int, np_: int, lane: int) -> int:
    """gemm_smem_swz's B read (transposed; rows 16 kk + ..., columns col0 + 16 np + ...)."""
    lrow, lmat = lane % 8, lane // 8
    c0 = col0 // 8 + lmat // 2
    b0 = (c0 // 8) * rows * 128 + ((lmat % 2) * 8 + lrow) * 128 + (((c0 % 8) ^ lrow) << 4)
    return (b0 ^ (np_ * 32)) + kk * 16 * 128


def rows_lane_chunk(b_row0: int, kk: int, np_: int, lane: int) -> tuple[int, int]:
    """The (row, 16-byte chunk) the padded form (gemm_rows_rows) has lane ``lane`` read: the element block the
    swizzled read must find at its address."""
    lrow, lmat = lane % 8, lane // 8
    return b_row0 + np_ * 16 + (lmat // 2) * 8 + lrow, 2 * kk + lmat % 2


def smem_lane_chunk(col0: int, kk: int, np_: int, lane: int) -> tuple[int, int]:
    """The same for gemm_smem_rows's transposed B read."""
    lrow, lmat = lane % 8, lane // 8
    return kk * 16 + (lmat % 2) * 8 + lrow, col0 // 8 + 2 * np_ + lmat // 2
