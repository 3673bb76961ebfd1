// The forward kernels' online softmax over one key block, and their epilogue's row statistics; shared by the
// mma.sync forward (fwd.cu) and the Hopper wgmma forward (fwd_sm90.cu), whose accumulators have the same
// per-warp fragment layout (16-row slabs, rows g and g + 8, column pairs 2 t4).
#pragma once

#include "qtile.cuh"

namespace dkv {

__device__ __forceinline__ void init_rows(float (&acc_o)[kMSlabs][kOutCols / 8][4], float (&row_max)[kMSlabs][2],
                                          float (&row_sum)[kMSlabs][2]) {
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl) {
#pragma unroll
        for (int nt = 0; nt < kOutCols / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[sl][nt][e] = 0.f;
        row_max[sl][0] = row_max[sl][1] = -kInf;
        row_sum[sl][0] = row_sum[sl][1] = 0.f;
    }
}

// Mask the block (only when it needs it), update the running max / sum in the log2 domain (scale folded into one
// FFMA), turn S into P in place and rescale the output accumulator.
__device__ __forceinline__ void online_softmax_step(float (&acc_s)[kMSlabs][kBlockN / 8][4],
                                                    float (&acc_o)[kMSlabs][kOutCols / 8][4],
                                                    float (&row_max)[kMSlabs][2], float (&row_sum)[kMSlabs][2],
                                                    const QTile& t, bool is_own, int count, int key_base,
                                                    int window_left, int warp_row0, int g, int t4, float scale_log2) {
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
}

// Row sums reduced over the quad: 1 / l into inv_l (0 for rows that saw no key) and the natural-log LSE of the
// tile's valid rows into lse (H, T_q) (+inf for rows that saw no key).
__device__ __forceinline__ void finish_rows(float* lse, long long lse_sh, const QTile& t,
                                            const float (&row_max)[kMSlabs][2], const float (&row_sum)[kMSlabs][2],
                                            float (&inv_l)[kMSlabs][2], const QWarp& qw) {
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float l = quad_sum(row_sum[sl][hh]);
            inv_l[sl][hh] = l > 0.f ? 1.f / l : 0.f;
            const int r = qw.row0 + sl * 16 + qw.g + 8 * hh;
            const int p = r % kPosPerTile;
            if (qw.dsplit == 0 && qw.t4 == 0 && p < t.n_pos)
                lse[(t.head0 + r / kPosPerTile) * lse_sh + t.seg.q_start + t.pos0 + p] =
                    l > 0.f ? (row_max[sl][hh] + log2f(l)) * 0.6931471805599453f : kInf;
        }
}

}  // namespace dkv
