// DualKV forward: one launch over every segment of a shared-prompt micro-batch.
//
// CTA (tile, head group), see qtile.cuh. Its queries attend, with one online softmax carried across both regions,
//   * to the segment's own keys (causal, logical position ctx_len + j), visited first, last block first;
//   * to the segment's context keys (fully visible, logical positions 0..ctx_len-1), stored once and read by every
//     segment of the group.
// Each region is tiled into kBlockN-key blocks from its own start, so a region's last block may be partial; every
// load is bounds-checked (zero-fill) and partial, diagonal and window-boundary blocks are masked per element.
// Blocks entirely outside a sliding window are skipped. Writes O and the natural-log LSE (H, T_q).
//
// Tried and dropped (#13): ptxas spills the row statistics of the d = 128 build (255 registers, 152 bytes) and reloads
// them every block, in the masking branch's registers. Visiting the blocks that need a mask first and the rest in a
// second loop without mask code removed those reloads, and masks against a per-row limit cut the spills to 76 bytes,
// yet the forward ran slower: H200, fwd ms at (28, 4K), (8, 8K), (16, 32K), (16, 64K), one process each: this kernel
// 15.27 / 9.20 / 79.65 / 209.58, the two loops 15.63 / 9.71 / 82.93 / 218.05, the per-row limit alone 15.20 / 9.36 /
// 80.18 / 210.87, the two loops with the next K issued before the softmax (as FlashAttention-2 does) 16.02 / 10.02 /
// 83.74 / 220.97; the FA2 cascade 18.05 / 9.97 / 77.32 / 200.84 (experiments/results/checks/fwdmask-h200-*.log).
// Also dropped: the K and V blocks swizzled like the dK/dV kernel's Q / dO tiles (bwd_dkdv.cu DKV_QDO_SWIZZLE), O += P V
// through a transposed swizzled read spanning head_dim / 64 atoms. H200, NVRTC 13.0, fwd ms at (8, 8K) / (16, 32K), one
// process each: this kernel 9.20 / 79.59 and 9.48 / 79.74; swizzled with the tile description in registers (which then
// spilled 28 / 28 bytes) 9.64 / 78.90 (unchecked; the backward after it took 240.2 ms at (16, 32K) against 224.3 after
// this kernel); swizzled with it in smem 10.37 / 89.01 and wrong at d = 128, where the GPU tests caught it (most likely
// the static __shared__ tile moved the dynamic shared memory off the 128-byte alignment the swizzle's XOR needs;
// experiments/results/checks/s31final-h200-20261129T2202Z.json).
#include "kernel_params.cuh"
#include "softmax.cuh"

// DKV_FWD_TILE_SMEM=1: the CTA's tile description (QTile: segment row, key ranges, ...) lives in shared memory and
// the loop reads it from there, instead of holding ~20 values loaded from the segment table in registers through
// the loop. NVRTC 13.5 keeps those in vector registers and spills the d = 128 build's row statistics
// (sm_90 causal pack 4: 152 / 168 bytes of spill stores / loads, 33 spill instructions in the loop); with the tile in
// smem it spills nothing, and ran 7-11% faster (H200, at (8, 8K) and (16, 32K)). NVRTC 13.0 keeps them in uniform
// registers and spills 8 / 8 bytes either way; there the reloads cost 3-5%. build.py (compiler_chosen_macros,
// spill_tolerance) compiles 0, then 1 if 0 spills more than 16 bytes, and keeps the one spilling least;
// DUALKV_EXTRA_DEFINES=DKV_FWD_TILE_SMEM=... fixes it for an A/B. (Those spill counts predate softmax.cuh's lazy
// rescale, with which no build of this kernel spills under 13.0, checks/s35lazy-spills-cpu-20261130.log, nor the d =
// 128 sm_90 causal one under 13.5 in form 0.)
#ifndef DKV_FWD_TILE_SMEM
#define DKV_FWD_TILE_SMEM 0
#endif
#if DKV_FWD_TILE_SMEM != 0 && DKV_FWD_TILE_SMEM != 1
#error "DKV_FWD_TILE_SMEM must be 0 or 1"
#endif

