"""The one table of kernel tile configurations.

It feeds the CUDA sources (as ``-D`` macros, see :meth:`KernelSpec.defines`) and the numba mirror of the kernels'
block schedule (:mod:`dualkv.cuda.mirror`), so the CPU-tested schedule is the one the GPU runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from itertools import product

import torch

from .tree_schedule import RANK_BLOCK_KEYS

HEAD_DIMS = (32, 64, 96, 128, 192, 256, 512)
#: Head dims whose kernels support a sliding window (the paper's hd512 path is full attention only).
WINDOW_HEAD_DIMS = (32, 64, 96, 128, 192, 256)
#: Head dims with the atomic (FlashAttention-2-style, non-deterministic) dQ mode.
ATOMIC_HEAD_DIMS = (32, 64, 96, 128)
#: Head dims with the ordered dQ mode of the mma.sync dK/dV kernel (deterministic, five products per step; no window;
#: two-level layouts and prefix trees): the atomic mode's, whose dQ tile layout it shares.
ORDERED_HEAD_DIMS = ATOMIC_HEAD_DIMS
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
    # wgmma forwards only, FlashAttention-3's intra-warpgroup overlap. fwd_sm90: issue S of the next block before the
    # softmax of this one (correct, but measured no faster on an H200: 62.7 vs 61.9 ms at N=16, P=32K). fwd_sm90_ws:
    # a block's softmax overlaps the warpgroup's own P V of the block before (fwd_sm90_ws.cu, DKV_FWD_WAIT1).
    overlap: bool = False
    # Warp-specialised kernels: a producer warpgroup (TMA) beside the ``warps`` consumer warps, ``stages`` K/V
    # stages, and ping-pong issue between the two consumer warpgroups.
    producer_warps: int = 0
    stages: int = 2
    pingpong: bool = False
    # mma.sync dQ kernel: K/V blocks in ``kv_stages`` shared-memory buffers (2: the next block loads during this one,
    # one barrier per block instead of three)
    kv_stages: int = 1

    @property
    def block_m(self) -> int:
        """Query rows (positions x packed heads) per CTA."""
        return (self.warps // self.dsplit) * 16 * self.mslabs

    @property
    def threads(self) -> int:
        return (self.warps + self.producer_warps) * 32


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
class KeyTileConfig:
    """The dK/dV kernel's tiling: ``warps / dsplit`` warps of 16 keys each (``dsplit`` warps share 16 keys and split
    the dK/dV columns); queries come in steps of ``block_m``, staged in ``stages`` smem buffers."""

    block_m: int
    warps: int
    dsplit: int = 1
    stages: int = 2
    producer_warps: int = 0  # warp-specialised kernels: a producer warpgroup beside the consumer warps
    dq_buffers: int = 1      # warp-specialised backward: dQ hand-off buffers (2: dS single-buffered; 0, the wide
                             # build: dQ_step in the step's Q/dO stage)
    qwarps: int = 1          # mma.sync dK/dV kernel with a dQ mode: warps over the queries of a step in its S^T /
                             # dP^T products (2: FlashAttention-2-like 4 x 2 layouts, P^T and dS^T through smem)
    do_stages: int = 0       # mma.sync dK/dV kernel, qwarps 2: smem buffers of dO (0: ``stages``; 1: the sm_80 fit)

    @property
    def block_keys(self) -> int:
        return (self.warps // self.dsplit) * 16

    @property
    def threads(self) -> int:
        return (self.warps + self.producer_warps) * 32


#: Deterministic dQ kernel (query-tile parallel): three products per key block, so smaller key blocks than fwd.
#: Two K/V buffers (kv_stages=2) up to head dim 256: backward 0.2-0.9% faster on H100 under kernel_family("mma")
#: (experiments/results/checks/mma-dqkv2-h100-20261127T1634Z.json); at 512 two would need 200 KB of shared memory.
DQ_TILES: dict[int, TileConfig] = {
    32: TileConfig(block_n=64, warps=4, mslabs=2, kv_stages=2),
    64: TileConfig(block_n=64, warps=4, mslabs=2, kv_stages=2),
    96: TileConfig(block_n=32, warps=4, mslabs=2, kv_stages=2),
    128: TileConfig(block_n=32, warps=4, mslabs=2, kv_stages=2),
    192: TileConfig(block_n=32, warps=8, mslabs=1, kv_stages=2),
    256: TileConfig(block_n=32, warps=4, mslabs=1, kv_stages=2),
    512: TileConfig(block_n=32, warps=4, mslabs=1, dsplit=2),
}

#: dK/dV kernel (key-block parallel, no atomics). Head dims 64-128: the FlashAttention-2-like warp layout in the builds
#: with a dQ product (qwarps=2; :func:`dkdv_tile` keeps the others on the 16-key layout). H200, bwd ms at (8, 8K) /
#: (16, 32K), qwarps 2 against 1 (checks/qwarps-h200-*, qwarps2-h200-*): d = 128 ordered 28.59 / 241.84 against 32.45 /
#: 272.86, atomic 28.50 / 232.32 against 31.03 / 246.54; d = 96 ordered 208.33 against 221.55 at (16, 32K); d = 64
#: ordered 149.85 against 159.75, atomic 138.21 against 137.39 (0.6% slower, kept for one layout per head dim); d = 32
#: atomic 104.91 against 81.97, so d = 32 keeps the 16-key layout. :func:`dkdv_tile` adapts it to an architecture.
DKDV_TILES: dict[int, KeyTileConfig] = {
    32: KeyTileConfig(block_m=64, warps=8),
    64: KeyTileConfig(block_m=64, warps=8, qwarps=2),
    96: KeyTileConfig(block_m=64, warps=8, qwarps=2),
    128: KeyTileConfig(block_m=64, warps=8, qwarps=2),
    192: KeyTileConfig(block_m=64, warps=8, dsplit=2),
    256: KeyTileConfig(block_m=64, warps=8, dsplit=2, stages=1),
    512: KeyTileConfig(block_m=32, warps=8, dsplit=4, stages=1),
}

#: Hopper forward (wgmma, sm_90a): two warpgroups of 64 query rows, 128-key blocks, double-buffered K/V.
SM90_FWD_TILES: dict[int, TileConfig] = {
    64: TileConfig(block_n=128, warps=8, mslabs=1),
    96: TileConfig(block_n=128, warps=8, mslabs=1),  # tiles of 128 columns (tile_head_dim)
    128: TileConfig(block_n=128, warps=8, mslabs=1),
}

#: Hopper forward, warp-specialised (sm_90a): a TMA producer warpgroup and two consumer warpgroups of 64 query rows
#: taking turns on the tensor cores, blocks of ``block_n`` keys in a ring of mbarrier stages.
SM90_WS_FWD_TILES: dict[int, TileConfig] = {
    # Head dim 64: 192-key blocks (S in 96 registers, no spills) in three stages: the products' operand reads and the
    # softmax's per-block work spread over 1.5x the keys. H100, forward ms, own processes (experiments/results/checks/
    # tiles16-h100-20261127T2033Z.log, fwd16b-h100-20261127T2042Z.log), against 128-key blocks in three stages (96
    # and 128 ran on 192-key blocks in two stages then):
    #   128 at (28, 4K), (8, 8K), (16, 32K), (16, 64K): 8.03 / 4.71 / 42.05 / 109.67 against 8.70 / 5.05 / 44.78 / 117.27;
    #   96 at (8, 8K), (16, 32K): 4.55 / 39.36 against 5.20 / 42.48; 64: 3.75 / 29.25 against 4.02 / 31.59 (four
    #   stages: 3.80 / 29.39).
    # Head dims 96 and 128 (96 on tiles and an output accumulator of 128 columns, the TMA zero-filling columns 96..127;
    # sm90.cuh): 128-key blocks, two stages, each block's softmax overlapping the warpgroup's own P V of the block
    # before (overlap; fwd_sm90_ws.cu's DKV_FWD_WAIT1, whose registers do not fit beside 192-key blocks). H200, forward
    # ms at (8, 8K) / (16, 32K) against 192-key blocks without it, alternating processes, two rounds
    # (experiments/results/checks/s35d96-*): 128 (and the lazy rescale, the mma.sync forward's numbers in softmax.cuh)
    # 4.51 / 42.45 and 4.73 / 42.65 against 4.72 / 43.69 and 4.95 / 43.71; 96 4.35 / 39.46 and 4.26 / 39.72 against
    # 4.62 / 39.92 and 4.35 / 39.95. At 64 it measured the same as the 192-key blocks (128-key blocks in two stages
    # 3.92 / 30.53 and 3.82 / 30.61 against 3.97 / 30.84 and 3.83 / 30.68; checks/s35hd-*).
    64: TileConfig(block_n=192, warps=8, mslabs=1, producer_warps=4, stages=3, pingpong=True),
    96: TileConfig(block_n=128, warps=8, mslabs=1, producer_warps=4, stages=2, pingpong=True, overlap=True),
    128: TileConfig(block_n=128, warps=8, mslabs=1, producer_warps=4, stages=2, pingpong=True, overlap=True),
    # wider heads: the output accumulator, S and P in the consumers' 240 registers, two stages (split release) of the
    # largest key blocks that fit shared memory. H100, forward ms, own processes:
    #   192 on 112-key blocks at (8, 8K), (16, 32K): 7.09 / 60.77 against 7.25 / 62.31 on 96-key blocks
    #   (experiments/results/checks/final16c-h100-20261127T2055Z.log), which ran 12.66 / 7.25 / 63.03 at (28, 4K),
    #   (8, 8K), (16, 32K) against 14.09 / 8.15 / 70.45 on 64-key blocks in three stages, the cuDNN cascade 18.51 /
    #   9.06 / 66.80 (final16a-h100-20261127T2047Z.log);
    #   256 on 80-key blocks at (8, 8K), (16, 32K): 8.90 / 79.07 against 9.84 / 84.79 on 64-key blocks, the cuDNN
    #   cascade 12.05 / 86.02 (final16c).
    # Both with the overlap (spill-free beside these blocks): H200, forward ms at (8, 8K) / (16, 32K), two rounds,
    # against the same blocks without it (checks/s35hd-*): 192 6.26 / 56.02 and 6.32 / 55.94 against 6.90 / 59.12 and
    # 6.60 / 59.08; 256 8.23 / 73.70 and 8.07 / 73.89 against 8.44 / 75.80 and 8.06 / 76.01.
    192: TileConfig(block_n=112, warps=8, mslabs=1, producer_warps=4, stages=2, pingpong=True, overlap=True),
    256: TileConfig(block_n=80, warps=8, mslabs=1, producer_warps=4, stages=2, pingpong=True, overlap=True),
}

#: Hopper dK/dV kernel (wgmma, sm_90a): two warpgroups of 64 keys, 64-query steps in pairs over three Q/dO buffers,
#: deterministic (no atomic dQ).
SM90_DKDV_TILES: dict[int, KeyTileConfig] = {
    64: KeyTileConfig(block_m=64, warps=8, stages=3),
    96: KeyTileConfig(block_m=64, warps=8, stages=3),
    128: KeyTileConfig(block_m=64, warps=8, stages=3),
}

#: Hopper backward, warp-specialised (sm_90a): dK, dV AND dQ in one kernel (five products per step), a TMA producer
#: warpgroup (with the LSE/D warp and the dQ warp) and two consumer warpgroups of 64 keys; dQ summed in a fixed order
#: (per-query-tile counters), so it stays deterministic. Head dims 64, 96 (tiles of 128 columns) and 128, causal, no
#: sliding window. Measured on an H100 at (16, 32K), against the wgmma dQ + dK/dV kernels: d = 128 158 ms against 169
#: (checks/ws-bwd-variants-h100-*T1140Z.json); d = 64 backward 88.5 ms against 117.1 (kernel-h32-8-d64-20261127-055552
#: .json against -053354.json); d = 96 126.2 against 165.4 (kernel-h32-8-d96-20261127-062842.json against -050642),
#: then 116.2 with dQ rows of 96 columns (cuDNN cascade 121.8 in that run, -091725.json).
#: Head dims whose warp-specialised backward also keeps a transposed copy of its K tile in shared memory (dQ's B
#: operand; bwd_sm90_ws.cu's DKV_DQ_FROM_KT, which a CPU test holds to this tuple).
WS_TRANSPOSED_K_HEAD_DIMS = (64,)
SM90_WS_BWD_TILES: dict[int, KeyTileConfig] = {
    64: KeyTileConfig(block_m=64, warps=8, stages=2, producer_warps=4),
    96: KeyTileConfig(block_m=64, warps=8, stages=2, producer_warps=4),
    # head dim 128: three Q/dO stages (232056 of the 232448 bytes). H200, backward ms at (8, 8K) / (16, 32K), own
    # processes, 3 against 2: 15.97 / 130.75 and 16.51 / 130.83 against 16.08 / 132.63 and 16.16 / 132.92
    # (experiments/results/checks/final22-h200-20261128T1511Z.log)
    128: KeyTileConfig(block_m=64, warps=8, stages=3, producer_warps=4),
    # wide heads (csrc/bwd_sm90_ws_wide.cuh): 64-key CTAs (dsplit 2: the consumer warpgroups share the keys, one
    # accumulating dV, the other dK); dq_buffers 0: each step's dQ_step overwrites its own Q/dO stage (at 256 a
    # separate buffer would leave room for one stage only)
    192: KeyTileConfig(block_m=64, warps=8, dsplit=2, stages=3, producer_warps=4, dq_buffers=0),
    256: KeyTileConfig(block_m=64, warps=8, dsplit=2, stages=2, producer_warps=4, dq_buffers=0),
}
#: Head dims of the warp-specialised backward's wide build (64-key CTAs; on a prefix tree its dQ ranks and the tree
#: table's ancestor blocks count 64-key blocks: launch.make_tree_plan).
WS_WIDE_HEAD_DIMS = (192, 256)

#: Hopper dQ kernel (wgmma, sm_90a): two warpgroups of 64 query rows, 64-key blocks, double-buffered K/V.
SM90_DQ_TILES: dict[int, TileConfig] = {
    64: TileConfig(block_n=64, warps=8, mslabs=1),
    96: TileConfig(block_n=64, warps=8, mslabs=1),
    128: TileConfig(block_n=64, warps=8, mslabs=1),
}

#: The first wgmma kernels (fwd_sm90, bwd_dq_sm90, bwd_dkdv_sm90) keep their tiles in 64-column 128-byte-swizzle
#: atoms, so a head dim that is not a multiple of 64 gets whole atoms in shared memory: its tiles and output
#: accumulators have :func:`tile_head_dim` columns, the loads fill the first ``head_dim`` of them, the products over
#: the head dim take ``head_dim / 16`` k-steps, and the products whose N is the head dim run at the padded N (the
#: extra output columns are dropped). ``csrc/sm90.cuh`` states the argument; dualkv/cuda/swizzle.py models it.
WGMMA_V1_KERNELS = ("fwd_sm90", "bwd_dq_sm90", "bwd_dkdv_sm90")


def tile_head_dim(head_dim: int) -> int:
    """Columns of a wgmma_v1 or warp-specialised (TMA) kernel's shared-memory tile for ``head_dim``: whole 64-column
    swizzle atoms (96 -> 128)."""
    return -(-head_dim // 64) * 64



def check_tile_tables(sm90_dkdv: dict = SM90_DKDV_TILES, sm90_dq: dict = SM90_DQ_TILES) -> None:
    """The plan's tile tables are built for DQ_TILES / DKDV_TILES, so the wgmma kernels must take the same tiles
    (checked at import; an exception, not an ``assert`` that ``python -O`` would drop)."""
    for d, tile in sm90_dkdv.items():
        if tile.block_keys != DKDV_TILES[d].block_keys:
            raise ValueError(f"SM90_DKDV_TILES[{d}] has {tile.block_keys} keys per CTA but DKDV_TILES[{d}] "
                             f"{DKDV_TILES[d].block_keys}: the dK/dV schedule is shared")
    for d, tile in sm90_dq.items():
        if tile.block_m != DQ_TILES[d].block_m:
            raise ValueError(f"SM90_DQ_TILES[{d}] has {tile.block_m} query rows per CTA but DQ_TILES[{d}] "
                             f"{DQ_TILES[d].block_m}: the dQ schedule is shared")


check_tile_tables()

KERNELS = ("fwd", "fwd_sm90", "fwd_sm90_ws", "bwd_prep", "bwd_dq", "bwd_dq_sm90", "bwd_dkdv", "bwd_dkdv_sm90",
           "bwd_sm90_ws", "bwd_dq_cast", "bwd_dq_frag_cast")
#: The backward's preprocessing kernel (D = rowsum(dO * O), LSE in log2): up to 8 threads per row, no tiles; the
#: warp-specialised backward's dQ cast uses the same (one thread per 8 output elements).
PREP_TILE = TileConfig(block_n=16, warps=8, mslabs=1)
#: Hopper-only (sm_90a) kernels and the head dims they exist for.
SM90_KERNELS = {"fwd_sm90": tuple(SM90_FWD_TILES), "fwd_sm90_ws": tuple(SM90_WS_FWD_TILES),
                "bwd_dq_sm90": tuple(SM90_DQ_TILES), "bwd_dkdv_sm90": tuple(SM90_DKDV_TILES),
                "bwd_sm90_ws": tuple(SM90_WS_BWD_TILES)}
#: Kernels whose K/V (and Q) arrive by TMA: launched with tensor maps (dualkv/cuda/tma.py).
TMA_KERNELS = ("fwd_sm90_ws", "bwd_sm90_ws")
#: Kernels with a prefix-tree specialization (``KernelSpec.tree``: a segment's context is its ancestors' runs). The
#: dK/dV kernels need none: their key tiles list a node's descendants as dependent segments
#: (dualkv/cuda/tree_schedule.py); only the mma.sync one's ordered dQ mode has a tree build (its dQ ranks). The warp-specialised backward's tree mode only changes its dQ order (ranks over
#: the ancestor chain, dualkv/cuda/ws_schedule.py) and its dQ counters (one per query tile's first token).
TREE_KERNELS = ("fwd", "fwd_sm90", "fwd_sm90_ws", "bwd_dq", "bwd_dq_sm90", "bwd_sm90_ws")
#: Which kernel family runs where several exist: "auto" (on sm_90 the fastest measured Hopper kernels: the
#: warp-specialised TMA forward, and the one-kernel warp-specialised backward — five products, deterministic dQ —
#: where it exists, else the wgmma dQ and dK/dV kernels), "wgmma_v1" (the first wgmma kernels: cp.async loads, no
#: warp specialisation, two-kernel backward), "mma" (the mma.sync kernels everywhere, what sm_80 runs).
KERNEL_FAMILIES = ("auto", "wgmma_v1", "mma")
_family = [os.environ.get("DUALKV_KERNELS") or "auto"]  # unset or empty: auto


class _Switch:
    """A process-wide choice: a plain call sets it for the rest of the process; used as a context manager it also
    restores the previous choice when the block ends. Subclasses name the store, the choices and the setting."""

    _value: list[str]
    _choices: tuple[str, ...]
    _what: str

    def __init__(self, choice: str):
        if choice not in self._choices:
            raise ValueError(f"{self._what} must be one of {self._choices}, got {choice!r}")
        self.previous = self._value[0]
        self._value[0] = choice

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._value[0] = self.previous


class kernel_family(_Switch):  # noqa: N801 - used like a function: kernel_family("mma")
    """Choose the kernel family (one of :data:`KERNEL_FAMILIES`; the initial value comes from ``$DUALKV_KERNELS``),
    e.g. to run the mma.sync kernels on a Hopper GPU.

    A plain call sets it for the rest of the process (``kernel_family("mma")``); used as a context manager
    (``with kernel_family("mma"): ...``) it also restores the previous family when the block ends.
    """

    _value, _choices, _what = _family, KERNEL_FAMILIES, "kernel family"


def current_kernel_family() -> str:
    """The family in force (see :class:`kernel_family`)."""
    return _family[0]


#: The backward of the mma.sync kernels: "auto" (the default: wherever the mma.sync dK/dV kernel serves a call anyway
#: (sm_80/86/89, or ``kernel_family("mma")``), causal deterministic calls at head dims :data:`AUTO_ORDERED_HEAD_DIMS`
#: without a window run "ordered" and ``deterministic=False`` calls at :data:`AUTO_ATOMIC_HEAD_DIMS` "atomic"; "split" elsewhere),
#: "split" (the dQ kernel and the dK/dV kernel, seven
#: products per query tile x key block, for every call), "ordered" (dQ inside the dK/dV kernel, five products, added
#: in a fixed order: DKV_DQ_ORDERED; head dims :data:`ORDERED_HEAD_DIMS`, no window; every call) or "atomic"
#: (``deterministic=False`` calls add dQ by fp32 atomics inside the dK/dV kernel, five products, FlashAttention-2's
#: scheme; head dims :data:`ATOMIC_HEAD_DIMS`; deterministic calls run the split backward; on sm_90 it also replaces
#: the wgmma dQ + dK/dV pair).
MMA_BACKWARDS = ("auto", "split", "ordered", "atomic")
#: Head dims where "auto" sends ``deterministic=False`` calls to the atomic dQ: where it measured faster than the split
#: backward (or tied, at the smallest shape). H100 under ``kernel_family("mma")`` (the Ampere stand-in), backward ms,
#: atomic against split, one process per head dim, after the row-run dQ adds (experiments/results/
#: kernel-20261127-235319.json and kernel-h32-8-d{32,64,96}-20261127-235*.json):
#:   d = 128 at (28, 4K), (8, 8K), (16, 32K), (16, 64K): 53.2 / 53.2, 31.2 / 32.1, 250.1 / 271.2, 656.3 / 716.0;
#:   at (8, 8K), (16, 32K): d = 96 27.9 / 28.6, 219.6 / 236.6; d = 64 17.8 / 18.7, 136.0 / 149.3;
#:   d = 32 13.7 / 12.0, 101.4 / 91.9 (slower: not here).
#: The atomic dQ's fp32 accumulator (fragment order, dq_layout.py, cast by one kernel) adds 0.4-1.5 GiB to the split
#: backward's peak memory, below the FA2 cascade's: 5.3 / 3.8 / 7.8 GiB at (16, 64K) (kernel-20261128-023405.json).
AUTO_ATOMIC_HEAD_DIMS = (64, 96, 128)
#: Head dims where "auto" sends causal deterministic calls (no window) to the ordered dQ: where it measured faster than
#: the split backward (at d = 64 by 0.7-3.6%, one run; non-causal calls were not timed and keep the split). H100 under
#: ``kernel_family("mma")``, backward ms, ordered against split, one process per head dim
#: (experiments/results/checks/ordtable-h100-20261128T0652Z.json):
#:   d = 128 at (28, 4K), (8, 8K), (16, 32K), (16, 64K): 51.03 / 53.16, 31.35 / 31.58, 266.45 / 273.09, 698.46 / 721.91
#:   (fwd+bwd 66.52 / 69.30, 39.81 / 40.57, 350.14 / 355.40, 918.15 / 943.04);
#:   at (16, 4K), (8, 8K), (16, 32K): d = 96 25.67 / 28.60, 26.51 / 28.74, 221.32 / 238.12; d = 64 17.84 / 18.51,
#:   18.46 / 18.59, 150.20 / 151.55; d = 32 13.58 / 12.95, 13.91 / 12.14, 112.55 / 92.21 (slower: not here).
#: On prefix trees too (the #14 workloads a, b, c, fwd+bwd ms, ordered / split, two runs each, alternating processes,
#: checks/mmatrees-h100-20261128T0706Z.json): 244.8, 247.2 / 274.3, 270.4; 35.2, 35.2 / 37.8, 37.8; 10.2, 9.9 / 10.3,
#: 10.3 (peak memory 12.1 / 9.6 GiB on a).
#: Its fp32 dQ accumulator adds to the split backward's peak memory as the atomic mode's does, still below the FA2
#: cascade's: 5.3 / 3.8 / 7.8 GiB at (16, 64K).
AUTO_ORDERED_HEAD_DIMS = (64, 96, 128)
_mma_backward = [os.environ.get("DUALKV_MMA_BWD") or "auto"]  # unset or empty: auto


class mma_backward(_Switch):  # noqa: N801 - used like a function: mma_backward("ordered")
    """Choose the mma.sync kernels' backward (one of :data:`MMA_BACKWARDS`; the initial value comes from
    ``$DUALKV_MMA_BWD``). "ordered" applies wherever the mma.sync dK/dV kernel runs (sm_80/86/89; on sm_90 d = 32,
    or everything under ``kernel_family("mma")``); "atomic" to every ``deterministic=False`` call that neither the
    warp-specialised backward nor the hybrid path serves (on sm_90 it then replaces the first wgmma dQ + dK/dV pair,
    e.g. with a window); "auto" (the default) to the calls that the mma.sync dK/dV kernel serves anyway: "ordered" for
    causal deterministic ones at :data:`AUTO_ORDERED_HEAD_DIMS` without a window, "atomic" for ``deterministic=False`` ones at
    :data:`AUTO_ATOMIC_HEAD_DIMS`. A plain call sets it for the process; a ``with`` block restores the previous
    choice."""

    _value, _choices, _what = _mma_backward, MMA_BACKWARDS, "mma backward"


#: Prefix trees' dQ order in the deterministic backwards that add dQ in a fixed order (the warp-specialised Hopper
#: backward and the mma.sync ordered dQ mode): "root" (the default: a query tile's root's blocks first, its own last;
#: shallower nodes launched first, each node's tiles together: dualkv/cuda/ws_schedule.py) or "nearest" (its own
#: blocks first, then its nearest ancestor's, ... the root's last; deeper nodes launched first). "root" is the
#: default because it was faster on every tree measured (H100: docs/trees.md). Read ONCE, at import, from
#: ``$DUALKV_TREE_DQ_ORDER``: a tree plan's launch order and the kernels' ranks must agree, and plans are cached.
TREE_DQ_ORDERS = ("root", "nearest")


def _choice_from_env(name: str, choices: tuple[str, ...]) -> str:
    """``$name``, the first of ``choices`` when unset or empty; any other value raises, naming the variable."""
    choice = os.environ.get(name, "") or choices[0]
    if choice not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {choice!r}")
    return choice


def _tree_dq_order_from_env() -> str:
    return _choice_from_env("DUALKV_TREE_DQ_ORDER", TREE_DQ_ORDERS)


TREE_DQ_ORDER = _tree_dq_order_from_env()

#: The mma.sync dK/dV kernel's warp layout at the head dims without a d-split (:attr:`KeyTileConfig.qwarps`), read
#: ONCE, at import, from ``$DUALKV_MMA_BWD_QWARPS`` ("default": the table's; "1": each warp owns 16 keys; "2":
#: FlashAttention-2-like layouts; "2do1": those with one dO buffer, as the sm_80 builds at head dim 128); an A/B
#: switch over :data:`DKDV_TILES` at the head dims without a d-split.
MMA_BWD_QWARPS = _choice_from_env("DUALKV_MMA_BWD_QWARPS", ("default", "1", "2", "2do1"))
if MMA_BWD_QWARPS != "default":
    DKDV_TILES.update({d: replace(t, qwarps=1 if MMA_BWD_QWARPS == "1" else 2,
                                  do_stages=1 if MMA_BWD_QWARPS == "2do1" and t.stages == 2 else 0)
                       for d, t in DKDV_TILES.items() if t.dsplit == 1})
#: Whether this process runs the root-first tree dQ order (``TREE_DQ_ORDER == "root"``).
TREE_DQ_ROOT_FIRST = TREE_DQ_ORDER == "root"

#: The launch order of the key tiles of the backwards that add dQ in a fixed order (warp-specialised; mma.sync
#: ordered dQ): "node" (the default: each segment's, node's or separate context's tiles adjacent, blocks in order,
#: so the CTAs running together sweep the same query tiles and reuse them from L2) or "heaviest" (the heaviest-first
#: table, whose equal-weight tiles of different segments interleave — block 0 of every prompt, then block 1, ...).
#: Only the launch order changes: the dQ ranks, hence the bits, do not. "node" is the default because it was faster
#: on every micro-batch measured (H100: 1.41x on four groups of P=8K). Read ONCE, at import, from
#: ``$DUALKV_KEY_TILE_ORDER`` (plans are cached). The root-first tree order is always node-major.
KEY_TILE_ORDERS = ("node", "heaviest")


def _key_tile_order_from_env() -> str:
    return _choice_from_env("DUALKV_KEY_TILE_ORDER", KEY_TILE_ORDERS)


KEY_TILES_NODE_MAJOR = _key_tile_order_from_env() == "node"


#: Two-level layouts' dQ order in the same backwards: "shared" (the default: a dependent's tile receives the shared
#: keys' blocks first, then its own causal blocks — a depth-1 tree's root-first order; the shared-key tiles, the
#: heaviest, launched first, and the warp-specialised backward's head-major CTA order split after them, so every KV
#: head's heavy tiles start before any light own-response tile: Plan.ws_first_tiles) or "own" (a dependent's tile
#: receives its own causal blocks first; own-response tiles launched first). Built as the DKV_TREE_ROOT_FIRST=1 builds
#: without DKV_TREE. Both are deterministic; they round dQ differently. "shared" is the default since it measured
#: faster (H200, bwd ms own -> shared, own processes, experiments/results/checks/s25split-h200-20261129T0110Z.log): WS
#: backward (28, 4K) 26.9 -> 24.9, (8, 8K) 15.8 -> 15.2, (16, 32K) 127.8 -> 125.7, (8, 2K) 6.7 -> 5.2, (16, 1K)
#: 9.6 -> 8.5; mma.sync ordered (16, 1K) 16.6 -> 12.1, within 1% elsewhere (235.4 -> 237.6 at (16, 32K)). Read ONCE, at
#: import, from ``$DUALKV_TWO_LEVEL_DQ_ORDER``.
TWO_LEVEL_DQ_ORDERS = ("shared", "own")


def _two_level_dq_order_from_env() -> str:
    return _choice_from_env("DUALKV_TWO_LEVEL_DQ_ORDER", TWO_LEVEL_DQ_ORDERS)


TWO_LEVEL_SHARED_FIRST = _two_level_dq_order_from_env() == "shared"

#: The warp-specialised backward's CTA order on two-level layouts: "head" (the default: each KV head's key-tile table in
#: turn, so the CTAs running together sweep the Q / dO / dQ rows of one KV head's query heads; split after the plan's
#: ws_first_tiles rows, which under the shared-first default puts every head's prompt tiles first) or "tile" (a key
#: tile's KV heads adjacent). A launch order only: every dQ counter still receives its tiles in table order, so the bits
#: do not change. "head" is the default because it was faster or tied on every two-level layout measured (H100,
#: experiments/results/checks/order-bench-headmajor-h100-20261127T0503Z.json: 4 groups x (8, 8K) 89.4 -> 83.8 ms, 8
#: groups x (8, 4K) 95.5 -> 85.0, (16, 32K) 186.9 -> 185.3; order-bench-wsdefaults-h100-20261127T0530Z.json, built as
#: the default: 88.2 -> 81.1, 94.9 -> 83.0, 187.1 -> 182.0, (8, 8K) 21.0 -> 21.0). Prefix trees always run "tile":
#: "head" made tree (a) 1.7x slower there (each KV head's dependency chains then run one after another). Read ONCE, at
#: import, from ``$DUALKV_WS_CTA_ORDER`` (the cubins are cached per specialization).
WS_CTA_ORDERS = ("head", "tile")


def _ws_cta_order_from_env() -> str:
    return _choice_from_env("DUALKV_WS_CTA_ORDER", WS_CTA_ORDERS)


WS_HEAD_MAJOR = _ws_cta_order_from_env() == "head"

#: The split shared-key tiles (:mod:`dualkv.cuda.ws_split`) of the backwards whose dQ adds in a fixed order (the
#: warp-specialised one; the mma.sync ordered dQ mode) on two-level layouts under the shared-first dQ order: "auto" (the
#: default: each shared-key tile cut into :func:`~dualkv.cuda.ws_split.split_parts` CTAs when the shared-key CTAs alone
#: would not fill the GPU: short prompts, long responses), "off", or a number N (2 to 8; for tests and A/B): at most N
#: parts, no more than the fewest dependents of a shared-key tile, also where "auto" would not split (each partial row
#: then takes a 128 KiB fp32 slot per KV head at d = 128). dQ keeps its bits; dK / dV of the split tiles are summed in a
#: fixed order (bitwise reproducible, rounded differently from "off"). "auto" is the default because it made the WS
#: backward 19-48% faster at nine of ten one-group shapes with P = 256-1K measured, and 1.5% / 23% in the two runs of
#: the tenth, (4, 1K) (H200, ws_split's docstring), and changes nothing where the shared-key CTAs fill the GPU. Read
#: ONCE, at import, from ``$DUALKV_WS_SPLIT`` (plans are cached).
WS_SPLITS = ("auto", "off", "2", "3", "4", "5", "6", "7", "8")
WS_SPLIT = _choice_from_env("DUALKV_WS_SPLIT", WS_SPLITS)

#: The mma.sync dK/dV kernel's CTA order in its ordered dQ mode on two-level layouts (a launch argument, no rebuild):
#: "tile" (a key tile's KV heads adjacent) or "head" (the warp-specialised backward's head-major order with its split,
#: :attr:`dualkv.cuda.launch.Plan.ws_first_tiles`). Prefix trees always run "tile". A launch order only: the bits do
#: not change (checked on the GPU). "tile" stays the default: "head" measured no faster at (28, 4K) / (8, 8K) /
#: (16, 32K) and 35% slower at (16, 1K) (H200, checks/s25mma-h200-20261129T0131Z.log). Read ONCE, at import, from
#: ``$DUALKV_MMA_CTA_ORDER``.
MMA_CTA_ORDERS = ("tile", "head")


def _mma_cta_order_from_env() -> str:
    return _choice_from_env("DUALKV_MMA_CTA_ORDER", MMA_CTA_ORDERS)


MMA_HEAD_MAJOR = _mma_cta_order_from_env() == "head"


def current_mma_backward() -> str:
    """The mma.sync backward in force (see :class:`mma_backward`); an unknown ``$DUALKV_MMA_BWD`` raises, naming it."""
    choice = _mma_backward[0]
    if choice not in MMA_BACKWARDS:
        raise ValueError(f"DUALKV_MMA_BWD must be one of {MMA_BACKWARDS}, got {choice!r}")
    return choice


def dq_atomic_for(head_dim: int, deterministic: bool, arch: str) -> bool:
    """Whether a backward that the warp-specialised kernel does not serve adds dQ by fp32 atomics in the mma.sync
    dK/dV kernel (``arch``: the device's): ``deterministic=False``, a head dim of :data:`ATOMIC_HEAD_DIMS`, and
    ``mma_backward("atomic")`` chosen, or "auto" at :data:`AUTO_ATOMIC_HEAD_DIMS` where the mma.sync dK/dV kernel
    serves the call anyway (see :data:`MMA_BACKWARDS`)."""
    choice = current_mma_backward()
    if deterministic or head_dim not in ATOMIC_HEAD_DIMS:
        return False
    if choice == "auto":
        return head_dim in AUTO_ATOMIC_HEAD_DIMS and dkdv_kernel_for(head_dim, arch) == "bwd_dkdv"
    return choice == "atomic"


def dq_ordered_for(head_dim: int, arch: str, window: bool, *, deterministic: bool, causal: bool) -> bool:
    """Whether a backward runs the ordered dQ mode: no window, the mma.sync dK/dV kernel serving the call (two-level
    layouts and prefix trees alike), and either ``mma_backward("ordered")`` at a head dim of :data:`ORDERED_HEAD_DIMS`
    (every call) or "auto" (the default) for a causal deterministic call at :data:`AUTO_ORDERED_HEAD_DIMS` (its
    non-causal build was not timed against the split backward)."""
    choice = current_mma_backward()
    auto = AUTO_ORDERED_HEAD_DIMS if deterministic and causal else ()
    dims = {"ordered": ORDERED_HEAD_DIMS, "auto": auto}.get(choice, ())
    return head_dim in dims and not window and dkdv_kernel_for(head_dim, arch) == "bwd_dkdv"


def _use_sm90(kernel: str, head_dim: int, arch: str) -> bool:
    choice = _family[0]
    if choice not in KERNEL_FAMILIES:
        raise ValueError(f"DUALKV_KERNELS must be one of {KERNEL_FAMILIES}, got {choice!r}")
    if kernel in TMA_KERNELS and choice != "auto":
        return False
    return choice != "mma" and arch == "sm_90" and head_dim in SM90_KERNELS[kernel]


#: (arch, head dim) -> path, where an exact composition with cuDNN's attention was measured faster than the fused
#: kernels with ``deterministic=False``, without a window (experiments/results/, README "Kernels"): such calls route
#: there — the dispatch floor. The deterministic default stays on the fused kernels: the cascade's cross-part
#: backward (cuDNN, non-causal) is not bitwise reproducible run to run (measured on an H100).
#: - head dim 128: "hybrid", the fused forward (the faster forward) with the cascade's cuDNN backward (the faster
#:   backward). H100, fwd+bwd ms hybrid / cascade, same run (experiments/results/checks/hybrid-*-h100-20261127T0226Z
#:   .json): (16, 32K) 174.7 / 174.1, (8, 8K) 21.8 / 22.4, (28, 4K) 36.3 / 40.2, four groups of (8, 8K) 85.8 / 88.6;
#:   peak memory lower at all four.
#: - head dim 64: "hybrid" too. H100, fwd+bwd ms at (16, 4K), (8, 8K), (16, 32K), same run, hybrid / cascade / the
#:   fused kernels (deterministic warp-specialised backward): 13.2 / 14.0 / 14.4, 13.0 / 13.4 / 14.2, 108.4 / 108.3 /
#:   113.7 (kernel-h32-8-d64-20261127-090307.json); at f13e26b hybrid / cuDNN cascade / fused 13.4 / 14.3 / 14.6,
#:   13.6 / 13.9 / 14.1, 111.6 / 109.5 / 116.6 (kernel-h32-8-d64-20261127-093812.json; c51933e alike, checks/
#:   kernel-d64-h100-20261127T0926Z-c51933e.log): the hybrid is the faster at the two smaller shapes, the cascade by
#:   2-3% at (16, 32K).
#: - head dim 96: no entry, the fused kernels: with the warp-specialised forward and dQ rows of 96 columns they are
#:   as fast as the hybrid or faster, deterministic, with the lower peak memory. At f13e26b, fused / hybrid / cuDNN
#:   cascade: 19.7 / 19.6 / 21.6, 19.5 / 19.6 / 20.7, 159.5 / 166.9 / 168.2; peak 2.6 / 3.5 / 3.7 GiB at (16, 32K)
#:   (kernel-h32-8-d96-20261127-093739.json; c51933e alike, checks/kernel-d96-h100-20261127T0926Z-c51933e.log).
#: - head dims 192 and 256: no entry since the warp-specialised backward serves them (csrc/bwd_sm90_ws_wide.cuh).
#:   Before it, the fused backward there was the mma.sync one, 2.0-2.4x slower than the cuDNN cascade's, and these
#:   head dims routed to the hybrid (kernel-h32-8-d256-20261127-154517.json, -d192-20261127-154616.json). H100, one
#:   process per head dim, fwd+bwd ms at (8, 8K), (16, 16K), (16, 32K), fused (deterministic) / hybrid / cuDNN
#:   cascade: d = 192 43.2 / 48.1 / 50.2, 154.0 / 178.9 / 180.9, 360.0 / 415.1 / 412.4 (cdb0def, kernel-h32-8-d192-
#:   20261127-184057.json); d = 256 54.7 / 55.6 / 57.7, 202.7 / 204.5 / 207.5, 463.6 / 467.2 / 471.6 (e77ca1a,
#:   kernel-h32-8-d256-20261127-185057.json); the fused backward the fastest at all six.
#: - On an H200 at the shared-first default (7227113) the fused kernels beat the hybrid at 128 at (16, 4K), (8, 8K),
#:   (16, 32K): fwd+bwd 19.50 / 19.62 / 168.91 ms against 20.83 / 20.84 / 169.91, with less memory; at 64 the two are
#:   within 2% (12.92 / 13.04 / 109.01 against 13.14 / 12.93 / 108.50) (experiments/results/checks/s25floor-h200-
#:   20261129T0145Z.log). The 128 entry stays until an H100, where it was measured, says the same.
CASCADE_FASTER = {("sm_90", 128): "hybrid", ("sm_90", 64): "hybrid"}
#: Head dims above 128 that the cuDNN cascade serves on an arch (measured and GPU-tested: 192 and 256 on Hopper);
#: up to 128 it serves every head dim, and any other is left to the fused kernels.
CASCADE_WIDE_HEAD_DIMS = {"sm_90": (192, 256)}


def cascade_serves(arch: str, head_dim: int) -> bool:
    """Whether the cuDNN cascade (and so the hybrid) takes this head dim on this arch."""
    return head_dim <= 128 or head_dim in CASCADE_WIDE_HEAD_DIMS.get(arch, ())


#: ``$DUALKV_PATH``: "auto" (the rule above), "fused" (always the kernels), "cascade" (always the cascade where it
#: applies: CUDA fp16/bf16, :func:`cascade_serves`' head dims, no window), "hybrid"
#: (the fused forward with the cascade's cuDNN backward, dualkv.cuda.hybrid, where the cascade applies).
PATHS = ("auto", "fused", "cascade", "hybrid")
_path: list[str | None] = [None]  # set by path_override; None: $DUALKV_PATH decides (read at every call)


class path_override(_Switch):  # noqa: N801 - used like a function: path_override("hybrid")
    """Choose the attention path in process (one of :data:`PATHS`), over ``$DUALKV_PATH``: what
    :func:`attention_path` reads first. ``$DUALKV_PATH`` stays the user-facing setting; this is for code that picks a
    path for a block of its own (the ``dualkv_hybrid`` benchmark system) without writing to ``os.environ``.

    A plain call sets it for the rest of the process; used as a context manager (``with path_override("hybrid"):
    ...``) it also restores the previous choice (none: ``$DUALKV_PATH`` again) when the block ends, also on an
    exception.
    """

    _value, _choices, _what = _path, PATHS, "attention path"


def current_path() -> str:
    """The path choice in force: the :class:`path_override` if one is set, else ``$DUALKV_PATH`` (``"auto"`` when
    unset or empty), unchecked (:func:`attention_path` checks it)."""
    return _path[0] if _path[0] is not None else (os.environ.get("DUALKV_PATH") or "auto")


def attention_path(arch: str, head_dim: int, window: bool, deterministic: bool) -> str:
    """"fused", "cascade" or "hybrid" for a shared_prefix_attention call (see :data:`CASCADE_FASTER`), under the
    choice in force (:func:`current_path`)."""
    choice = current_path()
    if choice not in PATHS:
        raise ValueError(f"DUALKV_PATH must be one of {PATHS}, got {choice!r}")
    if window or not cascade_serves(arch, head_dim) or choice == "fused":
        return "fused"
    if choice in ("cascade", "hybrid"):
        return choice
    return CASCADE_FASTER.get((arch, head_dim), "fused") if not deterministic else "fused"


def forward_kernel_for(head_dim: int, arch: str) -> str:
    """The forward of the chosen family: ``"fwd_sm90_ws"`` (warp-specialised, TMA) or ``"fwd_sm90"`` (wgmma) where
    they exist on this arch and head dim, else ``"fwd"`` (mma.sync)."""
    for kernel in ("fwd_sm90_ws", "fwd_sm90"):
        if _use_sm90(kernel, head_dim, arch):
            return kernel
    return "fwd"


def ws_backward_for(head_dim: int, arch: str, window: bool, causal: bool = True, tree: bool = False) -> bool:
    """Whether the fused warp-specialised backward (dK, dV and dQ in one kernel; causal, no window) serves this
    call: the same rule for prefix trees (``tree``: its DKV_TREE=1 build) as for the two-level layouts. The
    ``wgmma_v1`` family (:class:`kernel_family`) keeps the two-kernel wgmma dQ + dK/dV backward, for comparison."""
    return causal and not window and _use_sm90("bwd_sm90_ws", head_dim, arch)


def dq_kernel_for(head_dim: int, arch: str) -> str:
    """``"bwd_dq_sm90"`` where the wgmma dQ kernel exists and is chosen, else ``"bwd_dq"``."""
    return "bwd_dq_sm90" if _use_sm90("bwd_dq_sm90", head_dim, arch) else "bwd_dq"


def dkdv_kernel_for(head_dim: int, arch: str, dq_atomic: bool = False) -> str:
    """``"bwd_dkdv_sm90"`` where the wgmma dK/dV kernel exists and is chosen (deterministic mode), else
    ``"bwd_dkdv"``."""
    return "bwd_dkdv_sm90" if not dq_atomic and _use_sm90("bwd_dkdv_sm90", head_dim, arch) else "bwd_dkdv"


def forward_tile(kernel: str, head_dim: int) -> TileConfig:
    return {"fwd_sm90": SM90_FWD_TILES, "fwd_sm90_ws": SM90_WS_FWD_TILES}.get(kernel, FWD_TILES)[head_dim]


@dataclass(frozen=True)
class KernelSpec:
    """One compiled specialization."""

    kernel: str          # "fwd" | "bwd_dq" | "bwd_dkdv"
    head_dim: int
    dtype: str           # "bf16" | "fp16"
    tile: "TileConfig | KeyTileConfig"
    pack: int
    window: bool
    arch: str
    dq_atomic: bool = False  # bwd_dkdv only: also accumulate dQ with fp32 atomics (non-deterministic mode)
    causal: bool = True      # False: a segment's own keys are all visible (DKV_CAUSAL=0; no window)
    tree: bool = False       # TREE_KERNELS: prefix-tree segments, context = a list of runs (DKV_TREE=1)
    dq_ordered: bool = False  # bwd_dkdv only: also accumulate dQ, in a fixed order (deterministic; DKV_DQ_ORDERED)
    root_first: bool = False  # ordered-dQ backwards: the root-first (tree) / shared-first (two-level) dQ order
    head_major: bool = False  # bwd_sm90_ws only: each KV head's key-tile table launched in turn (DKV_HEAD_MAJOR)
    split_tiles: bool = False  # ordered dQ mode only: the build that sums split shared-key tiles (DKV_SPLIT_TILES)

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"unknown kernel {self.kernel!r}")
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim {self.head_dim} is not supported by the CUDA kernels (supported: {HEAD_DIMS})")
        if self.window and not self.causal:
            raise ValueError("sliding windows are built for causal kernels only")
        if self.window and self.head_dim not in WINDOW_HEAD_DIMS:
            raise ValueError(f"sliding windows are supported for head dims {WINDOW_HEAD_DIMS}, not {self.head_dim}")
        if self.dq_atomic and (self.kernel != "bwd_dkdv" or self.head_dim not in ATOMIC_HEAD_DIMS):
            raise ValueError(f"the atomic dQ mode exists for the dK/dV kernel at head dims {ATOMIC_HEAD_DIMS}")
        if self.dq_ordered:
            self._check_dq_ordered()
        if self.kernel == "bwd_dkdv" and (self.tile.qwarps != 1 or self.tile.do_stages):
            self._check_qwarps()
        if self.tree and (self.kernel not in TREE_KERNELS + (("bwd_dkdv",) if self.dq_ordered else ())
                          or self.window or not self.causal):
            raise ValueError(f"prefix-tree specializations exist for the kernels {TREE_KERNELS}, causal, "
                             f"without a window (got {self.kernel}, window={self.window}, causal={self.causal})")
        if self.kernel in SM90_KERNELS and (self.arch != "sm_90a" or self.head_dim not in SM90_KERNELS[self.kernel]):
            raise ValueError(f"{self.kernel} is built for sm_90a at head dims {SM90_KERNELS[self.kernel]}")
        if self.root_first and not (self.kernel == "bwd_sm90_ws" or self.dq_ordered):
            raise ValueError("the root-first (shared-first) dQ order is built for the warp-specialised backward and "
                             "the ordered dQ mode only")
        if self.split_tiles and not (self.dq_ordered and not self.tree):
            raise ValueError(f"the split shared-key tiles have a build of the two-level ordered dQ mode only, not "
                             f"{self.kernel} with dq_ordered={self.dq_ordered}, tree={self.tree}")
        if self.head_major and self.kernel != "bwd_sm90_ws":
            raise ValueError(f"the head-major CTA order is built for the warp-specialised backward only, not "
                             f"{self.kernel}")

    def _check_qwarps(self) -> None:
        t = self.tile
        if t.qwarps != 2 or t.dsplit != 1 or t.block_m % 32:
            raise ValueError(f"the dK/dV kernel's FA2-like layout takes qwarps=2 without a d-split and query steps of a "
                             f"multiple of 32 (two warps of 16-row slabs): got {t}")
        if t.do_stages not in (0, t.stages) and not (t.do_stages == 1 and t.stages == 2):
            raise ValueError(f"one dO buffer (do_stages=1) goes with two Q stages: got {t}")

    def _check_dq_ordered(self) -> None:
        if self.kernel != "bwd_dkdv" or self.head_dim not in ORDERED_HEAD_DIMS:
            raise ValueError(f"the ordered dQ mode exists for the dK/dV kernel at head dims {ORDERED_HEAD_DIMS}, "
                             f"not {self.kernel} at {self.head_dim}")
        if self.dq_atomic:
            raise ValueError("a dK/dV specialization has one dQ mode: atomic or ordered, not both")
        if self.window:
            raise ValueError("the ordered dQ mode has no sliding window (its ranks would differ): windowed backwards "
                             "keep the separate dQ kernel")
        if self.tree and (not self.causal or self.tile.block_keys != RANK_BLOCK_KEYS):
            raise ValueError(f"the ordered dQ mode's tree build is causal, with key blocks of {RANK_BLOCK_KEYS} (the "
                             "tree table's ancestor block counts)")
        if self.tile.block_keys % self.tile.block_m:
            raise ValueError(f"the ordered dQ mode needs key blocks of whole query steps: {self.tile.block_keys} "
                             f"keys per CTA, {self.tile.block_m} queries per step")

    @property
    def source(self) -> str:
        return f"{self.kernel}.cu"

    @property
    def entry(self) -> str:
        return f"dualkv_{self.kernel}"

    @property
    def threads(self) -> int:
        return self.tile.threads

    @property
    def smem_bytes(self) -> int:
        row = (self.head_dim + 8) * 2
        t = self.tile
        if self.kernel in ("bwd_prep", "bwd_dq_cast", "bwd_dq_frag_cast"):
            return 0
        if self.kernel == "fwd":
            return (t.block_m + 2 * t.block_n) * row
        if self.kernel == "fwd_sm90":  # swizzled Q + two stages of K and V (whole atoms), 1 KB alignment slack
            return (t.block_m + 4 * t.block_n) * self.tile_head_dim * 2 + 1024
        if self.kernel == "fwd_sm90_ws":  # swizzled Q + `stages` stages of K and V, mbarriers, 1 KB alignment slack
            return (t.block_m + 2 * t.stages * t.block_n) * self.tile_head_dim * 2 + 8 * (1 + 4 * t.stages) + 1024
        if self.kernel == "bwd_dq":
            return (2 * t.block_m + 2 * t.kv_stages * t.block_n) * row
        if self.kernel == "bwd_dq_sm90":  # swizzled Q, dO + two stages of K and V (whole atoms); 1 KB slack
            return (2 * t.block_m + 4 * t.block_n) * self.tile_head_dim * 2 + 1024
        if self.kernel == "bwd_sm90_ws":  # K, V (and K transposed: WS_TRANSPOSED_K_HEAD_DIMS); Q/dO/LSE/D/step-record
            # stages; dS; fp32 dQ rows; mbarriers
            key_tiles = 3 if self.head_dim in WS_TRANSPOSED_K_HEAD_DIMS else 2
            ds_tiles = 3 if t.dsplit == 2 else 3 - t.dq_buffers  # wide (dsplit 2): P^T, dS^T and dS
            return (key_tiles * t.block_keys * self.tile_head_dim * 2
                    + 2 * t.stages * t.block_m * self.tile_head_dim * 2
                    + ds_tiles * t.block_m * t.block_keys * 2
                    + t.dq_buffers * t.block_m * self.head_dim * 4
                    + 2 * t.stages * t.block_m * 4 + 16 * t.stages + 8 * (1 + 2 * t.stages + 2 * (t.dq_buffers or t.stages))
                    + 1024)
        if self.kernel == "bwd_dkdv_sm90":  # swizzled K, V + `stages` stages of Q, dO, LSE, D; 1 KB alignment slack
            return ((2 * t.block_keys + 2 * t.stages * t.block_m) * self.tile_head_dim * 2
                    + 2 * t.stages * t.block_m * 4 + 1024)
        ds_tile = t.block_keys * (t.block_m + 8) * 2  # dS^T (dQ modes), and P^T (qwarps 2)
        ds_tiles = 2 if t.qwarps != 1 else (1 if self.dq_atomic or self.dq_ordered else 0)
        return ((2 * t.block_keys + (t.stages + (t.do_stages or t.stages)) * t.block_m) * row
                + 2 * t.stages * t.block_m * 4 + ds_tiles * ds_tile)

    @property
    def tile_head_dim(self) -> int:
        """Columns of the kernel's shared-memory tiles and output accumulators (``DKV_HEAD_DIM_ACC``): the head dim,
        or for the wgmma_v1 and the TMA (warp-specialised) kernels whole 64-column swizzle atoms
        (:data:`WGMMA_V1_KERNELS`, :data:`TMA_KERNELS`; head dim 96 -> 128)."""
        padded = self.kernel in WGMMA_V1_KERNELS or self.kernel in TMA_KERNELS
        return tile_head_dim(self.head_dim) if padded else self.head_dim

    def defines(self) -> list[tuple[str, str]]:
        t = self.tile
        common = [("DKV_HEAD_DIM", str(self.head_dim)), ("DKV_WARPS", str(t.warps)), ("DKV_DSPLIT", str(t.dsplit)),
                  ("DKV_BF16", "1" if self.dtype == "bf16" else "0"), ("DKV_WINDOW", "1" if self.window else "0"),
                  ("DKV_CAUSAL", "1" if self.causal else "0")]
        if self.tile_head_dim != self.head_dim:
            common += [("DKV_HEAD_DIM_ACC", str(self.tile_head_dim))]
        if self.kernel in ("bwd_prep", "bwd_dq_cast", "bwd_dq_frag_cast"):
            return common
        if self.kernel in ("bwd_dkdv", "bwd_dkdv_sm90", "bwd_sm90_ws"):
            keys = common + [("DKV_BLOCK_M", str(t.block_m)), ("DKV_STAGES", str(t.stages)),
                             ("DKV_DQ_ATOMIC", "1" if self.dq_atomic else "0")]
            if self.dq_ordered:  # absent otherwise: the other specs keep their compile options
                keys += [("DKV_DQ_ORDERED", "1")] + ([("DKV_TREE", "1")] if self.tree else [])
            if t.qwarps != 1:
                keys += [("DKV_QWARPS", str(t.qwarps))]
            if t.do_stages and t.do_stages != t.stages:
                keys += [("DKV_DO_STAGES", str(t.do_stages))]
            if self.kernel == "bwd_sm90_ws":
                keys += [("DKV_DQ_BUFFERS", str(t.dq_buffers))] + ([("DKV_TREE", "1")] if self.tree else [])
            if self.root_first:
                keys += [("DKV_TREE_ROOT_FIRST", "1")]
            if self.head_major:
                keys += [("DKV_HEAD_MAJOR", "1")]
            if self.split_tiles:
                keys += [("DKV_SPLIT_TILES", "1")]
            return keys
        query = common + [("DKV_BLOCK_N", str(t.block_n)), ("DKV_MSLABS", str(t.mslabs)), ("DKV_PACK", str(self.pack)),
                          ("DKV_OVERLAP", "1" if getattr(t, "overlap", False) else "0")]
        if self.tree:
            query += [("DKV_TREE", "1")]
        if self.kernel == "fwd_sm90_ws":
            query += [("DKV_STAGES", str(t.stages)), ("DKV_PINGPONG", "1" if t.pingpong else "0")]
        if self.kernel == "bwd_dq" and t.kv_stages != 1:  # absent for one buffer: those builds keep their options
            query += [("DKV_KV_STAGES", str(t.kv_stages))]
        return query

    def with_arch(self, arch: str) -> "KernelSpec":
        return replace(self, arch=arch)


def kernel_head_dim(head_dim: int) -> int:
    """The kernel head dim that serves ``head_dim``: the smallest of :data:`HEAD_DIMS` >= it. The launcher zero-pads
    q/k/v up to it (exact: the padded columns add 0 to every score, and their output and gradient columns are
    dropped; the softmax scale stays 1/sqrt(head_dim)). ``head_dim`` must be a multiple of 8 (16-byte rows)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 8 or head_dim % 8 \
            or head_dim > HEAD_DIMS[-1]:
        raise ValueError(f"head_dim {head_dim} is not supported by the CUDA kernels: it must be a multiple of 8 "
                         f"up to {HEAD_DIMS[-1]} (kernel head dims {HEAD_DIMS}; others are zero-padded up)")
    return next(d for d in HEAD_DIMS if d >= head_dim)


def _check_dtype(dtype: torch.dtype) -> str:
    if dtype not in DTYPES:
        raise TypeError(f"the CUDA kernels take float16 or bfloat16, got {dtype}")
    return DTYPES[dtype]


def _check_head_dim(head_dim: int) -> None:
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} is not supported by the CUDA kernels (supported: {HEAD_DIMS})")


