// Query-tile-parallel machinery shared by the forward and the deterministic dQ kernel.
//
// A CTA owns (tile, head group): kPosPerTile query positions of one segment times kPack query heads sharing one
// K/V head (row r of the tile is head head0 + r / kPosPerTile, position pos0 + r % kPosPerTile). It visits the
// segment's own key blocks (causal) last-first, then its context key blocks last-first. Tile macros:
//   DKV_BLOCK_N  keys per block          DKV_MSLABS  16-row MMA slabs per warp
//   DKV_DSPLIT   warps sharing a row slab, each owning HEAD_DIM / DKV_DSPLIT output columns
//   DKV_PACK     query heads packed per CTA
//   DKV_TREE     1: prefix-tree segments (PrefixTreeLayout): a segment's context is a list of packed runs (its
//                ancestors), not one run; see tree_runs below
#pragma once

#include "common.cuh"

namespace dkv {

constexpr int kBlockN = DKV_BLOCK_N;
constexpr int kMSlabs = DKV_MSLABS;
constexpr int kDSplit = DKV_DSPLIT;
constexpr int kRowWarps = kWarps / kDSplit;              // warps along the row dimension
constexpr int kBlockM = kRowWarps * 16 * kMSlabs;        // query rows per CTA tile (positions x packed heads)
constexpr int kPack = DKV_PACK;
constexpr int kPosPerTile = kBlockM / kPack;             // query positions per CTA tile
#ifndef DKV_TREE
#define DKV_TREE 0
#endif
constexpr bool kTree = DKV_TREE != 0;
static_assert(!kTree || (kCausal && !kWindow), "tree segments are built causal, without a sliding window");
constexpr int kOutCols = kHeadDimAcc / kDSplit;          // output (accumulator) columns per warp

static_assert(kBlockN % 16 == 0, "block_n must be a multiple of 16");
static_assert(kWarps % kDSplit == 0, "warps must divide into d-split groups");
static_assert(kOutCols % 16 == 0, "each warp's output columns must be a multiple of 16");
static_assert(kBlockM % kPack == 0, "packed heads must divide the row tile");

// Key blocks a query tile of positions [pos_lo, pos_hi] (inclusive, logical = ctx_len + pos) must visit, per
// region. Blocks are counted from the start of each region; [first, end) in block units.
struct KeyRange {
    int own_first, own_end, ctx_first, ctx_end;
};

__device__ __forceinline__ KeyRange key_range(const Segment& seg, int pos_lo, int pos_hi, int window_left) {
    KeyRange kr;
    // Own keys: causal, so keys 0..pos_hi (all q_len of them when not causal); a window drops keys below
    // pos_lo - window_left.
    kr.own_end = kCausal ? (pos_hi + kBlockN) / kBlockN : (seg.q_len + kBlockN - 1) / kBlockN;
    int own_lo = 0;
    if (kWindow) own_lo = max(0, pos_lo - window_left);
    kr.own_first = own_lo / kBlockN;
    // Context keys: all ctx_len of them, unless the window starts inside the context.
    kr.ctx_end = (seg.ctx_len + kBlockN - 1) / kBlockN;
    int ctx_lo = 0;
    if (kWindow) ctx_lo = seg.ctx_len + pos_lo - window_left;
    kr.ctx_first = ctx_lo <= 0 ? 0 : (ctx_lo >= seg.ctx_len ? kr.ctx_end : ctx_lo / kBlockN);
    return kr;
}

// Prefix trees (kTree): a segment row is (q_start, q_len, runs, pos) with pos the logical position of its first
// query (its ancestors' summed length, so the causal logic is unchanged) and runs the int2 index, from the table's
// start, of its context list: (n_runs, 0), then (k_start, k_len) of each ancestor run, root first
// (dualkv/cuda/tree_schedule.py). Each run is tiled into kBlockN-key blocks from its own start (a run's last block
// may be partial, masked like any partial block); context block j counts blocks run after run. Tree segments have no
// sliding window (context keys are fully visible), so a context block's logical position is never needed.
struct TreeBlock {
    int row, count;  // first packed key row, valid keys
};

__device__ __forceinline__ const int2* tree_runs(const int* segments, const Segment& seg) {
    return reinterpret_cast<const int2*>(segments) + seg.ctx_start;
}

__device__ __forceinline__ int tree_context_blocks(const int2* runs) {
    const int n_runs = runs[0].x;
    int n = 0;
    for (int r = 1; r <= n_runs; ++r) n += (runs[r].y + kBlockN - 1) / kBlockN;
    return n;
}

__device__ __forceinline__ TreeBlock tree_block(const int2* runs, int j) {
    const int n_runs = runs[0].x;
    for (int r = 1; r < n_runs; ++r) {  // the last run takes what is left
        const int nb = (runs[r].y + kBlockN - 1) / kBlockN;
        if (j < nb) return TreeBlock{runs[r].x + j * kBlockN, min(kBlockN, runs[r].y - j * kBlockN)};
        j -= nb;
    }
    return TreeBlock{runs[n_runs].x + j * kBlockN, min(kBlockN, runs[n_runs].y - j * kBlockN)};
}

// Where a CTA is in the schedule, and what it must visit.
struct QTile {
    Segment seg;
    int pos0, n_pos, head0, kv_head;
    KeyRange kr;
    int n_own, n_iter;
    int i_min, i_max;  // logical positions of the first and last valid query
    const int2* runs;  // kTree: the segment's context list
};

__device__ __forceinline__ QTile make_qtile(const int* segments, const int* tiles, int group_size,
                                            int window_left) {
    QTile t;
    const int2 tile = reinterpret_cast<const int2*>(tiles)[blockIdx.x];
    t.seg = load_segment(segments, tile.x);
    t.pos0 = tile.y * kPosPerTile;
    t.n_pos = min(kPosPerTile, t.seg.q_len - t.pos0);
    t.head0 = blockIdx.y * kPack;
    t.kv_head = t.head0 / group_size;
    t.kr = key_range(t.seg, t.pos0, t.pos0 + t.n_pos - 1, window_left);
    if (kTree) {
        t.runs = tree_runs(segments, t.seg);
        t.kr.ctx_first = 0;
        t.kr.ctx_end = tree_context_blocks(t.runs);
    }
    t.n_own = t.kr.own_end - t.kr.own_first;
    t.n_iter = t.n_own + (t.kr.ctx_end - t.kr.ctx_first);
    t.i_min = t.seg.ctx_len + t.pos0;
    t.i_max = t.seg.ctx_len + t.pos0 + t.n_pos - 1;
    return t;
}

// Where this thread sits in the CTA's MMA tiling: its warp's first row and output column, and the lane's
// fragment coordinates (g: accumulator row within a slab, t4: column pair, lrow/lmat: ldmatrix row and matrix).
struct QWarp {
    int dsplit, row0, col0, g, t4, lrow, lmat;
};

__device__ __forceinline__ QWarp qwarp() {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int dsplit = warp / kRowWarps;
    return QWarp{dsplit, (warp % kRowWarps) * 16 * kMSlabs, dsplit * kOutCols, lane / 4, lane % 4, lane % 8, lane / 8};
}

// Rows of the CTA's query tile from a (tokens, heads, head_dim) tensor (Q, dO) into smem; missing rows are zero.
template <bool kSwizzle = false>
__device__ __forceinline__ void load_query_rows(elem_t* dst, const elem_t* base, long long tok_st, long long head_st,
                                                const QTile& t) {
    const elem_t* tile0 = base + (t.seg.q_start + t.pos0) * tok_st + t.head0 * head_st;
    const int n_pos = t.n_pos;
    load_rows_async<kBlockM, kSwizzle>(dst, base, [=](int r) -> const elem_t* {
        const int p = r % kPosPerTile;
        return p < n_pos ? tile0 + p * tok_st + (r / kPosPerTile) * head_st : nullptr;
    });
}

// Block `it` of the visiting order (own blocks last-first, then context blocks last-first): its first key index
// within its region; is_own tells the region.
__device__ __forceinline__ int block_start(const QTile& t, int it, bool& is_own) {
    is_own = it < t.n_own;
    return (is_own ? t.kr.own_end - 1 - it : t.kr.ctx_end - 1 - (it - t.n_own)) * kBlockN;
}

__device__ __forceinline__ int block_count(const QTile& t, bool is_own, int k0) {
    if (kTree && !is_own) return tree_block(t.runs, k0 / kBlockN).count;
    return min(kBlockN, (is_own ? t.seg.q_len : t.seg.ctx_len) - k0);
}

// First packed key row of the block starting at key k0 of its region (own rows: of the own tensor; else of the
// context tensor).
__device__ __forceinline__ int block_row(const QTile& t, bool is_own, int k0) {
    if (is_own) return t.seg.q_start + k0;
    return kTree ? tree_block(t.runs, k0 / kBlockN).row : t.seg.ctx_start + k0;
}

// Logical position of the block's first key, for the causal mask. A tree's context blocks are numbered run after
// run, so k0 is not a position there; every context key precedes every query of the segment, and 0 keeps them all
// visible (key j < count <= the segment's first position).
__device__ __forceinline__ int block_key_base(const QTile& t, bool is_own, int k0) {
    if (is_own) return t.seg.ctx_len + k0;
    return kTree ? 0 : k0;
}

// Load block `it` of one key-side tensor pair (own rows from `own`, context rows from `ctx`) into dst.
// (load_key_block_at: the same, given the block's region, first key and count.)
template <bool kSwizzle = false>
__device__ __forceinline__ void load_key_block_at(elem_t* dst, const QTile& t, bool is_own, int k0, int count,
                                                  const elem_t* own, long long own_st, long long own_sh,
                                                  const elem_t* ctx, long long ctx_st, long long ctx_sh,
                                                  const elem_t* any_valid) {
    const long long row = block_row(t, is_own, k0);
    const elem_t* base = is_own ? own + row * own_st + t.kv_head * own_sh : ctx + row * ctx_st + t.kv_head * ctx_sh;
    const long long st = is_own ? own_st : ctx_st;
    load_strided_rows<kBlockN, kSwizzle>(dst, base, st, count, any_valid);
}
template <bool kSwizzle = false>
__device__ __forceinline__ void load_key_block(elem_t* dst, const QTile& t, int it, const elem_t* own,
                                               long long own_st, long long own_sh, const elem_t* ctx, long long ctx_st,
                                               long long ctx_sh, const elem_t* any_valid) {
    bool is_own;
    const int k0 = block_start(t, it, is_own);
    load_key_block_at<kSwizzle>(dst, t, is_own, k0, block_count(t, is_own, k0), own, own_st, own_sh, ctx, ctx_st,
                                ctx_sh, any_valid);
}

// Whether a key block needs per-element masking (partial block, causal diagonal, window boundary).
__device__ __forceinline__ bool block_needs_mask(const QTile& t, bool is_own, int count, int key_base,
                                                 int window_left) {
    return count < kBlockN || (kCausal && is_own && key_base + kBlockN - 1 > t.i_min) ||
           (kWindow && key_base < t.i_max - window_left);
}

// Logical position of accumulator row (slab sl, half hh) of this thread.
__device__ __forceinline__ int row_position(const QTile& t, int warp_row0, int sl, int g, int hh) {
    return t.seg.ctx_len + t.pos0 + (warp_row0 + sl * 16 + g + 8 * hh) % kPosPerTile;
}

__device__ __forceinline__ bool key_visible(int j, int count, int key, int i, int window_left) {
    return j < count && (!kCausal || key <= i) && (!kWindow || key >= i - window_left);
}

// ---- The dQ kernels' per-row backward math (rows = queries; accumulators in the m16n8 layout, kMSlabs slabs).

template <int kN8>
__device__ __forceinline__ void zero_rows(float (&acc)[kMSlabs][kN8][4]) {
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl) zero_acc(acc[sl]);
}

