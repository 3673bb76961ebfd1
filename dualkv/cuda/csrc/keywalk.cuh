// The dK/dV kernels' walk over the queries that see one key block, shared by bwd_dkdv.cu (mma.sync) and
// bwd_dkdv_sm90.cu (wgmma): a CTA owns kBlockKeys keys of one K/V head, either own keys of a segment (its queries
// see them causally) or context keys (every segment of the group sees them fully), and visits, for each query head
// of the GQA group, each source segment's query positions that can see the block, kStep positions at a time.
//
// kRankOrder (bwd_dkdv.cu's ordered dQ, no window): the walk of dualkv/cuda/ws_schedule.py instead — every dependent
// segment's query tiles ascending, then the own segment's from the last tile down to the block's first (causal) or
// to tile 0, query heads innermost — so the CTAs of a run of key blocks reach each (head, query tile) in step and a
// block's dQ contribution rarely waits long for the block before it.
#pragma once

#include "common.cuh"

namespace dkv {

// The (KV head, key-tile row) of this CTA in the backwards whose dQ adds in a fixed order (ws_schedule.cta_order):
// head-major, every KV head's first `first_tiles` rows of the table in turn, then its other rows of every KV head in
// turn; otherwise a row's KV heads adjacent. Each KV head sees the table in order either way, so a CTA waits only on
// CTAs launched before it.
__device__ __forceinline__ int2 cta_head_tile(int kv_heads, int first_tiles, bool head_major, int bid) {
    if (!head_major) return make_int2(bid % kv_heads, bid / kv_heads);
    const int first_ctas = first_tiles * kv_heads;
    if (bid < first_ctas) return make_int2(bid / first_tiles, bid % first_tiles);
    const int rest = gridDim.x / kv_heads - first_tiles;
    return make_int2((bid - first_ctas) / rest, first_tiles + (bid - first_ctas) % rest);
}
__device__ __forceinline__ int2 cta_head_tile(int kv_heads, int first_tiles, bool head_major) {
    return cta_head_tile(kv_heads, first_tiles, head_major, blockIdx.x);
}

// blockIdx.x read anew (a volatile read the compiler cannot merge with an earlier one): what a kernel uses to find
// its CTA's (head, tile) again after its main loop, so that no copy of it stays live (or spilled) across the loop.
__device__ __forceinline__ int block_index_again() {
    int bid;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(bid));
    return bid;
}

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

template <int kStep, bool kRankOrder = false>
struct Walk {
    KeyTile kt;
    int n_src, key0, count, group, window_left;
    const int* segments;
    static_assert(!kRankOrder || !kWindow, "the rank-ordered walk has no window");

    __device__ __forceinline__ int seg_of(int src) const {
        return kt.own_seg >= 0 ? (src == 0 ? kt.own_seg : kt.dep_begin + src - 1) : kt.dep_begin + src;
    }
    __device__ __forceinline__ bool is_own(int src) const { return kt.own_seg >= 0 && src == 0; }