def fwd_spec(head_dim: int, dtype: torch.dtype, group_size: int, window: bool, arch: str,
             kernel: str | None = None, causal: bool = True, tree: bool = False) -> KernelSpec:
    """The forward specialization; ``kernel`` defaults to :func:`forward_kernel_for` (``arch`` is the device's)."""
    name = _check_dtype(dtype)
    _check_head_dim(head_dim)
    kernel = kernel or forward_kernel_for(head_dim, arch)
    tile = forward_tile(kernel, head_dim)
    return KernelSpec(kernel, head_dim, name, tile, pack_for(group_size, tile), window,
                      "sm_90a" if kernel in SM90_KERNELS else arch, causal=causal, tree=tree)


def dq_spec(head_dim: int, dtype: torch.dtype, group_size: int, window: bool, arch: str,
            kernel: str | None = None, causal: bool = True, tree: bool = False) -> KernelSpec:
    """The dQ specialization; ``kernel`` defaults to :func:`dq_kernel_for` (``arch`` is the device's)."""
    name = _check_dtype(dtype)
    _check_head_dim(head_dim)
    kernel = kernel or dq_kernel_for(head_dim, arch)
    tile = (SM90_DQ_TILES if kernel == "bwd_dq_sm90" else DQ_TILES)[head_dim]
    return KernelSpec(kernel, head_dim, name, tile, pack_for(group_size, tile), window,
                      "sm_90a" if kernel == "bwd_dq_sm90" else arch, causal=causal, tree=tree)


