// DualKV forward: one launch over every segment of a shared-prompt micro-batch.
//
// CTA (tile, head group), see qtile.cuh. Its queries attend, with one online softmax carried across both regions,
//   * to the segment's own keys (causal, logical position ctx_len + j), visited first, last block first;
//   * to the segment's context keys (fully visible, logical positions 0..ctx_len-1), stored once and read by every
//     segment of the group.
// Each region is tiled into kBlockN-key blocks from its own start, so a region's last block may be partial; every
// load is bounds-checked (zero-fill) and partial, diagonal and window-boundary blocks are masked per element.
// Blocks entirely outside a sliding window are skipped. Writes O and the natural-log LSE (H, T_q).
#include "qtile.cuh"

using namespace dkv;

extern "C" __global__ void __launch_bounds__(kThreads) dualkv_fwd(
    const elem_t* __restrict__ q, long long q_st, long long q_sh,
    const elem_t* __restrict__ kc, long long kc_st, long long kc_sh,
    const elem_t* __restrict__ vc, long long vc_st, long long vc_sh,
    const elem_t* __restrict__ kd, long long kd_st, long long kd_sh,
    const elem_t* __restrict__ vd, long long vd_st, long long vd_sh,
    elem_t* __restrict__ o, long long o_st, long long o_sh,
    float* __restrict__ lse, long long lse_sh,
    const int* __restrict__ segments, const int* __restrict__ tiles,
    int group_size, float scale_log2, int window_left) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    elem_t* sQ = reinterpret_cast<elem_t*>(smem_raw);
    elem_t* sK = sQ + kBlockM * kRowStride;
    elem_t* sV = sK + kBlockN * kRowStride;

    const QTile t = make_qtile(segments, tiles, group_size, window_left);
    load_query_rows(sQ, q, q_st, q_sh, t);
    cp_async_commit();
    if (t.n_iter > 0) load_key_block(sK, t, 0, kd, kd_st, kd_sh, kc, kc_st, kc_sh, q);
    cp_async_commit();

    const QWarp qw = qwarp();
    const int g = qw.g, t4 = qw.t4, lrow = qw.lrow, lmat = qw.lmat, warp_row0 = qw.row0, col0 = qw.col0;

    float acc_o[kMSlabs][kOutCols / 8][4];
    float row_max[kMSlabs][2], row_sum[kMSlabs][2];  // row_max in the scaled log2 domain
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl) {
#pragma unroll
        for (int nt = 0; nt < kOutCols / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[sl][nt][e] = 0.f;
        row_max[sl][0] = row_max[sl][1] = -kInf;
        row_sum[sl][0] = row_sum[sl][1] = 0.f;
    }

    for (int it = 0; it < t.n_iter; ++it) {
        cp_async_wait<0>();
        __syncthreads();  // K[it] (and Q) landed; every warp is done with V[it-1]
        load_key_block(sV, t, it, vd, vd_st, vd_sh, vc, vc_st, vc_sh, q);
        cp_async_commit();

        bool is_own;
        const int k0 = block_start(t, it, is_own);
        const int count = block_count(t, is_own, k0);
        const int key_base = (is_own ? t.seg.ctx_len : 0) + k0;  // logical position of key 0 of the block

        float acc_s[kMSlabs][kBlockN / 8][4];
        gemm_rows_rows<kMSlabs, kBlockN>(acc_s, sQ, sK, warp_row0, lrow, lmat);  // S = Q K^T (whole head dim)

        // Mask (only blocks that need it); online softmax in the log2 domain, scale folded into one FFMA.
        const bool need_mask = block_needs_mask(t, is_own, count, key_base, window_left);
#pragma unroll
        for (int sl = 0; sl < kMSlabs; ++sl) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                if (need_mask) {
                    const int i = row_position(t, warp_row0, sl, g, hh);
#pragma unroll
                    for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
                        for (int e1 = 0; e1 < 2; ++e1) {
                            const int j = nt * 8 + 2 * t4 + e1;
                            if (!key_visible(j, count, key_base + j, i, window_left)) acc_s[sl][nt][2 * hh + e1] = -kInf;
                        }
                }
                float mx = -kInf;
#pragma unroll
                for (int nt = 0; nt < kBlockN / 8; ++nt)
                    mx = fmaxf(mx, fmaxf(acc_s[sl][nt][2 * hh], acc_s[sl][nt][2 * hh + 1]));
                mx = quad_max(mx);
                const float m_new = fmaxf(row_max[sl][hh], mx * scale_log2);
                const float m_use = m_new == -kInf ? 0.f : m_new;
                const float alpha = fast_exp2(row_max[sl][hh] - m_use);
                row_max[sl][hh] = m_new;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
                    for (int e1 = 0; e1 < 2; ++e1) {
                        float& x = acc_s[sl][nt][2 * hh + e1];
                        x = fast_exp2(fmaf(x, scale_log2, -m_use));
                        sum += x;
                    }
                row_sum[sl][hh] = row_sum[sl][hh] * alpha + sum;
#pragma unroll
                for (int nt = 0; nt < kOutCols / 8; ++nt) {
                    acc_o[sl][nt][2 * hh] *= alpha;
                    acc_o[sl][nt][2 * hh + 1] *= alpha;
                }
            }
        }
        unsigned p_frag[kMSlabs][kBlockN / 16][4];
        to_a_frag<kMSlabs, kBlockN>(p_frag, acc_s);

        cp_async_wait<0>();
        __syncthreads();  // V[it] landed; every warp is done with K[it]
        if (it + 1 < t.n_iter) load_key_block(sK, t, it + 1, kd, kd_st, kd_sh, kc, kc_st, kc_sh, q);
        cp_async_commit();

        gemm_frag_rows<kMSlabs, kBlockN, kOutCols>(acc_o, p_frag, sV, col0, lrow, lmat);  // O += P V (this warp's columns)
    }

    // Epilogue: LSE of valid rows, then O / l through smem with coalesced stores.
    float inv_l[kMSlabs][2];
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float l = quad_sum(row_sum[sl][hh]);
            inv_l[sl][hh] = l > 0.f ? 1.f / l : 0.f;
            const int r = warp_row0 + sl * 16 + g + 8 * hh;
            const int p = r % kPosPerTile;
            if (qw.dsplit == 0 && t4 == 0 && p < t.n_pos)
                lse[(t.head0 + r / kPosPerTile) * lse_sh + t.seg.q_start + t.pos0 + p] =
                    l > 0.f ? (row_max[sl][hh] + log2f(l)) * 0.6931471805599453f : kInf;
        }
    store_query_rows(o, o_st, o_sh, sQ, t, acc_o, inv_l, warp_row0, col0, g, t4);
}