    // Query positions [p_lo, p_hi] of source src that can see some key of the block.
    __device__ __forceinline__ void range(int src, int& p_lo, int& p_hi) const {
        const Segment seg = load_segment(segments, seg_of(src));
        const int key_max = key0 + count - 1;  // in the source's logical coordinates below
        if (is_own(src)) {
            p_lo = kCausal ? key0 : 0;  // causal: a query sees the block only from its first key on
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

    // kRankOrder: the source after src (dependents first, the own segment, src 0, last); -1 past the end.
    __device__ __forceinline__ int next_src(int src) const {
        if (kt.own_seg >= 0 && src == 0) return -1;
        if (src + 1 < n_src) return src + 1;
        return kt.own_seg >= 0 ? 0 : -1;
    }
    // kRankOrder: the first tile (head 0) of the first non-empty source from src on; the own segment's is its last.
    __device__ __forceinline__ Cursor enter(int src) const {
        for (; src >= 0; src = next_src(src)) {
            int p_lo, p_hi;
            range(src, p_lo, p_hi);
            if (p_lo <= p_hi)
                return Cursor{0, src, is_own(src) ? p_lo + (p_hi - p_lo) / kStep * kStep : p_lo, p_hi, true};
        }
        return Cursor{0, 0, 0, 0, false};
    }

    __device__ __forceinline__ Cursor first() const {
        if constexpr (kRankOrder) return enter(kt.own_seg >= 0 && n_src > 1 ? 1 : 0);
        Cursor c{0, 0, -1, 0, false};
        c.valid = settle(c);
        return c;
    }
    __device__ __forceinline__ Cursor next(Cursor c) const {
        if constexpr (kRankOrder) {
            if (++c.h < group) return c;
            c.h = 0;
            if (is_own(c.src)) {  // downwards to the block's first query tile (range's p_lo)
                c.pos -= kStep;
                c.valid = c.pos >= (kCausal ? key0 : 0);
                return c;
            }
            c.pos += kStep;
            return c.pos <= c.p_hi ? c : enter(next_src(c.src));
        }
        c.pos += kStep;
        c.valid = settle(c);
        return c;
    }
};


// Rows of a (tokens, heads, d) tensor from a first row on: pointer and token stride (elements).
template <typename T>
struct StridedRows {
    T* first;
    long long stride;
};

// A CTA's walk (of one row of the key-tile table) and where its key rows live.
template <int kStep, bool kRankOrder = false>
struct KeyBlock {
    Walk<kStep, kRankOrder> w;
    bool has_own;
    int key_token0;  // first key row in the own (has_own) or context tensor

    // The block's key rows of head `head` in a key-side tensor pair (K, V, dK or dV): own rows or context rows.
    template <typename T>
    __device__ __forceinline__ StridedRows<T> rows(T* own, long long own_st, long long own_sh, T* ctx, long long ctx_st,
                                                   long long ctx_sh, int head) const {
        return has_own ? StridedRows<T>{own + key_token0 * own_st + head * own_sh, own_st}
                       : StridedRows<T>{ctx + key_token0 * ctx_st + head * ctx_sh, ctx_st};
    }
};

// Where one step (cursor) of the walk sits in logical positions, in the source segment's coordinates.
struct StepGeometry {
    Segment seg;     // the source segment
    int key_base;    // logical position of the block's first key
    int query_pos0;  // logical position of the step's first query
    bool need_mask;  // some (key, query) pair of the step is causal-diagonal or at a window boundary
};

template <int kStep, bool kRankOrder>
__device__ __forceinline__ StepGeometry step_geometry(const Walk<kStep, kRankOrder>& w, const Cursor& c,
                                                      int block_keys) {
    StepGeometry sg;
    sg.seg = load_segment(w.segments, w.seg_of(c.src));
    const bool own = w.is_own(c.src);
    sg.key_base = (own ? sg.seg.ctx_len : 0) + w.key0;
    sg.query_pos0 = sg.seg.ctx_len + c.pos;
    const int i_max = sg.seg.ctx_len + min(c.pos + kStep, c.p_hi + 1) - 1;
    sg.need_mask = (kCausal && own && sg.key_base + block_keys - 1 > sg.query_pos0) ||
                   (kWindow && sg.key_base < i_max - w.window_left);
    return sg;
}

// Stage one step's Q and dO rows (kStep positions of one query head; smem tiles padded, or swizzled for wgmma) and
// their LSE / D (rows beyond the segment: LSE = +inf so P = 0, D = 0) into the buffers given, by cp.async (the
// caller commits the group and waits for it; the rows beyond the segment are plain). kParts: 3 all of them; 1 Q,
// LSE and D; 2 dO alone (bwd_dkdv.cu's single dO buffer, filled later in the step). kRowPerThread: LSE / D one row per
// thread (needs kStep <= kThreads) rather than by the strided loop (see below; the caller chooses).
// (The tiles: pointers, or 32-bit shared addresses, SmemPtr32, for bwd_dkdv.cu's DKV_DKDV_SMEM32 & 2.)
template <int kStep, bool kSwizzle, bool kRankOrder, int kParts = 3, bool kRowPerThread = false, typename PE,
          typename PF>
__device__ __forceinline__ void load_walk_step(const Walk<kStep, kRankOrder>& w, const Cursor& c, int kv_head,
                                               const elem_t* __restrict__ q, long long q_st, long long q_sh,
                                               const elem_t* __restrict__ dout, long long do_st, long long do_sh,
                                               const float* __restrict__ lse2, const float* __restrict__ delta,
                                               long long lse_sh, PE sQ, PE sdO, PF sLse, PF sDelta) {
    const Segment seg = load_segment(w.segments, w.seg_of(c.src));
    const int head = kv_head * w.group + c.h;
    const int n = min(kStep, c.p_hi + 1 - c.pos);
    const long long tok0 = seg.q_start + c.pos;
    if (kParts & 1) load_strided_rows<kStep, kSwizzle>(sQ, q + tok0 * q_st + head * q_sh, q_st, n, q);
    if (kParts & 2) load_strided_rows<kStep, kSwizzle>(sdO, dout + tok0 * do_st + head * do_sh, do_st,
                                                       n, q);
    if (!(kParts & 1)) return;
    // LSE and D of valid rows by cp.async, in the step's copy group: plain loads here made the threads that stage
    // them (warps 0-1 of the mma.sync kernel) reach the next barrier a global-load latency late, every step (ncu
    // source counters: checks/ncu-mma-bwd-source-h100-20261127T1341Z.json); cp.async made the mma.sync backward
    // 3.5-4.2% faster on H100 (checks/mma-lsecp-h100-20261127T1402Z.json); the ordered dQ mode (kRankOrder) 3.8%
    // (checks/ordlayout-h100-20261128T0645Z.json).
    // kRowPerThread (bwd_dkdv.cu's two-level ordered dQ builds): one row per thread. As a strided loop, ptxas unrolled
    // it into about 150 instructions of 64-bit index math on the path of the warps that stage these rows. H200,
    // mma.sync backward at (28, 4K) / (8, 8K) / (16, 32K), two runs each, own processes: ordered 46.35 / 28.73 / 240.49
    // and 46.36 / 28.90 / 239.38 ms against the loop's 46.95 / 29.18 / 242.14 and 46.90 / 29.36 / 242.45; the atomic
    // mode's build ran 0.8-2.5% slower that way, so the other builds keep the loop
    // (experiments/results/checks/lsestage-h200-20261128T1456Z.log), and so do the ordered tree builds, which it made
    // spill (d = 128, sm_90 / sm_80: 28 / 8 bytes against 8 / none) and which were not timed with it. The two-level
    // shared-first builds (the default order) take it on sm_90 only (bwd_dkdv.cu, DKV_SHARED_FIRST_ROW_STATS, says
    // why). (The loop is spelled out rather than
    // calling stage_row: that form changed the atomic build's SASS, which was timed as it is.)
    static_assert(!kRowPerThread || kStep <= kThreads, "one LSE / D row per thread needs kStep threads");
    auto stage_row = [&](int r) {
        if (r >= n) {
            sLse[r] = kInf;
            sDelta[r] = 0.f;
        } else {
            const long long idx = head * lse_sh + tok0 + r;
            cp_async_4(sLse + r, lse2 + idx);
            cp_async_4(sDelta + r, delta + idx);
        }
    };
    if constexpr (kRowPerThread) {
        if (threadIdx.x < kStep) stage_row(threadIdx.x);
    } else {
        for (int r = threadIdx.x; r < kStep; r += kThreads) {
            const long long idx = head * lse_sh + tok0 + r;
            if (r >= n) {
                sLse[r] = kInf;
                sDelta[r] = 0.f;
            } else {
                cp_async_4(sLse + r, lse2 + idx);
                cp_async_4(sDelta + r, delta + idx);
            }
        }
    }
}

// The walk of key tile `tile` (a row of the key-tile table).
template <int kStep, bool kRankOrder = false>
__device__ __forceinline__ KeyBlock<kStep, kRankOrder> make_key_block(const int* key_tiles, int tile,
                                                                       const int* segments, int group_size,
                                                                       int window_left, int block_keys) {
    const int4 kt4 = reinterpret_cast<const int4*>(key_tiles)[tile];
    KeyBlock<kStep, kRankOrder> b;
    Walk<kStep, kRankOrder>& w = b.w;
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

// A step's LSE or D at one lane's query columns nt * 8 + 2 t4 + {0, 1} (probs_t / dscores_t), read once by 8-byte
// ld.shared from a 32-bit address (bwd_dkdv.cu's DKV_DKDV_SMEM32 & 4), or a pointer to the step's row (column c).
template <int kN8>
struct ColVals {
    float v[kN8][2];
};
template <int kN8>
__device__ __forceinline__ ColVals<kN8> load_cols(SmemPtr32<float> row, int t4) {
    ColVals<kN8> r;
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt)
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                     : "=f"(r.v[nt][0]), "=f"(r.v[nt][1])
                     : "r"((row + (nt * 8 + 2 * t4)).addr));
    return r;
}
__device__ __forceinline__ float col_val(const float* row, int c, int, int) { return row[c]; }
template <int kN8>
__device__ __forceinline__ float col_val(const ColVals<kN8>& cols, int, int nt, int e) { return cols.v[nt][e & 1]; }

// P^T of one step in place: acc holds S^T (16 keys of this warp x 8 kN8 queries, m16n8 layout: rows g, g + 8);
// key0 is the logical position of the warp's first key, query_pos0 that of the step's first query, lse the
// step's per-query LSE (log2 domain; +inf for rows beyond the segment, so their P is 0).
template <int kN8, typename PL>
__device__ __forceinline__ void probs_t(float (&acc)[kN8][4], PL lse, bool need_mask, int key0,
                                        int query_pos0, int window_left, int g, int t4, float scale_log2) {
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int c = nt * 8 + 2 * t4 + (e & 1);  // query column
            float p = fast_exp2(fmaf(acc[nt][e], scale_log2, -col_val(lse, c, nt, e)));
            if (need_mask) {
                const int key = key0 + g + 8 * (e >> 1);
                const int i = query_pos0 + c;
                if ((kCausal && key > i) || (kWindow && key < i - window_left)) p = 0.f;
            }
            acc[nt][e] = p;
        }
}

// dS^T = P^T * (dP^T - D) in place of dP^T (delta: the step's per-query D).
template <int kN8, typename PD>
__device__ __forceinline__ void dscores_t(float (&acc_dp)[kN8][4], const float (&p)[kN8][4], PD delta, int t4) {
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dp[nt][e] = p[nt][e] * (acc_dp[nt][e] - col_val(delta, nt * 8 + 2 * t4 + (e & 1), nt, e));
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