def ws_bwd_spec(head_dim: int, dtype: torch.dtype, tree: bool = False, root_first: bool = False,
                head_major: bool | None = None) -> KernelSpec:
    """The warp-specialised Hopper backward (sm_90a, no window); ``tree``: its prefix-tree build (DKV_TREE=1),
    ``root_first``: the root-first (tree) or shared-first (two-level) dQ order (DKV_TREE_ROOT_FIRST=1),
    ``head_major``: the head-major CTA order (default: :data:`WS_HEAD_MAJOR` for two-level layouts, never for
    trees)."""
    if head_major is None:
        head_major = WS_HEAD_MAJOR and not tree
    return KernelSpec("bwd_sm90_ws", head_dim, _check_dtype(dtype), SM90_WS_BWD_TILES[head_dim], 1, False, "sm_90a",
                      tree=tree, root_first=root_first, head_major=head_major)


#: Opt-in dynamic shared memory per block (bytes) by compute capability: A100 / Orin 163 KB, the sm_86 / sm_89 / sm_120
#: GPUs 99 KB, Hopper and B200 227 KB. An architecture not listed counts as the smallest.
MAX_SMEM_BY_ARCH = {"sm_80": 166912, "sm_87": 166912, "sm_86": 101376, "sm_89": 101376, "sm_90": 232448,
                    "sm_100": 232448}
