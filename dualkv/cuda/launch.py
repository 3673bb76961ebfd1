"""Launchers of the three kernels: forward, deterministic dQ, and dK/dV.

Kernels read rows of (tokens, heads, head_dim) tensors through token and head strides, so views (q/k/v split
from a fused projection, transposed HF (1, H, T, d) tensors) need no copy as long as the last axis is contiguous
and rows are 16-byte aligned; anything else is copied once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from .configs import (DKDV_TILES, DQ_TILES, KEY_TILES_NODE_MAJOR, MMA_HEAD_MAJOR, TMA_KERNELS, TREE_DQ_ROOT_FIRST,
                      TWO_LEVEL_SHARED_FIRST, WS_SPLIT, KeyTileConfig, TileConfig, dkdv_spec, dq_atomic_for,
                      dq_cast_spec, dq_frag_cast_spec, dq_ordered_for, dq_spec, forward_kernel_for, forward_tile,
                      fwd_spec, pack_for, prep_spec, ws_backward_for, ws_bwd_spec)
from .runtime import arch_of, device_index, f32, get_kernel, i32, i64, poison_enabled
from . import ws_schedule, ws_split
from .split_args import NO_SPLIT, part_buffers, split_args
from .dq_layout import acc_rows, new_frag_acc
from .schedule import check_block_order, key_tiles, tile_table

LOG2E = math.log2(math.e)


def kernel_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` if the kernels can read it in place (unit last stride, 16-byte aligned rows), else a fresh dense copy.

    A fresh allocation, not ``t.contiguous()``: that returns ``t`` itself when torch counts it as contiguous, which a
    view at a misaligned offset is, and so is a (T, 1, d) tensor whose size-1 head axis has any stride."""
    elem = t.element_size()
    aligned = (t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * elem) % 16 == 0
               and (t.stride(1) * elem) % 16 == 0)
    return t if aligned else torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def _strided(t: torch.Tensor) -> list:
    return [t.data_ptr(), i64(t.stride(0)), i64(t.stride(1))]


@dataclass
class Plan:
    """Device-side schedule of one shape (cacheable per layout): segment table and the three kernels' work lists."""

    segments: torch.Tensor   # int32 (S, 4)
    fwd_kernel: str          # "fwd" (mma.sync) | "fwd_sm90" (wgmma)
    fwd_tiles: torch.Tensor  # int32 (n, 2)
    fwd_pack: int
    dq_tiles: torch.Tensor   # int32 (n, 2)
    dq_pack: int
    key_tiles: torch.Tensor  # int32 (n, 4): the warp-specialised backward's launch order (ws_schedule.launch_order)
    # int32 (n, 4): the same key tiles heaviest first, for the dK/dV kernels whose dQ needs no launch order (the
    # separate-dQ pair, atomic dQ): on a tree the nearest-first launch order puts the heaviest tiles (the roots') last
    dkdv_key_tiles: torch.Tensor
    ctx_shared: bool
    causal: bool             # False: own keys all visible (the DKV_CAUSAL=0 kernels)
    fwd_tile: TileConfig
    dq_tile: TileConfig
    dkdv_tile: KeyTileConfig
    tree: bool = False       # a PrefixTreeLayout's schedule (dualkv/cuda/tree_schedule.py): DKV_TREE=1 query kernels
    # the warp-specialised backward's head-major CTA order: each KV head's first ws_first_tiles rows of key_tiles in
    # turn, then its other rows (ws_schedule.cta_order; 0 or the table's length: each head's whole table in turn)
    ws_first_tiles: int = 0
    # the table of the backwards whose dQ adds in a fixed order (warp-specialised; mma.sync ordered) where they split
    # the shared-key tiles (ws_split: split_parts rows each, first in the table; head-major split ws_first_tiles + the
    # rows added); None: they run key_tiles
    split_key_tiles: torch.Tensor | None = None
    split_parts: int = 1


def _to_device(a: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device, non_blocking=True)


