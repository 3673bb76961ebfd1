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

// One row (slab sl, half hh) of a block: mask it where it needs it, and return its max over the quad (raw scores).
__device__ __forceinline__ float masked_row_max(float (&acc_s)[kMSlabs][kBlockN / 8][4], int sl, int hh,
                                                bool need_mask, const QTile& t, int count, int key_base,
                                                int window_left, int warp_row0, int g, int t4) {
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
    for (int nt = 0; nt < kBlockN / 8; ++nt) mx = fmaxf(mx, fmaxf(acc_s[sl][nt][2 * hh], acc_s[sl][nt][2 * hh + 1]));
    return quad_max(mx);
}

// One row of a block: S -> P = exp2(S * scale_log2 - m_use) in place; returns the row's sum of P (this lane's part).
__device__ __forceinline__ float exp_row(float (&acc_s)[kMSlabs][kBlockN / 8][4], int sl, int hh, float scale_log2,
                                         float m_use) {
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
        for (int e1 = 0; e1 < 2; ++e1) {
            float& x = acc_s[sl][nt][2 * hh + e1];
            x = fast_exp2(fmaf(x, scale_log2, -m_use));
            sum += x;
        }
    return sum;
}

// DKV_SOFTMAX_LAZY=1 (the default): lazy rescaling. A row keeps its running max while a block's max exceeds it by at
// most kLazyRescale (log2 units), so P <= 2^kLazyRescale, and the output accumulator is rescaled only when some row
// of the warp moves its max (a warp vote); O / l and the LSE are the same quantities, computed against another
// (consistent) reference max. H200, forward ms at (28, 4K) / (8, 8K) / (16, 32K), own processes: the mma.sync
// forward 14.54 / 9.20 / 76.54 against 14.90 / 9.43 / 78.61 without it (the WS forward on 192-key blocks 8.17 / 4.76 /
// 42.45 against 8.12 / 4.85 / 42.54; experiments/results/checks/s35fwd-*). Under NVRTC 13.0 every mma.sync forward
// build is spill-free with it, 24 spilled 8 / 8 bytes without (checks/s35lazy-spills-cpu-20261130.log). 0 restores
// the per-block rescale (the same products as before the lazy rescale, in another instruction order; those spill
// counts are the old order's); 2 is a known-wrong build for the checks to catch (lazy, but the output is never
// rescaled).
#ifndef DKV_SOFTMAX_LAZY
#define DKV_SOFTMAX_LAZY 1
#endif
constexpr float kLazyRescale = 8.f;

// The softmax of one key block without the output's rescale (online_softmax_step's first part): P in place, the
// running max / sum updated, each row's rescale factor in alpha. Returns whether the warp must rescale its output
// (always, unless DKV_SOFTMAX_LAZY).
__device__ __forceinline__ bool softmax_block(float (&acc_s)[kMSlabs][kBlockN / 8][4], float (&row_max)[kMSlabs][2],
                                              float (&row_sum)[kMSlabs][2], float (&alpha)[kMSlabs][2],
                                              const QTile& t, bool is_own, int count, int key_base, int window_left,
                                              int warp_row0, int g, int t4, float scale_log2) {
    const bool need_mask = block_needs_mask(t, is_own, count, key_base, window_left);
    bool moved = false;
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float mx =
                masked_row_max(acc_s, sl, hh, need_mask, t, count, key_base, window_left, warp_row0, g, t4);
            float m_new = fmaxf(row_max[sl][hh], mx * scale_log2);
            // (-inf <= -inf + 8: a row that has seen no key keeps -inf; its first visible key always moves it)
            const bool keep = DKV_SOFTMAX_LAZY && m_new <= row_max[sl][hh] + kLazyRescale;
            if (keep) m_new = row_max[sl][hh];
            moved |= !keep;
            const float m_use = m_new == -kInf ? 0.f : m_new;
            alpha[sl][hh] = keep ? 1.f : fast_exp2(row_max[sl][hh] - m_use);
            row_max[sl][hh] = m_new;
            row_sum[sl][hh] = row_sum[sl][hh] * alpha[sl][hh] + exp_row(acc_s, sl, hh, scale_log2, m_use);
        }
    }
    return DKV_SOFTMAX_LAZY != 2 && (!DKV_SOFTMAX_LAZY || __any_sync(0xffffffff, moved));
}

// The output accumulator's rescale by softmax_block's factors.
__device__ __forceinline__ void rescale_out(float (&acc_o)[kMSlabs][kOutCols / 8][4],
                                            const float (&alpha)[kMSlabs][2]) {
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl)
#pragma unroll
        for (int nt = 0; nt < kOutCols / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[sl][nt][e] *= alpha[sl][e / 2];
}

// One key block: mask it (only where it needs it), update the running max / sum in the log2 domain (scale folded into
// one FFMA), turn S into P in place and rescale the output accumulator (softmax_block, then the rescale where the warp
// needs it).
__device__ __forceinline__ void online_softmax_step(float (&acc_s)[kMSlabs][kBlockN / 8][4],
                                                    float (&acc_o)[kMSlabs][kOutCols / 8][4],
                                                    float (&row_max)[kMSlabs][2], float (&row_sum)[kMSlabs][2],
                                                    const QTile& t, bool is_own, int count, int key_base,
                                                    int window_left, int warp_row0, int g, int t4, float scale_log2) {
    float alpha[kMSlabs][2];
    if (softmax_block(acc_s, row_max, row_sum, alpha, t, is_own, count, key_base, window_left, warp_row0, g, t4,
                      scale_log2))
        rescale_out(acc_o, alpha);
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