#: The most dynamic shared memory an sm_80 build may use (A100: 163 KB per block).
SM80_MAX_SMEM = MAX_SMEM_BY_ARCH["sm_80"]


def max_smem(arch: str) -> int:
    """The opt-in shared memory per block (bytes) of ``arch`` (:data:`MAX_SMEM_BY_ARCH`; unknown: 99 KB)."""
    return MAX_SMEM_BY_ARCH.get(arch, min(MAX_SMEM_BY_ARCH.values()))


def dkdv_tile(head_dim: int, arch: str, dq_here: bool) -> KeyTileConfig:
    """The mma.sync dK/dV kernel's tile at ``head_dim`` on ``arch`` for a build with (``dq_here``: atomic or ordered)
    or without a dQ product: :data:`DKDV_TILES`' entry, but the 16-key warp layout without a dQ product (the FA2-like
    layout's extra P^T tile did not pay there), and where the FA2-like layout passes the architecture's shared memory
    (:func:`max_smem`) one dO buffer, else the 16-key layout (so a GPU the 16-key tile fits keeps a tile: head dim 128
    on an A100 takes one dO buffer, head dim 64 on the 99 KB GPUs the 16-key layout)."""
    tile = DKDV_TILES[head_dim]
    if tile.qwarps == 1:
        return tile
    keys_layout = replace(tile, qwarps=1, do_stages=0)
    if not dq_here:
        return keys_layout
    candidates = [tile] + ([replace(tile, do_stages=1)] if tile.stages == 2 and not tile.do_stages else [])
    for candidate in candidates:
        if KernelSpec("bwd_dkdv", head_dim, "bf16", candidate, 1, False, arch, dq_atomic=True).smem_bytes \
                <= max_smem(arch):
            return candidate
    return keys_layout


