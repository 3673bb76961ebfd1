// DualKV backward, dQ, for Hopper (sm_90a): the schedule, masks and fixed summation order of bwd_dq.cu (query-tile
// parallel, deterministic, fp32 accumulation), with the three products on warpgroup MMAs.
//
// kWarps = 8: two warpgroups of 64 query rows (warp w owns rows 16w .. 16w + 15). Q and dO stay in shared memory;
// K and V blocks are double-buffered with cp.async (128-byte-swizzle tiles). Per key block and warpgroup:
//   S = Q K^T  and  dP = dO V^T      wgmma m64 n{kBlockN}, K-major operands, issued together;
//   P = exp2(S * scale_log2 - LSE)   (masked) while dP runs;  dS = P * (dP - D);
//   dQ += dS K                       wgmma m64 n{kHeadDimAcc}, A (dS) from registers, B (K) N-major.
// (At head dim 96 the tiles have 128 columns: sm90.cuh, the 96 head dim.)
// Finally dQ *= softmax_scale, cast once, stored through a padded smem tile.
#include "kernel_params.cuh"
#include "qtile_sm90.cuh"

using namespace dkv;

extern "C" __global__ void __launch_bounds__(kThreads, 1) dualkv_bwd_dq_sm90(DKV_DQ_PARAMS) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* base = align_1024(smem_raw);
    elem_t* sQ = reinterpret_cast<elem_t*>(base);
    elem_t* sdO = reinterpret_cast<elem_t*>(base + kTileBytesQ);
    const KVStages kv{base + 2 * kTileBytesQ};

    const QTile t = make_qtile(segments, tiles, group_size, window_left);
    const QWarp qw = qwarp();
    const int warpgroup = __shfl_sync(0xffffffff, threadIdx.x / 128, 0);  // warp-uniform: descriptors in uniform registers
    auto load_k = [&](int it) { load_key_block<true>(kv.k(it), t, it, kd, kd_st, kd_sh, kc, kc_st, kc_sh, q); };
    auto load_v = [&](int it) { load_key_block<true>(kv.v(it), t, it, vd, vd_st, vd_sh, vc, vc_st, vc_sh, q); };
    load_query_rows<true>(sQ, q, q_st, q_sh, t);
    load_query_rows<true>(sdO, dout, do_st, do_sh, t);
    load_k(0);
    load_v(0);
    cp_async_commit();

    float row_lse[1][2], row_delta[1][2];
    load_row_stats(row_lse, row_delta, lse2, delta, lse_sh, t, qw.row0, qw.g);
    float acc_dq[1][kHeadDimAcc / 8][4];
    zero_rows(acc_dq);
    const unsigned long long q_desc = kmajor_tile(smem_addr(sQ), warpgroup * 64);
    const unsigned long long do_desc = kmajor_tile(smem_addr(sdO), warpgroup * 64);

    for (int it = 0; it < t.n_iter; ++it) {
        cp_async_wait<0>();
        fence_async_smem();
        __syncthreads();  // block it (and Q, dO) landed everywhere; every warp is done with block it - 1
        if (it + 1 < t.n_iter) {
            load_k(it + 1);
            load_v(it + 1);
        }
        cp_async_commit();

        bool is_own;
        const int k0 = block_start(t, it, is_own);
        const int count = block_count(t, is_own, k0);
        const int key_base = block_key_base(t, is_own, k0);
        const unsigned k_addr = smem_addr(kv.k(it));
        const unsigned long long k_desc = kmajor_tile(k_addr, 0), v_desc = kmajor_tile(smem_addr(kv.v(it)), 0);
        const unsigned long long kn_desc = nmajor_tile<kBlockN>(k_addr);

        float acc_s[1][kBlockN / 8][4], acc_dp[1][kBlockN / 8][4];
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < kHeadDim / 16; ++s)  // S = Q K^T
            wgmma_ss(acc_s[0], kmajor_desc<kBlockM>(q_desc, s), kmajor_desc<kBlockN>(k_desc, s), s > 0);
        wgmma_commit();
#pragma unroll
        for (int s = 0; s < kHeadDim / 16; ++s)  // dP = dO V^T
            wgmma_ss(acc_dp[0], kmajor_desc<kBlockM>(do_desc, s), kmajor_desc<kBlockN>(v_desc, s), s > 0);
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(acc_s[0]);
        probs_rows(acc_s, row_lse, t, is_own, count, key_base, window_left, qw.row0, qw.g, qw.t4, scale_log2);  // P
        wgmma_wait<0>();
        fence_regs(acc_dp[0]);
        dscores_rows(acc_dp, acc_s, row_delta);  // dS
        unsigned ds_frag[1][kBlockN / 16][4];
        to_a_frag<1, kBlockN>(ds_frag, acc_dp);
        fence_regs(acc_dq[0]);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < kBlockN / 16; ++s)  // dQ += dS K
            wgmma_rs(acc_dq[0], ds_frag[0][s], nmajor_desc(kn_desc, s));
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(acc_dq[0]);
        fence_regs(ds_frag[0]);
    }

    float scale_rows[1][2] = {{scale, scale}};
    // Through smem (padded rows from sQ on: nothing is read any more) with coalesced stores.
    store_query_rows(dq, dq_st, dq_sh, sQ, t, acc_dq, scale_rows, qw.row0, qw.col0, qw.g, qw.t4);
}
