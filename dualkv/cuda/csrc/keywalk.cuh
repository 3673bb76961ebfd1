// The dK/dV kernels' walk over the queries that see one key block, shared by bwd_dkdv.cu (mma.sync) and
// bwd_dkdv_sm90.cu (wgmma): a CTA owns kBlockKeys keys of one K/V head, either own keys of a segment (its queries
// see them causally) or context keys (every segment of the group sees them fully), and visits, for each query head
// of the GQA group, each source segment's query positions that can see the block, kStep positions at a time.
#pragma once

#include "common.cuh"

namespace dkv {

// One key tile of the schedule: keys [blk * kBlockKeys, ...) of the own region of segment own_seg (own_seg < 0:
// of the context tensor), seen fully by segments [dep_begin, dep_end).
struct KeyTile {
    int own_seg, blk, dep_begin, dep_end;
};

// A (query head, source segment, query tile) step of a CTA's walk.
struct Cursor {
    int h, src, pos, p_hi;  // src 0 is the owning segment when there is one
    bool valid;
};

template <int kStep>
struct Walk {
    KeyTile kt;
    int n_src, key0, count, group, window_left;
    const int* segments;

    __device__ __forceinline__ int seg_of(int src) const {
        return kt.own_seg >= 0 ? (src == 0 ? kt.own_seg : kt.dep_begin + src - 1) : kt.dep_begin + src;
    }
    __device__ __forceinline__ bool is_own(int src) const { return kt.own_seg >= 0 && src == 0; }

    // Query positions [p_lo, p_hi] of source src that can see some key of the block.
    __device__ __forceinline__ void range(int src, int& p_lo, int& p_hi) const {
        const Segment seg = load_segment(segments, seg_of(src));
        const int key_max = key0 + count - 1;  // in the source's logical coordinates below
        if (is_own(src)) {
            p_lo = key0;  // causal: a query sees the block only from its first key on
            p_hi = seg.q_len - 1;
            if (kWindow) p_hi = min(p_hi, key_max + window_left);
        } else {
            p_lo = 0;
            p_hi = seg.q_len - 1;
            if (kWindow) p_hi = min(p_hi, key_max + window_left - seg.ctx_len);
        }
    }

    __device__ __forceinline__ bool settle(Cursor& c) const {  // move forward to the first non-empty source
        while (c.h < group) {
            while (c.src < n_src) {
                int p_lo, p_hi;
                range(c.src, p_lo, p_hi);
                if (c.pos < 0) c.pos = p_lo;
                if (c.pos <= p_hi) {
                    c.p_hi = p_hi;
                    return true;
                }
                ++c.src;
                c.pos = -1;
            }
            ++c.h;
            c.src = 0;
            c.pos = -1;
        }
        return false;
    }
    __device__ __forceinline__ Cursor first() const {
        Cursor c{0, 0, -1, 0, false};
        c.valid = settle(c);
        return c;
    }
    __device__ __forceinline__ Cursor next(Cursor c) const {
        c.pos += kStep;
        c.valid = settle(c);
        return c;
    }
};


// The CTA's walk (blockIdx.x indexes the key-tile table) and where its key rows live.
template <int kStep>
struct KeyBlock {
    Walk<kStep> w;
    bool has_own;
    int key_token0;  // first key row in the own (has_own) or context tensor
};

template <int kStep>
__device__ __forceinline__ KeyBlock<kStep> make_key_block(const int* key_tiles, const int* segments, int group_size,
                                                           int window_left, int block_keys) {
    const int4 kt4 = reinterpret_cast<const int4*>(key_tiles)[blockIdx.x];
    KeyBlock<kStep> b;
    Walk<kStep>& w = b.w;
    w.kt = KeyTile{kt4.x, kt4.y, kt4.z, kt4.w};
    w.segments = segments;
    w.group = group_size;
    w.window_left = window_left;
    w.n_src = (w.kt.own_seg >= 0 ? 1 : 0) + (w.kt.dep_end - w.kt.dep_begin);
    w.key0 = w.kt.blk * block_keys;
    b.has_own = w.kt.own_seg >= 0;
    const Segment key_seg = load_segment(segments, b.has_own ? w.kt.own_seg : w.kt.dep_begin);
    b.key_token0 = (b.has_own ? key_seg.q_start : key_seg.ctx_start) + w.key0;
    w.count = min(block_keys, (b.has_own ? key_seg.q_len : key_seg.ctx_len) - w.key0);
    return b;
}

// P^T of one step in place: acc holds S^T (16 keys of this warp x 8 kN8 queries, m16n8 layout: rows g, g + 8);
// key0 is the logical position of the warp's first key, query_pos0 that of the step's first query, lse the
// step's per-query LSE (log2 domain; +inf for rows beyond the segment, so their P is 0).
template <int kN8>
__device__ __forceinline__ void probs_t(float (&acc)[kN8][4], const float* lse, bool need_mask, int key0,
                                        int query_pos0, int window_left, int g, int t4, float scale_log2) {
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int c = nt * 8 + 2 * t4 + (e & 1);  // query column
            float p = fast_exp2(fmaf(acc[nt][e], scale_log2, -lse[c]));
            if (need_mask) {
                const int key = key0 + g + 8 * (e >> 1);
                const int i = query_pos0 + c;
                if (key > i || (kWindow && key < i - window_left)) p = 0.f;
            }
            acc[nt][e] = p;
        }
}

// dS^T = P^T * (dP^T - D) in place of dP^T (delta: the step's per-query D).
template <int kN8>
__device__ __forceinline__ void dscores_t(float (&acc_dp)[kN8][4], const float (&p)[kN8][4],
                                          const float* delta, int t4) {
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dp[nt][e] = p[nt][e] * (acc_dp[nt][e] - delta[nt * 8 + 2 * t4 + (e & 1)]);
}

// Copy the valid rows of a padded (kRowStride) smem tile to (tokens, heads, d) rows at dst (16-byte stores).
__device__ __forceinline__ void store_padded_rows(elem_t* dst, long long tok_st, const elem_t* tile, int rows,
                                                  int count) {
    for (int idx = threadIdx.x; idx < rows * kChunksPerRow; idx += kThreads) {
        const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
        if (r >= count) continue;
        *reinterpret_cast<uint4*>(dst + r * tok_st + c * 8) = *reinterpret_cast<const uint4*>(tile + r * kRowStride + c * 8);
    }
}

}  // namespace dkv