def dkdv_spec(head_dim: int, dtype: torch.dtype, window: bool, arch: str, dq_atomic: bool = False,
              kernel: str | None = None, causal: bool = True, dq_ordered: bool = False,
              tree: bool = False, root_first: bool = False, split_tiles: bool = False) -> KernelSpec:
    """The dK/dV specialization; ``kernel`` defaults to :func:`dkdv_kernel_for` (``arch`` is the device's);
    ``dq_ordered``: the mma.sync kernel's ordered dQ mode (``tree``: its prefix-tree build, ``root_first``: with the
    root-first (tree) or shared-first (two-level) dQ order, ``split_tiles``: its build for split shared-key tiles)."""
    name = _check_dtype(dtype)
    _check_head_dim(head_dim)
    kernel = kernel or ("bwd_dkdv" if dq_ordered else dkdv_kernel_for(head_dim, arch, dq_atomic))
    if kernel == "bwd_dkdv_sm90":
        return KernelSpec(kernel, head_dim, name, SM90_DKDV_TILES[head_dim], 1, window, "sm_90a", causal=causal)
    return KernelSpec(kernel, head_dim, name, dkdv_tile(head_dim, arch, dq_atomic or dq_ordered), 1, window, arch,
                      dq_atomic, causal, tree=tree, dq_ordered=dq_ordered, root_first=root_first,
                      split_tiles=split_tiles)