def make_plan(segments: np.ndarray, *, head_dim: int, group_size: int, window_left: int, device: torch.device,
              ctx_shared: bool, fwd_kernel: str | None = None, fwd_tile: TileConfig | None = None,
              fwd_pack: int | None = None, dq_tile: TileConfig | None = None,
              dkdv_tile: KeyTileConfig | None = None, causal: bool = True, kv_heads: int | None = None,
              sms: int | None = None) -> Plan:
    """Schedules for the default kernels and tiles of ``head_dim`` (the kernel/tile/pack arguments override them,
    for tuning; a forward tile without a forward kernel means the mma.sync forward). ``kv_heads`` and ``sms`` (default:
    the device's multiprocessors) size the warp-specialised backward's split of the shared-key tiles
    (:func:`ws_split_for`); without ``kv_heads`` nothing is split."""
    fwd_kernel = fwd_kernel or ("fwd" if fwd_tile else forward_kernel_for(head_dim, arch_of(device_index(device))))
    fwd_tile = fwd_tile or forward_tile(fwd_kernel, head_dim)
    fwd_pack = fwd_pack or pack_for(group_size, fwd_tile)
    if group_size % fwd_pack:
        raise ValueError(f"pack {fwd_pack} does not divide the GQA group size {group_size}")
    dq_tile, dkdv_tile = dq_tile or DQ_TILES[head_dim], dkdv_tile or DKDV_TILES[head_dim]
    dq_pack = pack_for(group_size, dq_tile)
    heaviest = key_tiles(segments, dkdv_tile.block_keys, ctx_shared, causal)
    keys = ws_schedule.launch_order(heaviest, segments, node_major_tiles=KEY_TILES_NODE_MAJOR,
                                    shared_first=TWO_LEVEL_SHARED_FIRST)
    check_block_order(keys)
    ws_schedule.check_launch_order(keys, segments, shared_first=TWO_LEVEL_SHARED_FIRST)
    first_tiles = ws_schedule.head_major_split(keys, segments, TWO_LEVEL_SHARED_FIRST)
    split = ws_split_for(keys, segments, ws_split.shared_rows(keys, segments) if TWO_LEVEL_SHARED_FIRST else 0,
                         kv_heads, sms, device, causal)
    return Plan(
        segments=_to_device(segments, device),
        fwd_kernel=fwd_kernel,
        fwd_tiles=_to_device(tile_table(segments, fwd_tile.block_m // fwd_pack, fwd_tile.block_n, window_left, causal),
                             device),
        fwd_pack=fwd_pack,
        dq_tiles=_to_device(tile_table(segments, dq_tile.block_m // dq_pack, dq_tile.block_n, window_left, causal),
                            device),
        dq_pack=dq_pack,
        key_tiles=_to_device(keys, device),
        ctx_shared=ctx_shared, causal=causal, fwd_tile=fwd_tile, dq_tile=dq_tile, dkdv_tile=dkdv_tile,
        dkdv_key_tiles=_to_device(heaviest, device),
        ws_first_tiles=first_tiles,
        split_key_tiles=_to_device(split.tiles, device) if split.parts > 1 else None, split_parts=split.parts,
    )


def ws_split_for(keys: np.ndarray, segments: np.ndarray, shared: int, kv_heads: int | None, sms: int | None,
                 device: torch.device | str, causal: bool = True) -> ws_split.WsSplit:
    """The split of a two-level launch table ``keys`` (int32 (n, 4); segments (S, 4)) for the backwards whose dQ adds
    in a fixed order (:mod:`dualkv.cuda.ws_split`): its first ``shared`` rows (the shared-key tiles) cut under the
    shared-first dQ order, causal, with ``kv_heads`` known, as :data:`~dualkv.cuda.configs.WS_SPLIT` says ("auto":
    :func:`~dualkv.cuda.ws_split.split_parts` for ``sms`` multiprocessors, default the device's; a number N: at most N
    parts, no more than the fewest dependents of a shared row). Otherwise one part: the table unchanged."""
    parts = 1
    if TWO_LEVEL_SHARED_FIRST and causal and kv_heads and WS_SPLIT != "off" and shared > 0:
        if WS_SPLIT == "auto":
            if sms is None and torch.device(device).type == "cuda":
                sms = torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
            parts = ws_split.split_parts(keys, shared, kv_heads, sms) if sms else 1
        else:
            parts = min(int(WS_SPLIT), ws_split.fewest_dependents(keys, shared))
    return ws_split.split_shared_tiles(keys, segments, shared, max(parts, 1))


def make_tree_plan(layout, *, head_dim: int, group_size: int, device: torch.device,
                   fwd_kernel: str | None = None) -> Plan:
    """The schedule of a preorder :class:`dualkv.PrefixTreeLayout`: the tree table (segment rows + context run
    lists), query tiles of the DKV_TREE=1 forward and dQ kernels, and descendant-range key tiles for the dK/dV
    kernels and the DKV_TREE=1 warp-specialised backward (causal, no window), in the latter's launch order (deeper
    nodes first, or shallower first under ``DUALKV_TREE_DQ_ORDER=root``:
    :func:`dualkv.cuda.ws_schedule.launch_order`)."""
    from .tree_schedule import tree_key_tiles, tree_segments, tree_tile_table

    fwd_kernel = fwd_kernel or forward_kernel_for(head_dim, arch_of(device_index(device)))
    fwd_tile = forward_tile(fwd_kernel, head_dim)
    fwd_pack = pack_for(group_size, fwd_tile)
    dq_tile, dkdv_tile = DQ_TILES[head_dim], DKDV_TILES[head_dim]
    dq_pack = pack_for(group_size, dq_tile)
    # the dQ ranks count the key tiles of the warp-specialised backward (the dK/dV kernel's: 128 keys, 64 at 192 / 256)
    ranks = ws_schedule.TreeRanks.of(layout, root_first=TREE_DQ_ROOT_FIRST, block_keys=dkdv_tile.block_keys)
    heaviest = tree_key_tiles(layout, dkdv_tile.block_keys)
    keys = ws_schedule.launch_order(heaviest, None, ranks, node_major_tiles=KEY_TILES_NODE_MAJOR)
    check_block_order(keys)
    ws_schedule.check_launch_order(keys, None, ranks)
    return Plan(
        segments=_to_device(tree_segments(layout, dkdv_tile.block_keys), device),
        fwd_kernel=fwd_kernel,
        fwd_tiles=_to_device(tree_tile_table(layout, fwd_tile.block_m // fwd_pack, fwd_tile.block_n), device),
        fwd_pack=fwd_pack,
        dq_tiles=_to_device(tree_tile_table(layout, dq_tile.block_m // dq_pack, dq_tile.block_n), device),
        dq_pack=dq_pack,
        key_tiles=_to_device(keys, device),
        ctx_shared=True, causal=True, fwd_tile=fwd_tile, dq_tile=dq_tile, dkdv_tile=dkdv_tile, tree=True,
        dkdv_key_tiles=_to_device(heaviest, device), ws_first_tiles=len(keys),
    )


def _new(shape, like: torch.Tensor, dtype=None) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype or like.dtype, device=like.device)
    if poison_enabled():
        t.fill_(float("nan"))
    return t


def run_forward(q, k_ctx, v_ctx, k_own, v_own, segments, tiles, pack: int, *, scale: float, window_left: int,
                kernel: str = "fwd", tile: TileConfig | None = None,
                causal: bool = True, tree: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward kernel (``kernel``: the plan's ``fwd_kernel``). q: (T_q, H, d); k_own/v_own: (T_q, H_k, d);
    k_ctx/v_ctx: (T_c, H_k, d). Returns out (T_q, H, d) and the natural-log LSE (H, T_q) float32. ``tree``: the
    segments are a tree table (:func:`make_tree_plan`)."""
    heads, head_dim = q.shape[1], q.shape[2]
    group = heads // k_own.shape[1]
    device = device_index(q)
    spec = fwd_spec(head_dim, q.dtype, group, window_left >= 0, arch_of(device), kernel, causal, tree)
    spec = replace(spec, pack=pack, tile=tile or spec.tile)
    q, k_ctx, v_ctx, k_own, v_own = (kernel_ready(t) for t in (q, k_ctx, v_ctx, k_own, v_own))
    out = _new(q.shape, q)
    lse = _new((heads, q.shape[0]), q, torch.float32)
    kern = get_kernel(spec, device)
    if spec.kernel in TMA_KERNELS:
        from .tma import launch_raw, tensor_map_3d

        block_n = spec.tile.block_n
        maps = [tensor_map_3d(q, spec.tile.block_m // pack), tensor_map_3d(k_own, block_n),
                tensor_map_3d(v_own, block_n), tensor_map_3d(k_ctx, block_n), tensor_map_3d(v_ctx, block_n)]
        launch_raw(kern, (tiles.shape[0], heads // pack, 1),
                   [*maps, *_strided(out), lse.data_ptr(), i64(lse.stride(0)), segments.data_ptr(), tiles.data_ptr(),
                    i32(group), f32(scale * LOG2E), i32(window_left)])
        return out, lse
    args = [*_strided(q), *_strided(k_ctx), *_strided(v_ctx), *_strided(k_own), *_strided(v_own), *_strided(out),
            lse.data_ptr(), i64(lse.stride(0)), segments.data_ptr(), tiles.data_ptr(), i32(group),
            f32(scale * LOG2E), i32(window_left)]
    kern.launch((tiles.shape[0], heads // pack, 1), args)
    return out, lse


def run_prep(dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, d_lse: torch.Tensor | None = None):
    """(LSE * log2(e), D = rowsum(dO * O) - dLSE), both (H, T_q) fp32, from one pass over dO and O (no fp32
    copies). dout/out: (T_q, H, d) with 16-byte aligned rows; lse, d_lse: (H, T_q)."""
    dout, out = kernel_ready(dout), kernel_ready(out)
    tokens, heads, head_dim = out.shape
    lse = lse.float().contiguous()
    d_lse = d_lse.float().contiguous() if d_lse is not None else None
    lse2, delta = _new(lse.shape, lse), _new(lse.shape, lse)
    device = device_index(out)
    kern = get_kernel(prep_spec(head_dim, out.dtype, arch_of(device)), device)
    rows_per_cta = max(kern.spec.threads // 8, 1)     # up to 8 lanes share a row; the kernel grid-strides
    kern.launch((max((tokens * heads + rows_per_cta - 1) // rows_per_cta, 1), 1, 1),
                [*_strided(dout), *_strided(out), lse.data_ptr(), d_lse.data_ptr() if d_lse is not None else 0,
                 i64(lse.stride(0)), lse2.data_ptr(), delta.data_ptr(), i32(tokens), i32(heads)])
    return lse2, delta


#: The dK/dV kernels' ordered-dQ arguments when they are unused: counters, tile offsets, tiles, K/V heads, CTA split.
_NO_DQ_ORDER = [0, 0, i32(0), i32(0), i32(-1)]


def run_backward(dout, q, k_ctx, v_ctx, k_own, v_own, out, lse, segments, dq_tiles, key_tiles_t, dq_pack: int,
                 ctx_shared: bool, *, scale: float, window_left: int, d_lse: torch.Tensor | None = None,
                 dq_tile: TileConfig | None = None, dkdv_tile: KeyTileConfig | None = None,
                 kernels: tuple[str, ...] = ("dq", "dkdv"), deterministic: bool = True, causal: bool = True,
                 tree: bool = False, dkdv_key_tiles_t: torch.Tensor | None = None, ws_first_tiles: int | None = None,
                 split_key_tiles_t: torch.Tensor | None = None, split_parts: int = 1):
    """dQ and dK/dV kernels. Returns (dq, dk_ctx, dv_ctx, dk_own, dv_own); with ``ctx_shared`` the context rows are
    own rows of the same tensors and dk_ctx/dv_ctx are empty (their gradient is inside dk_own/dv_own).

    ``d_lse`` (H, T_q), the gradient reaching the returned LSE, enters as dS = P (dP - D + dLSE): it is folded into D.
    Where :func:`ws_backward_for` says so (sm_90, head dims 64 to 256, causal, no window, the ``auto`` family) the
    deterministic warp-specialised backward runs whatever ``deterministic`` says (it is the faster one there).
    Elsewhere the separate query-tile dQ kernel sums every dQ row in a fixed order, except where
    :class:`~dualkv.cuda.configs.mma_backward` (:data:`~dualkv.cuda.configs.MMA_BACKWARDS`) chooses otherwise:
    ``"auto"`` (the default), calls at head dims 64-128 that the mma.sync dK/dV kernel serves compute dQ inside it -
    causal deterministic ones without a window adding it in a fixed order (:func:`_run_dkdv_ordered`;
    :func:`~dualkv.cuda.configs.dq_ordered_for`), ``deterministic=False`` ones by fp32 atomics (run-to-run rounding
    differences in dQ; :func:`~dualkv.cuda.configs.dq_atomic_for`), one kernel and five products either way;
    ``"atomic"``, the atomic dQ at every head dim <= 128, also in place of the wgmma pair (deterministic calls split);
    ``"ordered"``, the fixed order for every call without a window at head dims <= 128; ``"split"``, the dQ kernel
    always. The ordered mode runs on the default tiles only (a tile override takes the other modes). ``kernels`` and
    the tile arguments
    exist for tuning. ``tree``: the segments are a tree table and the key tiles in its launch order
    (:func:`make_tree_plan`): the DKV_TREE=1 warp-specialised backward where :func:`ws_backward_for` says so (sm_90,
    head dims 64 to 256, the ``auto`` family), else the DKV_TREE=1 dQ kernel and the dK/dV kernel
    (``kernel_family("wgmma_v1")`` forces that pair on sm_90). ``key_tiles_t`` is in the warp-specialised launch order;
    the dK/dV kernel runs ``dkdv_key_tiles_t`` (the same tiles heaviest first, :attr:`Plan.dkdv_key_tiles`) where given,
    else ``key_tiles_t`` (correct in any order, only slower on a tree). ``ws_first_tiles``: the warp-specialised
    backward's head-major CTA split (:attr:`Plan.ws_first_tiles`; None, the whole table per KV head).
    ``split_key_tiles_t`` / ``split_parts``: the split table (:attr:`Plan.split_key_tiles`), run in place of
    ``key_tiles_t`` by the backwards whose dQ adds in a fixed order (warp-specialised, mma.sync ordered).
    """
    heads, head_dim = q.shape[1], q.shape[2]
    group = heads // k_own.shape[1]
    device = device_index(q)
    arch = arch_of(device)
    window = window_left >= 0
    dout, q, k_ctx, v_ctx, k_own, v_own = (kernel_ready(t) for t in (dout, q, k_ctx, v_ctx, k_own, v_own))
    lse2, delta = run_prep(dout, out, lse, d_lse)
    dq = _new(q.shape, q)
    dk_own, dv_own = _new(k_own.shape, k_own), _new(v_own.shape, v_own)
    if ctx_shared:
        dk_ctx, dv_ctx = k_own.new_empty((0,)), v_own.new_empty((0,))
        dkc_args, dvc_args = _strided(dk_own), _strided(dv_own)
    else:
        dk_ctx, dv_ctx = _new(k_ctx.shape, k_ctx), _new(v_ctx.shape, v_ctx)
        dkc_args, dvc_args = _strided(dk_ctx), _strided(dv_ctx)
    if (ws_backward_for(head_dim, arch, window, causal, tree) and not dq_tile and not dkdv_tile
            and kernels == ("dq", "dkdv")):
        split = split_args(key_tiles_t, split_key_tiles_t, split_parts, ws_first_tiles)
        _run_backward_ws(dout, q, k_ctx, v_ctx, k_own, v_own, lse2, delta, dq, dkc_args, dvc_args, dk_own, dv_own,
                         segments, split[0], group, scale, tree, split[1], split[2:])
        return dq, dk_ctx, dv_ctx, dk_own, dv_own
    keys = [*_strided(q), *_strided(k_ctx), *_strided(v_ctx), *_strided(k_own), *_strided(v_own), *_strided(dout),
            lse2.data_ptr(), delta.data_ptr(), i64(lse2.stride(0))]
    scalars = [i32(group), f32(scale * LOG2E), f32(scale), i32(window_left)]
    grads = [*keys, *dkc_args, *dvc_args, *_strided(dk_own), *_strided(dv_own)]
    if (not dq_tile and not dkdv_tile and kernels == ("dq", "dkdv")
            and dq_ordered_for(head_dim, arch, window, deterministic=deterministic, causal=causal)):
        split = split_args(key_tiles_t, split_key_tiles_t, split_parts, ws_first_tiles)
        _run_dkdv_ordered(grads, scalars, q, dq, segments, split[0], k_own.shape[1], causal, scale, tree, split[1],
                          split[2:])
        return dq, dk_ctx, dv_ctx, dk_own, dv_own
    atomic = dq_atomic_for(head_dim, deterministic, arch)
    dq_kspec = dq_spec(head_dim, q.dtype, group, window, arch, kernel="bwd_dq" if dq_tile else None, causal=causal,
                       tree=tree)
    dq_kernel = get_kernel(replace(dq_kspec, pack=dq_pack, tile=dq_tile or dq_kspec.tile), device)
    if "dq" in kernels and not atomic:
        dq_kernel.launch((dq_tiles.shape[0], heads // dq_pack, 1),
                         [*keys, *_strided(dq), segments.data_ptr(), dq_tiles.data_ptr(), i32(group),
                          f32(scale * LOG2E), f32(scale), i32(window_left)])
    dkdv_kspec = dkdv_spec(head_dim, q.dtype, window, arch, dq_atomic=atomic,
                           kernel="bwd_dkdv" if dkdv_tile else None,  # a tile override is an mma.sync tile
                           causal=causal)
    dkdv_kspec = replace(dkdv_kspec, tile=dkdv_tile or dkdv_kspec.tile)
    dkdv_kernel = get_kernel(dkdv_kspec, device)
    dq_acc = new_frag_acc(q.shape[0], heads, head_dim, q.device, dkdv_kspec.tile.block_m) if atomic else None
    if "dkdv" in kernels:
        dkdv_tiles = key_tiles_t if dkdv_key_tiles_t is None else dkdv_key_tiles_t
        dkdv_kernel.launch((dkdv_tiles.shape[0], k_own.shape[1], 1),
                           [*grads, *(frag_acc_args(dq_acc) if atomic else [0, i64(0), i64(0)]), *_NO_DQ_ORDER,
                            segments.data_ptr(), dkdv_tiles.data_ptr(), *scalars, *NO_SPLIT])
    if atomic:
        _cast_dq_frag(dq_acc, dq, scale)
    return dq, dk_ctx, dv_ctx, dk_own, dv_own


def _run_dkdv_ordered(grads: list, scalars: list, q: torch.Tensor, dq: torch.Tensor, segments: torch.Tensor,
                      key_tiles_t: torch.Tensor, kv_heads: int, causal: bool, scale: float,
                      tree: bool = False, first_tiles: int | None = None, split: tuple[int, int] = (1, 0)) -> None:
    """The mma.sync dK/dV kernel in its ordered dQ mode (DKV_DQ_ORDERED): dK, dV (written through ``grads``, the
    launch arguments up to the dQ accumulator) and dQ summed in fp32 in a fixed order into one accumulator in fragment
    order (:mod:`dualkv.cuda.dq_layout`), then scaled and cast into ``dq`` (T_q, H, d). ``key_tiles_t`` must be in
    :func:`dualkv.cuda.ws_schedule.launch_order` (a plan's ``key_tiles``, not its heaviest-first ``dkdv_key_tiles``;
    ``tree``: a tree plan's, DKV_TREE=1); ``scalars``: the kernel's last arguments (GQA group, scales, window).
    The CTAs run head-major, split after ``first_tiles`` rows (:func:`dualkv.cuda.ws_schedule.cta_order`; None: the
    whole table) where :data:`~dualkv.cuda.configs.MMA_HEAD_MAJOR` says so, never on a tree; else a row's KV heads
    adjacent. ``split``: (parts, partial rows) of a split table (:func:`~dualkv.cuda.split_args.split_args`), as the
    warp-specialised backward takes it; more than one part launches the kernel's split-tiles build (the only one with
    the parts' sum, ``KernelSpec.split_tiles``)."""
    tokens, heads, head_dim = q.shape
    device = device_index(q)
    spec = dkdv_spec(head_dim, q.dtype, False, arch_of(device), causal=causal, dq_ordered=True, tree=tree,
                     root_first=_root_first(tree), split_tiles=split[0] > 1)
    kern = get_kernel(spec, device)
    sems, qtile_offset, n_qtiles = _dq_counters(segments, tokens, heads, spec.tile.block_m, tree)
    dq_acc = new_frag_acc(tokens, heads, head_dim, q.device, spec.tile.block_m)
    part_args, buffers = part_buffers(spec, split, kv_heads, q.device)  # (buffers: kept alive until launched)
    kern.launch((key_tiles_t.shape[0] * kv_heads, 1, 1),
                [*grads, *frag_acc_args(dq_acc), sems.data_ptr(),
                 qtile_offset.data_ptr() if qtile_offset is not None else 0, i32(n_qtiles), i32(kv_heads),
                 i32(_mma_cta_split(key_tiles_t, tree, first_tiles)), segments.data_ptr(), key_tiles_t.data_ptr(),
                 *scalars, *part_args])
    _cast_dq_frag(dq_acc, dq, scale)


def _cta_split(key_tiles_t: torch.Tensor, first_tiles: int | None) -> int:
    """The head-major CTA split a kernel gets: ``first_tiles``, or the whole table when None. Out of [0, rows] the
    kernels would read past the key-tile table, so that raises."""
    rows = key_tiles_t.shape[0]
    first = rows if first_tiles is None else int(first_tiles)
    if not 0 <= first <= rows:
        raise ValueError(f"ws_first_tiles must lie in [0, {rows}] (the key-tile table's rows), got {first}")
    return first


def _mma_cta_split(key_tiles_t: torch.Tensor, tree: bool, first_tiles: int | None) -> int:
    """The ordered mma.sync kernel's ``first_tiles`` argument: the head-major split (:func:`_cta_split`), or -1 (a
    row's KV heads adjacent) on a tree or without :data:`~dualkv.cuda.configs.MMA_HEAD_MAJOR`."""
    if tree or not MMA_HEAD_MAJOR:
        return -1
    return _cta_split(key_tiles_t, first_tiles)


def _root_first(tree: bool) -> bool:
    """The ordered-dQ builds' root-first (tree) or shared-first (two-level) order in this process (the plans'
    launch orders are built for the same settings)."""
    return TREE_DQ_ROOT_FIRST if tree else TWO_LEVEL_SHARED_FIRST


def _dq_counters(segments: torch.Tensor, tokens: int, heads: int, step: int, tree: bool = False):
    """Zeroed int32 dQ counters (heads, n_qtiles), one per (head, query tile of ``step`` rows), and the int32 (S,)
    index of each segment's first tile: tile t of segment s is qtile_offset[s] + t. n_qtiles is an upper bound from
    shapes alone (every segment adds at most one partial tile), so nothing is read back. ``tree``: one counter per
    (head, first token of a query tile) and no offsets (None): the flat tree table has no (S, 4) view."""
    if tree:
        return torch.zeros((heads, tokens), dtype=torch.int32, device=segments.device), None, tokens
    n_tiles = (segments[:, 1] + step - 1) // step
    qtile_offset = (torch.cumsum(n_tiles, 0) - n_tiles).to(torch.int32)
    n_qtiles = tokens // step + segments.shape[0] + 1
    return torch.zeros((heads, n_qtiles), dtype=torch.int32, device=segments.device), qtile_offset, n_qtiles


def _launch_cast(cast_spec, acc_args: list, dq: torch.Tensor, rows: int, scale: float) -> None:
    """One dQ cast kernel (``cast_spec(head_dim, dtype, arch)``: its specialization) over ``rows`` (>= T) token rows
    of the accumulator, one thread per 8 outputs: dq (T, H, d) = scale * the accumulator (``acc_args``: its pointer
    and strides as the kernel takes them)."""
    tokens, heads, head_dim = dq.shape
    device = device_index(dq)
    cast = get_kernel(cast_spec(head_dim, dq.dtype, arch_of(device)), device)
    per_cta = cast.spec.threads
    threads = rows * heads * (head_dim // 8)
    cast.launch(((threads + per_cta - 1) // per_cta, 1, 1),
                [*acc_args, *_strided(dq), i32(tokens), i32(heads), f32(scale)])


def _cast_dq(dq_acc: torch.Tensor, dq: torch.Tensor, scale: float) -> None:
    """dq (T, H, d) = scale * the fp32 accumulator (H, rows >= T, d' >= d) in bwd_dq_cast.cu's chunk order, one
    kernel."""
    _launch_cast(dq_cast_spec, [dq_acc.data_ptr(), i64(dq_acc.shape[1] * dq_acc.shape[2]), i64(dq_acc.shape[2])],
                 dq, dq.shape[0], scale)


def frag_acc_args(dq_acc: torch.Tensor) -> list:
    """The dK/dV kernel's (dq_acc, dqa_st, dqa_sh) for the atomic and ordered dQ modes: the accumulator, its float
    count (no longer read: the rows past a step's last query add zeros in place, dq_layout.TAIL_ROWS), and the head
    stride."""
    return [dq_acc.data_ptr(), i64(dq_acc.numel()), i64(dq_acc.stride(0))]


def _cast_dq_frag(dq_acc: torch.Tensor, dq: torch.Tensor, scale: float) -> None:
    """dq (T, H, d) = scale * the atomic or ordered dQ mode's fp32 accumulator (H, acc_rows(T), d) in fragment order
    (:mod:`dualkv.cuda.dq_layout`), one kernel (its threads cover the last token group's padding rows too)."""
    _launch_cast(dq_frag_cast_spec, [dq_acc.data_ptr(), i64(dq_acc.stride(0))], dq, acc_rows(dq.shape[0]), scale)


#: Query rows per step of the warp-specialised backward: the unit of its dQ counters.
WS_BWD_STEP = 64


def _run_backward_ws(dout, q, k_ctx, v_ctx, k_own, v_own, lse2, delta, dq, dkc_args, dvc_args, dk_own, dv_own,
                     segments, key_tiles_t, group: int, scale: float, tree: bool = False,
                     first_tiles: int | None = None, split: tuple[int, int] = (1, 0)) -> None:
    """The warp-specialised Hopper backward: dK, dV (written) and dQ (fp32, fixed-order adds into one accumulator,
    then scaled and cast into ``dq`` by one more kernel) from one kernel. ``key_tiles_t`` must be in
    :func:`dualkv.cuda.ws_schedule.launch_order` (the order of this process's two-level / tree dQ order);
    ``first_tiles``: the head-major CTA split (:func:`dualkv.cuda.ws_schedule.cta_order`; None: the whole table).
    ``split``: (parts, partial rows) of a split table (:mod:`dualkv.cuda.ws_split`): its first partial rows put fp32
    dK / dV partials into a workspace that the last CTA of each run of ``parts`` sums."""
    from .tma import launch_raw, tensor_map_3d

    tokens, heads, head_dim = q.shape
    kv_heads = k_own.shape[1]
    spec = ws_bwd_spec(head_dim, q.dtype, tree=tree, root_first=_root_first(tree))
    kern = get_kernel(spec, device_index(q))
    step, keys = spec.tile.block_m, spec.tile.block_keys
    sems, qtile_offset, n_qtiles = _dq_counters(segments, tokens, heads, step, tree)
    rows = tokens + step  # a step's tile may reach past the last token
    acc_cols = head_dim  # the kernel's dQ rows hold the head dim's columns only (not its 128-column tiles' zeros)
    dq_acc = torch.zeros((heads, rows, acc_cols), dtype=torch.float32, device=q.device)
    maps = [tensor_map_3d(q, step), tensor_map_3d(dout, step), tensor_map_3d(k_own, keys), tensor_map_3d(v_own, keys),
            tensor_map_3d(k_ctx, keys), tensor_map_3d(v_ctx, keys)]
    part_args, buffers = part_buffers(spec, split, kv_heads, q.device)  # (buffers: kept alive until launched)
    launch_raw(kern, (key_tiles_t.shape[0] * kv_heads, 1, 1),
               [*maps, lse2.data_ptr(), delta.data_ptr(), i64(lse2.stride(0)), *dkc_args, *dvc_args,
                *_strided(dk_own), *_strided(dv_own), dq_acc.data_ptr(), i64(rows * acc_cols), sems.data_ptr(),
                i32(n_qtiles), qtile_offset.data_ptr() if qtile_offset is not None else 0, segments.data_ptr(),
                key_tiles_t.data_ptr(), i32(kv_heads),
                i32(_cta_split(key_tiles_t, first_tiles)), i32(group), f32(scale * LOG2E), f32(scale),
                *part_args])
    _cast_dq(dq_acc, dq, scale)

