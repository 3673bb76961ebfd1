"""The kernel arguments of split shared-key tiles (:mod:`dualkv.cuda.ws_split`): which table, head-major split,
parts and partial rows a backward runs, and the fp32 slots and counters its CTAs sum the parts' dK / dV through
(``csrc/split_parts.cuh``). Used by the launchers of the warp-specialised backward and the mma.sync ordered dQ mode."""

from __future__ import annotations

import torch

from .configs import KernelSpec
from .runtime import i32
from .ws_split import MAX_PARTS

#: The warp-specialised backward's consumer threads (kConsumerThreads in csrc/bwd_sm90_ws.cu).
WS_CONSUMER_THREADS = 256

#: The last four arguments of a dK/dV kernel that splits nothing (part_acc, part_sems, parts, partial_rows).
NO_SPLIT = [0, 0, i32(1), i32(0)]


def split_args(key_tiles_t: torch.Tensor, split_key_tiles_t: torch.Tensor | None, parts: int,
               first_tiles: int | None) -> tuple[torch.Tensor, int | None, int, int]:
    """(table, first_tiles, parts, partial_rows) an ordered-dQ backward runs: ``key_tiles_t`` (int32 (n, 4)) as it
    is, or its split ``split_key_tiles_t`` (int32 (n + added, 4): each of the first added / (parts - 1) rows became
    ``parts`` rows, first in the table), whose head-major split ``first_tiles`` moves by the rows added."""
    if split_key_tiles_t is None or parts <= 1:
        return key_tiles_t, first_tiles, 1, 0
    if first_tiles is None:
        raise ValueError("a split key-tile table needs the plan's head-major split (ws_first_tiles), got None")
    added = split_key_tiles_t.shape[0] - key_tiles_t.shape[0]
    if parts > MAX_PARTS or added <= 0 or added % (parts - 1) or added // (parts - 1) > first_tiles:
        raise ValueError(f"a split key-tile table of {split_key_tiles_t.shape[0]} rows is no {parts}-part split of "
                         f"the first {first_tiles} of {key_tiles_t.shape[0]} rows")
    return split_key_tiles_t, first_tiles + added, parts, added // (parts - 1) * parts


def part_slot_floats(spec: KernelSpec) -> int:
    """Floats of one CTA's slot of split dK / dV partials (csrc/split_parts.cuh), as the kernel's kPartFloats: the
    warp-specialised backward's consumers hold dK and dV (its wide builds one role's accumulator each), 4 floats per
    8 tile columns per consumer thread; the mma.sync dK/dV kernel's threads hold dK and dV of kKeySlabs (qwarps) slabs
    of head_dim / dsplit / qwarps columns each."""
    t = spec.tile
    if spec.kernel == "bwd_sm90_ws":
        return (1 if t.dsplit == 2 else 2) * (spec.tile_head_dim // 8) * 4 * WS_CONSUMER_THREADS
    cols = spec.head_dim // t.dsplit // t.qwarps
    return 2 * t.qwarps * (cols // 8) * 4 * t.warps * 32


def part_buffers(spec: KernelSpec, split: tuple[int, int], kv_heads: int,
                 device: torch.device | str) -> tuple[list, tuple[torch.Tensor, ...]]:
    """The split arguments of ``spec``'s kernel (part_acc, part_sems, parts, partial_rows) for ``split`` = (parts,
    partial rows): fp32 (partial rows x kv_heads x :func:`part_slot_floats`) slots and an int32 zeroed counter per
    (run, KV head); :data:`NO_SPLIT` when nothing is split. Returns (arguments, the buffers behind them, which the
    caller keeps alive until the launch)."""
    parts, partial_rows = split
    if parts <= 1 or partial_rows == 0:
        return list(NO_SPLIT), ()
    if spec.kernel == "bwd_dkdv" and not spec.split_tiles:
        raise ValueError(f"a split key-tile table ({parts} parts) needs the dK/dV kernel's split-tiles build (split_tiles=True), "
                         f"got {spec}")
    part_acc = torch.empty((partial_rows * kv_heads * part_slot_floats(spec),), dtype=torch.float32, device=device)
    part_sems = torch.zeros((partial_rows // parts * kv_heads,), dtype=torch.int32, device=device)
    return [part_acc.data_ptr(), part_sems.data_ptr(), i32(parts), i32(partial_rows)], (part_acc, part_sems)