def prep_spec(head_dim: int, dtype: torch.dtype, arch: str) -> KernelSpec:
    """The backward's preprocessing kernel for this head dim and dtype."""
    _check_head_dim(head_dim)
    return KernelSpec("bwd_prep", head_dim, _check_dtype(dtype), PREP_TILE, 1, False, arch)


def dq_cast_spec(head_dim: int, dtype: torch.dtype, arch: str = "sm_90") -> KernelSpec:
    """The dQ cast (fp32 accumulator -> scaled 16-bit dQ) of the warp-specialised backward (sm_90)."""
    _check_head_dim(head_dim)
    return KernelSpec("bwd_dq_cast", head_dim, _check_dtype(dtype), PREP_TILE, 1, False, arch)


def dq_frag_cast_spec(head_dim: int, dtype: torch.dtype, arch: str) -> KernelSpec:
    """The dQ cast of the mma.sync dK/dV kernel's atomic and ordered dQ modes (their fp32 accumulator in fragment
    order, :mod:`dualkv.cuda.dq_layout`)."""
    _check_head_dim(head_dim)
    if head_dim not in ATOMIC_HEAD_DIMS:
        raise ValueError(f"the atomic dQ mode exists at head dims {ATOMIC_HEAD_DIMS}, not {head_dim}")
    return KernelSpec("bwd_dq_frag_cast", head_dim, _check_dtype(dtype), PREP_TILE, 1, False, arch)


