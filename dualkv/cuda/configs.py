"""The one table of kernel tile configurations.

It feeds the CUDA sources (as ``-D`` macros, see :meth:`KernelSpec.defines`) and the numba mirror of the kernels'
block schedule (:mod:`dualkv.cuda.mirror`), so the CPU-tested schedule is the one the GPU runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

import torch

HEAD_DIMS = (32, 64, 96, 128, 192, 256, 512)
#: Head dims whose kernels support a sliding window (the paper's hd512 path is full attention only).
WINDOW_HEAD_DIMS = (32, 64, 96, 128, 192, 256)
ARCHS = ("sm_80", "sm_90")
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
PACKS = (1, 2, 4, 8)


@dataclass(frozen=True)
class TileConfig:
    """A CTA's tiling: ``warps`` warps in ``warps / dsplit`` row groups of ``16 * mslabs`` rows; ``dsplit`` warps
    share a row group and split the output columns; keys come in blocks of ``block_n``."""

    block_n: int
    warps: int
    mslabs: int
    dsplit: int = 1

    @property
    def block_m(self) -> int:
        """Query rows (positions x packed heads) per CTA."""
        return (self.warps // self.dsplit) * 16 * self.mslabs

    @property
    def threads(self) -> int:
        return self.warps * 32


#: Forward tiles per head dim (FlashAttention-2-like sizes; d = 512 splits the output columns over warp pairs).
FWD_TILES: dict[int, TileConfig] = {
    32: TileConfig(block_n=64, warps=4, mslabs=2),
    64: TileConfig(block_n=64, warps=4, mslabs=2),
    96: TileConfig(block_n=64, warps=4, mslabs=2),
    128: TileConfig(block_n=64, warps=4, mslabs=2),
    192: TileConfig(block_n=64, warps=8, mslabs=1),
    256: TileConfig(block_n=64, warps=8, mslabs=1),
    512: TileConfig(block_n=32, warps=8, mslabs=1, dsplit=2),
}


def pack_for(group_size: int, tile: TileConfig) -> int:
    """Query heads packed per CTA: the largest power of two <= 8 dividing the GQA group and leaving >= 8 positions."""
    pack = 1
    while pack * 2 <= 8 and group_size % (pack * 2) == 0 and tile.block_m // (pack * 2) >= 8:
        pack *= 2
    return pack


@dataclass(frozen=True)
class KernelSpec:
    """One compiled specialization."""

    kernel: str          # "fwd"
    head_dim: int
    dtype: str           # "bf16" | "fp16"
    tile: TileConfig
    pack: int
    window: bool
    arch: str

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim {self.head_dim} is not supported by the CUDA kernels (supported: {HEAD_DIMS})")
        if self.window and self.head_dim not in WINDOW_HEAD_DIMS:
            raise ValueError(f"sliding windows are supported for head dims {WINDOW_HEAD_DIMS}, not {self.head_dim}")

    @property
    def source(self) -> str:
        return f"{self.kernel}.cu"

    @property
    def entry(self) -> str:
        return f"dualkv_{self.kernel}"

    @property
    def smem_bytes(self) -> int:
        row = (self.head_dim + 8) * 2
        return (self.tile.block_m + 2 * self.tile.block_n) * row

    def defines(self) -> list[tuple[str, str]]:
        t = self.tile
        return [("DKV_HEAD_DIM", str(self.head_dim)), ("DKV_BLOCK_N", str(t.block_n)), ("DKV_WARPS", str(t.warps)),
                ("DKV_MSLABS", str(t.mslabs)), ("DKV_DSPLIT", str(t.dsplit)), ("DKV_PACK", str(self.pack)),
                ("DKV_BF16", "1" if self.dtype == "bf16" else "0"), ("DKV_WINDOW", "1" if self.window else "0")]

    def with_arch(self, arch: str) -> "KernelSpec":
        return replace(self, arch=arch)


def fwd_spec(head_dim: int, dtype: torch.dtype, group_size: int, window: bool, arch: str) -> KernelSpec:
    if dtype not in DTYPES:
        raise TypeError(f"the CUDA kernels take float16 or bfloat16, got {dtype}")
    if head_dim not in FWD_TILES:
        raise ValueError(f"head_dim {head_dim} is not supported by the CUDA kernels (supported: {HEAD_DIMS})")
    tile = FWD_TILES[head_dim]
    return KernelSpec("fwd", head_dim, DTYPES[dtype], tile, pack_for(group_size, tile), window, arch)


def all_specs(arch: str) -> list[KernelSpec]:
    """Every specialization the kernels are built in, for one architecture."""
    specs = []
    for head_dim, dtype, pack, window in product(HEAD_DIMS, DTYPES, PACKS, (False, True)):
        if window and head_dim not in WINDOW_HEAD_DIMS:
            continue
        tile = FWD_TILES[head_dim]
        if tile.block_m // pack < 8:
            continue
        specs.append(KernelSpec("fwd", head_dim, DTYPES[dtype], tile, pack, window, arch))
    return specs