// Each iteration works out its key block (region, first key, count, logical position) before the barrier that opens it,
// and the next K block's before the barrier ahead of its copy. After them, as before s32 (DKV_FWD_GEOM_EARLY=0 then),
// the tile description's smem reads and the ISETPs on them came right after each barrier (ncu, NVRTC 13.5: 2.6% of the
// stall samples on the first read, 1.3% on an ISETP waiting for it; checks/s32t135-ncu-fwd-*). H200, d = 128 forward ms
// at (8, 8K) / (16, 32K) / (16, 64K), before against after, two rounds of alternating processes: NVRTC 13.5 (tile in
// smem) 9.19 / 79.45 / 210.44 and 9.17 / 79.79 / 209.75 against 9.14 / 79.10 / 208.24 and 9.34 / 78.89 / 208.21; NVRTC
// 13.0 (tile in registers) 9.23 / 79.38 / 210.67 and 9.27 / 79.67 / 209.40 against 9.64 / 80.00 / 210.77 and 9.18 /
// 79.45 / 209.41, no change (checks/s32geom-h200-20261130T0021Z.json). ptxas: under 13.0 the sm_80 d = 128 causal
// builds without a window no longer spill (8 / 8 bytes before); under 13.5 the sm_90 d = 128 windowed causal builds now
// spill 8 / 8 (none before); no other build's spills changed.

using namespace dkv;

extern "C" __global__ void __launch_bounds__(kThreads) dualkv_fwd(DKV_FWD_PARAMS) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    elem_t* sQ = reinterpret_cast<elem_t*>(smem_raw);
    elem_t* sK = sQ + kBlockM * kRowStride;
    elem_t* sV = sK + kBlockN * kRowStride;

#if DKV_FWD_TILE_SMEM
    __shared__ QTile s_tile;
    {
        const QTile t0 = make_qtile(segments, tiles, group_size, window_left);
        if (threadIdx.x == 0) s_tile = t0;
        load_query_rows(sQ, q, q_st, q_sh, t0);
        cp_async_commit();
        if (t0.n_iter > 0) load_key_block(sK, t0, 0, kd, kd_st, kd_sh, kc, kc_st, kc_sh, q);
        cp_async_commit();
    }
    __syncthreads();  // s_tile written
    const QTile& t = s_tile;  // read anew after each barrier, not held in registers across the loop
#else
    const QTile t = make_qtile(segments, tiles, group_size, window_left);
    load_query_rows(sQ, q, q_st, q_sh, t);
    cp_async_commit();
    if (t.n_iter > 0) load_key_block(sK, t, 0, kd, kd_st, kd_sh, kc, kc_st, kc_sh, q);
    cp_async_commit();
#endif

    const QWarp qw = qwarp();
    const int g = qw.g, t4 = qw.t4, lrow = qw.lrow, lmat = qw.lmat, warp_row0 = qw.row0, col0 = qw.col0;

    float acc_o[kMSlabs][kOutCols / 8][4];
    float row_max[kMSlabs][2], row_sum[kMSlabs][2];  // row_max in the scaled log2 domain
    init_rows(acc_o, row_max, row_sum);

    for (int it = 0; it < t.n_iter; ++it) {
        bool is_own;
        const int k0 = block_start(t, it, is_own);
        const int count = block_count(t, is_own, k0);
        const int key_base = block_key_base(t, is_own, k0);  // logical position of key 0 of the block
        cp_async_wait<0>();
        __syncthreads();  // K[it] (and Q) landed; every warp is done with V[it-1]
        load_key_block_at(sV, t, is_own, k0, count, vd, vd_st, vd_sh, vc, vc_st, vc_sh, q);
        cp_async_commit();

        float acc_s[kMSlabs][kBlockN / 8][4];
        gemm_rows_rows<kMSlabs, kBlockN>(acc_s, sQ, sK, warp_row0, lrow, lmat);  // S = Q K^T (whole head dim)

        online_softmax_step(acc_s, acc_o, row_max, row_sum, t, is_own, count, key_base, window_left, warp_row0, g, t4,
                            scale_log2);
        unsigned p_frag[kMSlabs][kBlockN / 16][4];
        to_a_frag<kMSlabs, kBlockN>(p_frag, acc_s);

        const bool has_next = it + 1 < t.n_iter;
        bool next_own;
        const int next_k0 = block_start(t, it + 1, next_own);
        const int next_count = has_next ? block_count(t, next_own, next_k0) : 0;
        cp_async_wait<0>();
        __syncthreads();  // V[it] landed; every warp is done with K[it]
        if (has_next) load_key_block_at(sK, t, next_own, next_k0, next_count, kd, kd_st, kd_sh, kc, kc_st, kc_sh, q);
        cp_async_commit();

        gemm_frag_rows<kMSlabs, kBlockN, kOutCols>(acc_o, p_frag, sV, col0, lrow, lmat);  // O += P V (this warp's columns)
    }

    // Epilogue: LSE of valid rows, then O / l through smem with coalesced stores.
    float inv_l[kMSlabs][2];
    finish_rows(lse, lse_sh, t, row_max, row_sum, inv_l, qw);
    store_query_rows(o, o_st, o_sh, sQ, t, acc_o, inv_l, warp_row0, col0, g, t4);
}