// LSE (log2 domain) and D = rowsum(dO * O) of the rows this thread holds (rows beyond the segment repeat the last
// valid row; their P is masked to 0).
__device__ __forceinline__ void load_row_stats(float (&row_lse)[kMSlabs][2], float (&row_delta)[kMSlabs][2],
                                               const float* lse2, const float* delta, long long lse_sh,
                                               const QTile& t, int warp_row0, int g) {
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = warp_row0 + sl * 16 + g + 8 * hh;
            const int p = r % kPosPerTile;
            const long long idx = (t.head0 + r / kPosPerTile) * lse_sh + t.seg.q_start + t.pos0 + min(p, t.n_pos - 1);
            row_lse[sl][hh] = lse2[idx];
            row_delta[sl][hh] = delta[idx];
        }
}

// P = exp2(S * scale_log2 - LSE) in place of S, masked like the forward.
__device__ __forceinline__ void probs_rows(float (&acc_s)[kMSlabs][kBlockN / 8][4], const float (&row_lse)[kMSlabs][2],
                                           const QTile& t, bool is_own, int count, int key_base, int window_left,
                                           int warp_row0, int g, int t4, float scale_log2) {
    const bool need_mask = block_needs_mask(t, is_own, count, key_base, window_left);
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int i = row_position(t, warp_row0, sl, g, hh);
#pragma unroll
            for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
                for (int e1 = 0; e1 < 2; ++e1) {
                    float& x = acc_s[sl][nt][2 * hh + e1];
                    const int j = nt * 8 + 2 * t4 + e1;
                    x = (need_mask && !key_visible(j, count, key_base + j, i, window_left))
                            ? 0.f : fast_exp2(fmaf(x, scale_log2, -row_lse[sl][hh]));
                }
        }
}

