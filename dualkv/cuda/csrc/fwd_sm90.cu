// DualKV forward for Hopper (sm_90a): the schedule, masks and online softmax of fwd.cu, with the two products on
// warpgroup MMAs (wgmma) reading K and V straight from shared memory.
//
// CTA (tile, head group) as in qtile.cuh, kWarps = 8: two warpgroups of 64 query rows each (warp w owns rows
// 16w .. 16w + 15, the same rows as the mma.sync kernel with one slab per warp). Q, K and V tiles sit in shared
// memory in the 128-byte-swizzle layout (common.cuh: swizzled_offset); K and V are double-buffered with cp.async.
// Per block and warpgroup:
//   S = Q K^T      wgmma m64 n{kBlockN} k16, A (Q) and B (K) K-major descriptors, HEAD_DIM / 16 steps;
//   P = softmax    online, in registers (softmax.cuh), then packed into A fragments;
//   O += P V       wgmma m64 n{kHeadDimAcc} k16, A (P) from registers, B (V) N-major (transposed) descriptor.
// At head dim 96 the tiles have 128 columns (sm90.cuh: the 96 head dim), S takes 6 k-steps and O's columns
// 96..127 are dropped at the store.
// DKV_OVERLAP = 0: load block it + 1 while block it runs S, softmax, PV in turn. DKV_OVERLAP = 1 (FlashAttention-3's
// intra-warpgroup overlap): S of block it + 1 is issued before the softmax of block it, so the tensor cores work
// while the softmax runs; K[it + 2] and V[it + 1] load meanwhile.
#include "kernel_params.cuh"
#include "qtile_sm90.cuh"
#include "softmax.cuh"

using namespace dkv;

namespace {

// S = Q K^T for this warpgroup's 64 rows (q_desc: kmajor_tile of them) and one K tile (HEAD_DIM / 16 wgmma steps), issued and committed.
__device__ __forceinline__ void issue_qk(float (&acc_s)[kBlockN / 8][4], unsigned long long q_desc, unsigned k_addr) {
    const unsigned long long k_desc = kmajor_tile(k_addr, 0);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kHeadDim / 16; ++s)
        wgmma_ss(acc_s, kmajor_desc<kBlockM>(q_desc, s), kmajor_desc<kBlockN>(k_desc, s), s > 0);
    wgmma_commit();
}

// O += P V for one V tile (kBlockN / 16 wgmma steps, P from registers), issued and committed.
__device__ __forceinline__ void issue_pv(float (&acc_o)[kHeadDimAcc / 8][4], const unsigned (&p_frag)[kBlockN / 16][4],
                                         unsigned v_addr) {
    const unsigned long long v_desc = nmajor_tile<kBlockN>(v_addr);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kBlockN / 16; ++s) wgmma_rs(acc_o, p_frag[s], nmajor_desc(v_desc, s));
    wgmma_commit();
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1) dualkv_fwd_sm90(DKV_FWD_PARAMS) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // wgmma's swizzle pattern is anchored to 1024-byte boundaries (the launcher adds 1 KB of slack).
    unsigned char* base = align_1024(smem_raw);
    elem_t* sQ = reinterpret_cast<elem_t*>(base);
    const KVStages kv{base + kTileBytesQ};

    const QTile t = make_qtile(segments, tiles, group_size, window_left);
    const QWarp qw = qwarp();
    const int warpgroup = __shfl_sync(0xffffffff, threadIdx.x / 128, 0);  // warp-uniform: descriptors in uniform registers
    const unsigned long long q_desc = kmajor_tile(smem_addr(sQ), warpgroup * 64);
    auto load_k = [&](int it) { load_key_block<true>(kv.k(it), t, it, kd, kd_st, kd_sh, kc, kc_st, kc_sh, q); };
    auto load_v = [&](int it) { load_key_block<true>(kv.v(it), t, it, vd, vd_st, vd_sh, vc, vc_st, vc_sh, q); };

    float acc_o[1][kHeadDimAcc / 8][4];
    float row_max[1][2], row_sum[1][2];  // row_max in the scaled log2 domain
    init_rows(acc_o, row_max, row_sum);

    // Softmax of block it (S in acc_s), then O += P V[it] issued; returns with that product in flight.
    auto softmax_and_pv = [&](int it, float (&acc_s)[1][kBlockN / 8][4], unsigned (&p_frag)[1][kBlockN / 16][4]) {
        bool is_own;
        const int k0 = block_start(t, it, is_own);
        const int count = block_count(t, is_own, k0);
        const int key_base = block_key_base(t, is_own, k0);  // logical position of key 0 of the block
        fence_regs(acc_o[0]);
        online_softmax_step(acc_s, acc_o, row_max, row_sum, t, is_own, count, key_base, window_left, qw.row0, qw.g,
                            qw.t4, scale_log2);
        to_a_frag<1, kBlockN>(p_frag, acc_s);
        issue_pv(acc_o[0], p_frag[0], smem_addr(kv.v(it)));
    };

    load_query_rows<true>(sQ, q, q_st, q_sh, t);
    load_k(0);
    load_v(0);
