// DualKV forward: one launch over every segment of a shared-prompt micro-batch.
//
// CTA (tile, head group): a tile is kPosPerTile query positions of one segment times kPack query heads that
// share one K/V head. Its queries attend, with one online softmax carried across both regions,
//   * to the segment's own keys (causal, logical position ctx_len + j), visited first, last block first;
//   * to the segment's context keys (fully visible, logical positions 0..ctx_len-1), stored once and read by every
//     segment of the group.
// Each region is tiled into kBlockN-key blocks from its own start, so a region's last block may be partial; every
// load is bounds-checked (zero-fill) and partial, diagonal and window-boundary blocks are masked per element.
// Blocks entirely outside a sliding window are skipped.
#include "common.cuh"

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

    const int2 tile = reinterpret_cast<const int2*>(tiles)[blockIdx.x];
    const Segment seg = load_segment(segments, tile.x);
    const int pos0 = tile.y * kPosPerTile;
    const int n_pos = min(kPosPerTile, seg.q_len - pos0);
    const int head0 = blockIdx.y * kPack;
    const int kv_head = head0 / group_size;

    // ---- Q tile: row r is (head0 + r / kPosPerTile, position pos0 + r % kPosPerTile).
    {
        const elem_t* q_tile = q + (seg.q_start + pos0) * q_st + head0 * q_sh;
        load_rows_async<kBlockM>(sQ, q, [=](int r) -> const elem_t* {
            const int p = r % kPosPerTile;
            return p < n_pos ? q_tile + p * q_st + (r / kPosPerTile) * q_sh : nullptr;
        });
    }
    cp_async_commit();

    const KeyRange kr = key_range(seg, pos0, pos0 + n_pos - 1, window_left);
    const int n_own = kr.own_end - kr.own_first;
    const int n_iter = n_own + (kr.ctx_end - kr.ctx_first);

    // Block `it` of the visiting order: own blocks last-first, then context blocks last-first.
    // Returns the block's first key index within its region; is_own tells the region.
    auto block_start = [=](int it, bool& is_own) -> int {
        is_own = it < n_own;
        return (is_own ? kr.own_end - 1 - it : kr.ctx_end - 1 - (it - n_own)) * kBlockN;
    };
    // Load block `it` of K (want_v = false) or V (true) into dst.
    auto load_kv = [=](elem_t* dst, bool want_v, int it) {
        bool is_own;
        const int k0 = block_start(it, is_own);
        const int count = min(kBlockN, (is_own ? seg.q_len : seg.ctx_len) - k0);
        const elem_t* base;
        long long st;
        if (is_own) {
            base = want_v ? vd + (seg.q_start + k0) * vd_st + kv_head * vd_sh
                          : kd + (seg.q_start + k0) * kd_st + kv_head * kd_sh;
            st = want_v ? vd_st : kd_st;
        } else {
            base = want_v ? vc + (seg.ctx_start + k0) * vc_st + kv_head * vc_sh
                          : kc + (seg.ctx_start + k0) * kc_st + kv_head * kc_sh;
            st = want_v ? vc_st : kc_st;
        }
        load_rows_async<kBlockN>(dst, q, [=](int r) -> const elem_t* { return r < count ? base + r * st : nullptr; });
    };
    if (n_iter > 0) load_kv(sK, false, 0);
    cp_async_commit();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row_warp = warp % kRowWarps, dsplit = warp / kRowWarps;
    const int g = lane / 4, t4 = lane % 4;
    const int lrow = lane % 8, lmat = lane / 8;
    const int warp_row0 = row_warp * 16 * kMSlabs;
    const int col0 = dsplit * kOutCols;

    // Logical position of the two rows (g, g + 8) this thread holds in each slab.
    int row_pos[kMSlabs][2];
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
            row_pos[sl][hh] = seg.ctx_len + pos0 + (warp_row0 + sl * 16 + g + 8 * hh) % kPosPerTile;

    float acc_o[kMSlabs][kOutCols / 8][4];
    float row_max[kMSlabs][2], row_sum[kMSlabs][2];
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl) {
#pragma unroll
        for (int nt = 0; nt < kOutCols / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[sl][nt][e] = 0.f;
        row_max[sl][0] = row_max[sl][1] = -kInf;
        row_sum[sl][0] = row_sum[sl][1] = 0.f;
    }
    const int i_min = seg.ctx_len + pos0, i_max = seg.ctx_len + pos0 + n_pos - 1;

    for (int it = 0; it < n_iter; ++it) {
        cp_async_wait<0>();
        __syncthreads();  // K[it] (and Q) landed; every warp is done with V[it-1]
        load_kv(sV, true, it);
        cp_async_commit();

        bool is_own;
        const int k0 = block_start(it, is_own);
        const int count = min(kBlockN, (is_own ? seg.q_len : seg.ctx_len) - k0);
        const int key_base = (is_own ? seg.ctx_len : 0) + k0;  // logical position of key 0 of the block

        // ---- S = Q K^T over the whole head dim (duplicated across d-split warps).
        float acc_s[kMSlabs][kBlockN / 8][4];
#pragma unroll
        for (int sl = 0; sl < kMSlabs; ++sl)
#pragma unroll
            for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_s[sl][nt][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            unsigned a[kMSlabs][4];
#pragma unroll
            for (int sl = 0; sl < kMSlabs; ++sl)
                ldmatrix_x4(a[sl], sQ + (warp_row0 + sl * 16 + (lmat % 2) * 8 + lrow) * kRowStride + kk * 16 +
                                       (lmat / 2) * 8);
#pragma unroll
            for (int np = 0; np < kBlockN / 16; ++np) {
                unsigned b[4];
                ldmatrix_x4(b, sK + (np * 16 + (lmat / 2) * 8 + lrow) * kRowStride + kk * 16 + (lmat % 2) * 8);
#pragma unroll
                for (int sl = 0; sl < kMSlabs; ++sl) {
                    mma_16816(acc_s[sl][2 * np], a[sl], b[0], b[1]);
                    mma_16816(acc_s[sl][2 * np + 1], a[sl], b[2], b[3]);
                }
            }
        }

        // ---- Mask (only blocks that need it), online softmax in the log2 domain.
        const bool need_mask = count < kBlockN || (is_own && key_base + kBlockN - 1 > i_min) ||
                               (kWindow && key_base < i_max - window_left);
#pragma unroll
        for (int sl = 0; sl < kMSlabs; ++sl) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                float mx = -kInf;
#pragma unroll
                for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
                    for (int e1 = 0; e1 < 2; ++e1) {
                        float& s = acc_s[sl][nt][2 * hh + e1];
                        s *= scale_log2;
                        if (need_mask) {
                            const int j = nt * 8 + 2 * t4 + e1;
                            const int key = key_base + j;
                            const int i = row_pos[sl][hh];
                            const bool visible = j < count && key <= i && (!kWindow || key >= i - window_left);
                            if (!visible) s = -kInf;
                        }
                        mx = fmaxf(mx, s);
                    }
                mx = quad_max(mx);
                const float m_new = fmaxf(row_max[sl][hh], mx);
                const float m_use = m_new == -kInf ? 0.f : m_new;
                const float alpha = exp2f(row_max[sl][hh] - m_use);
                row_max[sl][hh] = m_new;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
                    for (int e1 = 0; e1 < 2; ++e1) {
                        float& s = acc_s[sl][nt][2 * hh + e1];
                        s = exp2f(s - m_use);
                        sum += s;
                    }
                row_sum[sl][hh] = row_sum[sl][hh] * alpha + sum;
#pragma unroll
                for (int nt = 0; nt < kOutCols / 8; ++nt) {
                    acc_o[sl][nt][2 * hh] *= alpha;
                    acc_o[sl][nt][2 * hh + 1] *= alpha;
                }
            }
        }

        cp_async_wait<0>();
        __syncthreads();  // V[it] landed; every warp is done with K[it]
        if (it + 1 < n_iter) load_kv(sK, false, it + 1);
        cp_async_commit();

        // ---- O += P V on this warp's output columns.
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
            unsigned a[kMSlabs][4];