// dS = P * (dP - D) in place of dP.
__device__ __forceinline__ void dscores_rows(float (&acc_dp)[kMSlabs][kBlockN / 8][4],
                                             const float (&p)[kMSlabs][kBlockN / 8][4],
                                             const float (&row_delta)[kMSlabs][2]) {
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl)
#pragma unroll
        for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dp[sl][nt][e] = p[sl][nt][e] * (acc_dp[sl][nt][e] - row_delta[sl][e / 2]);
}

// Normalised rows (acc * row_scale) into the smem tile sT, then coalesced 16-byte stores of the valid rows to dst.
__device__ __forceinline__ void store_query_rows(elem_t* dst, long long tok_st, long long head_st, elem_t* sT,
                                                 const QTile& t, const float (&acc)[kMSlabs][kOutCols / 8][4],
                                                 const float (&row_scale)[kMSlabs][2], int warp_row0, int col0, int g,
                                                 int t4) {
    __syncthreads();  // every warp is done reading sT as an operand
#pragma unroll
    for (int sl = 0; sl < kMSlabs; ++sl)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = warp_row0 + sl * 16 + g + 8 * hh;
#pragma unroll
            for (int nt = 0; nt < kOutCols / 8; ++nt)
                *reinterpret_cast<unsigned*>(sT + r * kRowStride + col0 + nt * 8 + 2 * t4) =
                    pack2(acc[sl][nt][2 * hh] * row_scale[sl][hh], acc[sl][nt][2 * hh + 1] * row_scale[sl][hh]);
        }
    __syncthreads();
    for (int idx = threadIdx.x; idx < kBlockM * kChunksPerRow; idx += kThreads) {
        const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
        const int p = r % kPosPerTile;
        if (p >= t.n_pos) continue;
        elem_t* out = dst + (t.seg.q_start + t.pos0 + p) * tok_st + (t.head0 + r / kPosPerTile) * head_st + c * 8;
        *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(sT + r * kRowStride + c * 8);
    }
}

}  // namespace dkv