def all_specs(arch: str) -> list[KernelSpec]:
    """Every specialization the kernels are built in, for one architecture: causal with and without a window, and
    non-causal (``DKV_CAUSAL=0``, no window), and the prefix-tree mode (``DKV_TREE=1``, causal, no window) of the
    query kernels and, on sm_90, of the warp-specialised backward; the backward's preprocessing kernel once per head
    dim and dtype, the dQ casts of the atomic and ordered dQ modes (and on sm_90 of the warp-specialised backward),
    and the ordered dQ mode of the dK/dV kernel (causal and not, no window; and its tree build)."""
    specs = [prep_spec(d, dtype, arch) for d in HEAD_DIMS for dtype in DTYPES]
    cast_dims = set(SM90_WS_BWD_TILES) if arch == "sm_90" else set()
    specs += [dq_cast_spec(d, dtype, arch) for d in sorted(cast_dims) for dtype in DTYPES]
    specs += [dq_frag_cast_spec(d, dtype, arch) for d in ATOMIC_HEAD_DIMS for dtype in DTYPES]
    for head_dim, dtype, (window, causal, tree) in product(HEAD_DIMS, DTYPES, ((False, True, False), (True, True, False),
                                                                             (False, False, False), (False, True, True))):
        if window and head_dim not in WINDOW_HEAD_DIMS:
            continue
        name = DTYPES[dtype]
        query_kernels = [("fwd", FWD_TILES, arch), ("bwd_dq", DQ_TILES, arch)]
        if arch == "sm_90":
            query_kernels += [("fwd_sm90", SM90_FWD_TILES, "sm_90a"), ("fwd_sm90_ws", SM90_WS_FWD_TILES, "sm_90a"),
                              ("bwd_dq_sm90", SM90_DQ_TILES, "sm_90a")]
        for kernel, tiles, kernel_arch in query_kernels:
            if head_dim not in tiles:
                continue
            for pack in PACKS:
                if tiles[head_dim].block_m // pack >= 8:
                    specs.append(KernelSpec(kernel, head_dim, name, tiles[head_dim], pack, window, kernel_arch,
                                            causal=causal, tree=tree))
        if tree:  # of the key-side kernels the warp-specialised backward and the ordered dQ mode have tree builds
            # (in this process's tree dQ order, TREE_DQ_ORDER)
            if arch == "sm_90" and head_dim in SM90_WS_BWD_TILES:
                specs.append(ws_bwd_spec(head_dim, dtype, tree=True, root_first=TREE_DQ_ROOT_FIRST))
            if head_dim in ORDERED_HEAD_DIMS:
                specs.append(dkdv_spec(head_dim, dtype, False, arch, dq_ordered=True, tree=True,
                                       root_first=TREE_DQ_ROOT_FIRST))
            continue
        if arch == "sm_90" and head_dim in SM90_DKDV_TILES:
            specs.append(KernelSpec("bwd_dkdv_sm90", head_dim, name, SM90_DKDV_TILES[head_dim], 1, window, "sm_90a",
                                    causal=causal))
        if arch == "sm_90" and head_dim in SM90_WS_BWD_TILES and not window and causal:
            specs.append(ws_bwd_spec(head_dim, dtype, root_first=TWO_LEVEL_SHARED_FIRST))
        specs.append(dkdv_spec(head_dim, dtype, window, arch, kernel="bwd_dkdv", causal=causal))
        if head_dim in ATOMIC_HEAD_DIMS:
            specs.append(dkdv_spec(head_dim, dtype, window, arch, dq_atomic=True, kernel="bwd_dkdv", causal=causal))
        if head_dim in ORDERED_HEAD_DIMS and not window:
            specs.append(dkdv_spec(head_dim, dtype, False, arch, causal=causal, dq_ordered=True,
                                   root_first=TWO_LEVEL_SHARED_FIRST))
            if causal and TWO_LEVEL_SHARED_FIRST:  # (tables are split only then: launch.ws_split_for)
                specs.append(dkdv_spec(head_dim, dtype, False, arch, causal=True, dq_ordered=True, root_first=True,
                                       split_tiles=True))
    return specs