#pragma unroll
            for (int sl = 0; sl < kMSlabs; ++sl) {
                a[sl][0] = pack2(acc_s[sl][2 * kk][0], acc_s[sl][2 * kk][1]);
                a[sl][1] = pack2(acc_s[sl][2 * kk][2], acc_s[sl][2 * kk][3]);
                a[sl][2] = pack2(acc_s[sl][2 * kk + 1][0], acc_s[sl][2 * kk + 1][1]);
                a[sl][3] = pack2(acc_s[sl][2 * kk + 1][2], acc_s[sl][2 * kk + 1][3]);
            }
#pragma unroll
            for (int np = 0; np < kOutCols / 16; ++np) {
                unsigned b[4];
                ldmatrix_x4_trans(b, sV + (kk * 16 + (lmat % 2) * 8 + lrow) * kRowStride + col0 + np * 16 +
                                         (lmat / 2) * 8);
#pragma unroll
                for (int sl = 0; sl < kMSlabs; ++sl) {
                    mma_16816(acc_o[sl][2 * np], a[sl], b[0], b[1]);
                    mma_16816(acc_o[sl][2 * np + 1], a[sl], b[2], b[3]);
                }
            }
        }
    }

    // ---- Epilogue: normalise, store O and the LSE of valid rows.
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = warp_row0 + sl * 16 + g + 8 * hh;
            const int p = r % kPosPerTile;
            const float l = quad_sum(row_sum[sl][hh]);
            if (p >= n_pos) continue;
            const int token = seg.q_start + pos0 + p;
            const int head = head0 + r / kPosPerTile;
            const float inv = l > 0.f ? 1.f / l : 0.f;
            elem_t* out_row = o + token * o_st + head * o_sh + col0;
#pragma unroll
            for (int nt = 0; nt < kOutCols / 8; ++nt) {
                *reinterpret_cast<unsigned*>(out_row + nt * 8 + 2 * t4) =
                    pack2(acc_o[sl][nt][2 * hh] * inv, acc_o[sl][nt][2 * hh + 1] * inv);
            }
            if (dsplit == 0 && t4 == 0) {
                lse[head * lse_sh + token] =
                    l > 0.f ? (row_max[sl][hh] + log2f(l)) * 0.6931471805599453f : kInf;
            }
        }
    }
}
