// DualKV backward, dQ: query-tile parallel like the forward (qtile.cuh), so every dQ row is summed by one CTA in a
// fixed order — deterministic, no atomics, fp32 accumulation in registers, one cast at the end.
//
// Per key block: dP = dO V^T, S = Q K^T, P = exp(S * scale - LSE) (masked like the forward),
// dS = P * (dP - D) with D = rowsum(dO * O), dQ += dS K. Finally dQ *= softmax_scale.
#include "kernel_params.cuh"
#include "qtile.cuh"

using namespace dkv;

#ifndef DKV_KV_STAGES
#define DKV_KV_STAGES 1
#endif
constexpr int kKvStages = DKV_KV_STAGES;  // K/V block buffers (TileConfig.kv_stages)
static_assert(kKvStages == 1 || kKvStages == 2, "one or two K/V buffers");

extern "C" __global__ void __launch_bounds__(kThreads) dualkv_bwd_dq(DKV_DQ_PARAMS) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    elem_t* sQ = reinterpret_cast<elem_t*>(smem_raw);
    elem_t* sdO = sQ + kBlockM * kRowStride;
    elem_t* sK = sdO + kBlockM * kRowStride;               // [kKvStages][kBlockN rows]
    elem_t* sV = sK + kKvStages * kBlockN * kRowStride;     // [kKvStages][kBlockN rows]

    const QTile t = make_qtile(segments, tiles, group_size, window_left);
    load_query_rows(sQ, q, q_st, q_sh, t);
    load_query_rows(sdO, dout, do_st, do_sh, t);
    if (t.n_iter > 0) load_key_block(sV, t, 0, vd, vd_st, vd_sh, vc, vc_st, vc_sh, q);
    cp_async_commit();
    if (t.n_iter > 0) load_key_block(sK, t, 0, kd, kd_st, kd_sh, kc, kc_st, kc_sh, q);
    cp_async_commit();

    const QWarp qw = qwarp();
    const int g = qw.g, t4 = qw.t4, lrow = qw.lrow, lmat = qw.lmat, warp_row0 = qw.row0, col0 = qw.col0;

    // Per-row LSE (log2 domain) and D of the rows this thread holds; rows beyond the segment get P = 0 below.
    float row_lse[kMSlabs][2], row_delta[kMSlabs][2];
    load_row_stats(row_lse, row_delta, lse2, delta, lse_sh, t, warp_row0, g);

    float acc_dq[kMSlabs][kOutCols / 8][4];
    zero_rows(acc_dq);

    // dP (V only) comes first, so each block's loads are issued a product or more before they are waited on: V[it + 1]
    // once every warp is done with V[it], during S, dS and the dQ product; K[it + 1] after the dQ product, during the
    // next dP. (With S first and K[it + 1] issued after the dQ product, then waited on at once, 10% of this kernel's
    // warp-stall samples sat at that wait; dP first made the mma.sync backward 1.4-1.7% faster on H100:
    // checks/ncu-mma-bwd-source-h100-20261127T1341Z.json, mma-dqorder-h100-20261127T1349Z.json.)
    // With two buffers (kKvStages == 2) block it + 1 loads into the other buffer while block it is used: one barrier
    // per block (block it's copies landed, and every warp is done with block it - 1, whose buffer they reuse).
    for (int it = 0; it < t.n_iter; ++it) {
        const int off = kKvStages == 2 ? (it % 2) * kBlockN * kRowStride : 0;  // this block's K/V buffer
        if constexpr (kKvStages == 2) {
            cp_async_wait<0>();
            __syncthreads();
            if (it + 1 < t.n_iter) {
                const int nxt = ((it + 1) % 2) * kBlockN * kRowStride;
                load_key_block(sV + nxt, t, it + 1, vd, vd_st, vd_sh, vc, vc_st, vc_sh, q);
                load_key_block(sK + nxt, t, it + 1, kd, kd_st, kd_sh, kc, kc_st, kc_sh, q);
            }
            cp_async_commit();
        } else {
            cp_async_wait<1>();
            __syncthreads();  // V[it] (and Q, dO) landed
        }
        float acc_dp[kMSlabs][kBlockN / 8][4];
        gemm_rows_rows<kMSlabs, kBlockN>(acc_dp, sdO, sV + off, warp_row0, lrow, lmat);  // dP = dO V^T

        if constexpr (kKvStages == 1) {
            cp_async_wait<0>();
            __syncthreads();  // K[it] landed; every warp is done with V[it]
            if (it + 1 < t.n_iter) load_key_block(sV, t, it + 1, vd, vd_st, vd_sh, vc, vc_st, vc_sh, q);
            cp_async_commit();
        }

        bool is_own;
        const int k0 = block_start(t, it, is_own);
        const int count = block_count(t, is_own, k0);
        const int key_base = block_key_base(t, is_own, k0);

        float acc_s[kMSlabs][kBlockN / 8][4];
        gemm_rows_rows<kMSlabs, kBlockN>(acc_s, sQ, sK + off, warp_row0, lrow, lmat);  // S = Q K^T
        probs_rows(acc_s, row_lse, t, is_own, count, key_base, window_left, warp_row0, g, t4, scale_log2);  // P
        dscores_rows(acc_dp, acc_s, row_delta);  // dS
        unsigned ds_frag[kMSlabs][kBlockN / 16][4];
        to_a_frag<kMSlabs, kBlockN>(ds_frag, acc_dp);
        gemm_frag_rows<kMSlabs, kBlockN, kOutCols>(acc_dq, ds_frag, sK + off, col0, lrow, lmat);  // dQ += dS K

        if constexpr (kKvStages == 1) {
            __syncthreads();  // every warp is done with K[it] before it is overwritten
            if (it + 1 < t.n_iter) load_key_block(sK, t, it + 1, kd, kd_st, kd_sh, kc, kc_st, kc_sh, q);
            cp_async_commit();
        }
    }

    float scale_rows[kMSlabs][2];
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl) scale_rows[sl][0] = scale_rows[sl][1] = scale;
    store_query_rows(dq, dq_st, dq_sh, sQ, t, acc_dq, scale_rows, warp_row0, col0, g, t4);
}
