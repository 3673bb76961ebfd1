// Shared device helpers for the dualkv kernels: element types, PTX wrappers (cp.async, ldmatrix, mma.sync
// m16n8k16), warp reductions, and the shared-prompt tile geometry.
//
// Compile-time configuration arrives as macros from dualkv/cuda/configs.py (one table feeds the kernels and the
// numba mirror of their schedule):
//   DKV_HEAD_DIM   head dimension (multiple of 32)
//   DKV_BLOCK_N    keys per tile
//   DKV_WARPS      warps per CTA
//   DKV_MSLABS     16-row MMA slabs per warp (rows per warp = 16 * DKV_MSLABS)
//   DKV_DSPLIT     warps that share one row slab, each owning HEAD_DIM / DKV_DSPLIT output columns
//   DKV_PACK       query heads packed into one CTA's row tile (GQA: they share the K/V head)
//   DKV_BF16       1 for bfloat16, 0 for float16
//   DKV_WINDOW     1 when a causal sliding window is applied
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef DKV_HEAD_DIM
#error "DKV_HEAD_DIM must be defined by the launcher"
#endif

namespace dkv {

#define kInf __int_as_float(0x7f800000)

constexpr int kHeadDim = DKV_HEAD_DIM;
constexpr int kBlockN = DKV_BLOCK_N;
constexpr int kWarps = DKV_WARPS;
constexpr int kThreads = kWarps * 32;
constexpr int kMSlabs = DKV_MSLABS;
constexpr int kDSplit = DKV_DSPLIT;
constexpr int kRowWarps = kWarps / kDSplit;              // warps along the row dimension
constexpr int kBlockM = kRowWarps * 16 * kMSlabs;        // query rows per CTA tile (positions x packed heads)
constexpr int kPack = DKV_PACK;
constexpr int kPosPerTile = kBlockM / kPack;             // query positions per CTA tile
constexpr int kOutCols = kHeadDim / kDSplit;             // output columns per warp
constexpr bool kWindow = DKV_WINDOW != 0;
// Shared-memory rows are padded by 16 bytes so that ldmatrix's 8 row addresses hit 8 different bank groups.
constexpr int kRowStride = kHeadDim + 8;                 // elements
constexpr int kChunksPerRow = kHeadDim / 8;              // 16-byte chunks per row

static_assert(kHeadDim % 32 == 0, "head dim must be a multiple of 32");
static_assert(kBlockN % 16 == 0, "block_n must be a multiple of 16");
static_assert(kWarps % kDSplit == 0, "warps must divide into d-split groups");
static_assert(kOutCols % 16 == 0, "each warp's output columns must be a multiple of 16");
static_assert(kBlockM % kPack == 0, "packed heads must divide the row tile");

#if DKV_BF16
typedef __nv_bfloat16 elem_t;
typedef __nv_bfloat162 elem2_t;
__device__ __forceinline__ elem2_t float2_to_elem2(float a, float b) { return __floats2bfloat162_rn(a, b); }
#define DKV_MMA_TYPE "bf16"
#else
typedef __half elem_t;
typedef __half2 elem2_t;
__device__ __forceinline__ elem2_t float2_to_elem2(float a, float b) { return __floats2half2_rn(a, b); }
#define DKV_MMA_TYPE "f16"
#endif

__device__ __forceinline__ unsigned pack2(float a, float b) {
    elem2_t v = float2_to_elem2(a, b);
    return *reinterpret_cast<unsigned*>(&v);
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; bytes beyond src_bytes (0 or 16) are zero-filled.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(smem)));
}

// D = A * B + D for one m16n8k16 tile; A: 4 regs (row-major 16x16), B: 2 regs (16x8, k-major), D: 4 floats.
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." DKV_MMA_TYPE "." DKV_MMA_TYPE
                 ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Reductions over the 4 lanes that hold one accumulator row (lanes 4g .. 4g+3).
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffff, x, 1);
    return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// Copy kRows rows of HEAD_DIM elements into a padded smem tile. row_ptr(r) returns the row's global address, or
// nullptr for a row that does not exist (zero-filled).
template <int kRows, typename RowPtr>
__device__ __forceinline__ void load_rows_async(elem_t* smem, const elem_t* any_valid, RowPtr row_ptr) {
    for (int idx = threadIdx.x; idx < kRows * kChunksPerRow; idx += kThreads) {
        const int r = idx / kChunksPerRow;
        const int c = idx % kChunksPerRow;
        const elem_t* row = row_ptr(r);
        cp_async_16(smem + r * kRowStride + c * 8, row ? row + c * 8 : any_valid, row != nullptr);
    }
}

// One row of the shared-prompt segment table: queries [q_start, q_start + q_len) attend to context keys
// [ctx_start, ctx_start + ctx_len) (all visible; logical positions 0..ctx_len-1) and causally to their own keys
// (logical positions ctx_len + j).
struct Segment {
    int q_start, q_len, ctx_start, ctx_len;
};

__device__ __forceinline__ Segment load_segment(const int* table, int s) {
    const int4 v = reinterpret_cast<const int4*>(table)[s];
    return Segment{v.x, v.y, v.z, v.w};
}

// Key blocks a query tile of positions [pos_lo, pos_hi] (inclusive, logical = ctx_len + pos) must visit, per
// region. Blocks are counted from the start of each region; [first, end) in block units.
struct KeyRange {
    int own_first, own_end, ctx_first, ctx_end;
};

__device__ __forceinline__ KeyRange key_range(const Segment& seg, int pos_lo, int pos_hi, int window_left) {
    KeyRange kr;
    // Own keys: causal, so keys 0..pos_hi; a window drops keys below pos_lo - window_left.
    kr.own_end = (pos_hi + kBlockN) / kBlockN;
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

}  // namespace dkv