#if DKV_OVERLAP
    // S of block it + 1 runs on the tensor cores while the softmax of block it runs on the other units.
    if (t.n_iter > 1) load_k(1);
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    float acc_a[1][kBlockN / 8][4], acc_b[1][kBlockN / 8][4];
    issue_qk(acc_a[0], q_desc, smem_addr(kv.k(0)));
    wgmma_wait<0>();
    fence_regs(acc_a[0]);
    // Block it: S[it] is in cur; K[it + 1] and V[it] are loaded (or loading).
    auto step = [&](int it, float (&cur)[1][kBlockN / 8][4], float (&nxt)[1][kBlockN / 8][4]) {
        if (it > 0) {
            cp_async_wait<0>();
            fence_async_smem();
            __syncthreads();  // K[it + 1], V[it] landed everywhere; every warpgroup is done with S[it], PV[it - 1]
        }
        if (it + 2 < t.n_iter) load_k(it + 2);  // into K[it]'s stage
        if (it + 1 < t.n_iter) load_v(it + 1);  // into V[it - 1]'s stage
        cp_async_commit();
        if (it + 1 < t.n_iter) issue_qk(nxt[0], q_desc, smem_addr(kv.k(it + 1)));
        unsigned p_frag[1][kBlockN / 16][4];
        softmax_and_pv(it, cur, p_frag);
        wgmma_wait<0>();
        fence_regs(nxt[0]);
        fence_regs(acc_o[0]);
        fence_regs(p_frag[0]);
    };
    for (int it = 0; it < t.n_iter; it += 2) {
        step(it, acc_a, acc_b);
        if (it + 1 < t.n_iter) step(it + 1, acc_b, acc_a);
    }
#else
    cp_async_commit();
    for (int it = 0; it < t.n_iter; ++it) {
        cp_async_wait<0>();
        fence_async_smem();  // this thread's cp.async writes, visible to the tensor cores' async proxy
        __syncthreads();     // block it (and Q) landed everywhere; every warp is done with block it - 1
        if (it + 1 < t.n_iter) {
            load_k(it + 1);
            load_v(it + 1);
        }
        cp_async_commit();
        float acc_s[1][kBlockN / 8][4];
        issue_qk(acc_s[0], q_desc, smem_addr(kv.k(it)));
        wgmma_wait<0>();
        fence_regs(acc_s[0]);
        unsigned p_frag[1][kBlockN / 16][4];
        softmax_and_pv(it, acc_s, p_frag);
        wgmma_wait<0>();
        fence_regs(acc_o[0]);
        fence_regs(p_frag[0]);
    }
#endif

    float inv_l[1][2];
    finish_rows(lse, lse_sh, t, row_max, row_sum, inv_l, qw);
    // O / l through smem (padded rows from sQ on: Q, K and V are no longer read) with coalesced stores.
    store_query_rows(o, o_st, o_sh, sQ, t, acc_o, inv_l, qw.row0, qw.col0, qw.g, qw.t4);
}
