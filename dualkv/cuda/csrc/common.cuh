// Shared device helpers for the dualkv kernels: element types, PTX wrappers (cp.async, ldmatrix, mma.sync
// m16n8k16), warp reductions, and the shared-prompt tile geometry.
//
// Compile-time configuration arrives as macros from dualkv/cuda/configs.py (one table feeds the kernels and the
// numba mirror of their schedule): DKV_HEAD_DIM (multiple of 32), DKV_WARPS, DKV_BF16 (1 bf16, 0 fp16),
// DKV_WINDOW (1: causal sliding window), DKV_CAUSAL (1, the default: a segment's own keys causal; 0: all visible),
// plus per-kernel tile macros (see qtile.cuh and bwd_dkdv.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef DKV_HEAD_DIM
#error "DKV_HEAD_DIM must be defined by the launcher"
#endif
#ifndef DKV_CAUSAL
#define DKV_CAUSAL 1
#endif
// DKV_ROWS_TID_AGAIN (1: set by bwd_dkdv.cu's ordered dQ builds): load_strided_rows reads the thread index anew, so
// that its per-thread row and column offsets are not held (or spilled) across the caller's main loop (NVRTC 13.0, d =
// 128 sm_90 causal shared-first ordered build: 60 / 104 bytes of spill stores / loads against 92 / 136; its dK/dV
// kernel 238.4-238.9 against 240.5 ms at (16, 32K) on an H200, experiments/results/checks/s28variants-h200-20261129T1051Z.log).
// Only those builds take it: at 255 registers ptxas's allocation of the other mma.sync kernels moved with any
// respelling of these lines (a tree that respelled them for every kernel, in the same log: NVRTC 13.0 spilled the d =
// 128 forward 104 / 120 bytes against 8 / 8, and the kernels other than dK/dV, the forward mostly, took ~10 ms more at
// (16, 32K)).
#ifndef DKV_ROWS_TID_AGAIN
#define DKV_ROWS_TID_AGAIN 0
#endif
// DKV_LDSM_ADDR32 (bwd_dkdv.cu's builds with DKV_DKDV_ADDR32 = 1 or 2; 0 elsewhere): 1, the MMA helpers below form
// one 32-bit shared address per operand and add compile-time byte offsets to it for each ldmatrix; 2, the same, with
// the lane's ldmatrix row and matrix read anew (lane_coords_again) in each helper, so that those addresses are not hoisted
// out of the caller's loop (and held, or spilled). From the pointer form NVRTC 12.9 and 13.0 emit a 64-bit add and a
// truncation per ldmatrix, which ptxas does not fold into [R+imm] addressing; NVRTC 13.5 does it in 32 bits. Ordered
// dK/dV build, d = 128 causal shared-first, main loop SASS instructions (320 MMAs) and spill bytes, NVRTC 13.0 / 13.5:
//   sm_90: pointer 1504, 60 / 104 | 1285, 20 / 28;  1: 1319, 36 / 56 | 1267, 0;  2: 1315, 4 / 4 | 1361, 108 / 148
//   sm_80: pointer 1696, 0 | 1472, 0;  1: 1540, 104 / 148 | 1445, 0;  2: 1514, 0 | 1475, 0
// (12.9 as 13.0; experiments/results/checks/s29addr32-cpu-20261129.log). H200, NVRTC 13.0, dK/dV kernel at (16, 32K):
// pointer 239.3 ms, 1: 231.2, 2: 226.4 (checks/s30addr32-h200-20261129T1839Z.json). The forward keeps the pointer
// form: under 13.0 its d = 128 sm_90 build spills 8 / 8 bytes with it and 152 / 168 with either other.
#ifndef DKV_LDSM_ADDR32
#define DKV_LDSM_ADDR32 0
#endif
#if DKV_LDSM_ADDR32 < 0 || DKV_LDSM_ADDR32 > 2
#error "DKV_LDSM_ADDR32 (DKV_DKDV_ADDR32) must be 0, 1 or 2"
#endif

namespace dkv {

#define kInf __int_as_float(0x7f800000)

constexpr int kHeadDim = DKV_HEAD_DIM;
constexpr int kWarps = DKV_WARPS;
constexpr int kThreads = kWarps * 32;
constexpr bool kWindow = DKV_WINDOW != 0;
constexpr bool kCausal = DKV_CAUSAL != 0;  // the mask/range helpers of qtile.cuh and keywalk.cuh read it
static_assert(kCausal || !kWindow, "sliding windows are built for causal kernels only");
#ifndef DKV_HEAD_DIM_ACC
#define DKV_HEAD_DIM_ACC DKV_HEAD_DIM
#endif
// Columns of the shared-memory tiles and of the output accumulators: kHeadDim, except in the wgmma kernels at head
// dim 96, which round it up to two 64-column swizzle atoms (128; sm90.cuh says why columns 96..127 never reach an
// output). Global rows always have kHeadDim columns.
constexpr int kHeadDimAcc = DKV_HEAD_DIM_ACC;
// Shared-memory rows are padded by 16 bytes so that ldmatrix's 8 row addresses hit 8 different bank groups.
constexpr int kRowStride = kHeadDimAcc + 8;              // elements
constexpr int kChunksPerRow = kHeadDim / 8;              // 16-byte chunks per global row

static_assert(kHeadDim % 32 == 0, "head dim must be a multiple of 32");
static_assert(kHeadDimAcc >= kHeadDim && kHeadDimAcc % 32 == 0, "tile columns: the head dim, rounded up");

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
constexpr unsigned kElemBytes = sizeof(elem_t);

__device__ __forceinline__ unsigned pack2(float a, float b) {
    elem2_t v = float2_to_elem2(a, b);
    return *reinterpret_cast<unsigned*>(&v);
}

#if DKV_ROWS_TID_AGAIN
// threadIdx.x read anew (a volatile read the compiler cannot merge with an earlier one).
__device__ __forceinline__ int thread_index_again() {
    int tid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    return tid;
}
#endif

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// A shared-memory address of a T as a 32-bit byte address (bwd_dkdv.cu's DKV_DKDV_SMEM32): the kernel converts its
// smem base once and adds 32-bit offsets, so that NVRTC 12.8-13.0, whose shared pointers are 64-bit (13.1 on: 32-bit),
// form none of its main loop's shared addresses in 64 bits. The MMA helpers below, store_frag_rows, load_strided_rows
// and keywalk.cuh's load_walk_step take one in place of a pointer (stores and copies then go through asm).
template <typename T>
struct SmemPtr32 {
    unsigned addr;
    __device__ __forceinline__ SmemPtr32 operator+(int n) const {
        return SmemPtr32{addr + static_cast<unsigned>(n) * static_cast<unsigned>(sizeof(T))};
    }
    struct Ref {  // p[i] = v (a float) as st.shared
        unsigned addr;
        __device__ __forceinline__ void operator=(float v) const {
            asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v));
        }
    };
    __device__ __forceinline__ Ref operator[](int i) const { return Ref{(*this + i).addr}; }
};
template <typename T>
__device__ __forceinline__ unsigned smem_addr(SmemPtr32<T> p) { return p.addr; }
// A 32-bit store to a SmemPtr32.
template <typename T>
__device__ __forceinline__ void st_u32(SmemPtr32<T> p, unsigned v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(p.addr), "r"(v));
}

// 16-byte global -> shared copy; bytes beyond src_bytes (0 or 16) are zero-filled.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
                 "r"(src_bytes));
}
// 4-byte global -> shared copy (through L1: cp.async.cg takes 16 bytes only).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}
template <typename T>
__device__ __forceinline__ void cp_async_16(SmemPtr32<T> smem, const void* gmem, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem.addr), "l"(gmem), "r"(src_bytes));
}
template <typename T>
__device__ __forceinline__ void cp_async_4(SmemPtr32<T> smem, const void* gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem.addr), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// DKV_LDSM_ADDR32 == 2: the lane's ldmatrix row and matrix from the lane index read anew (a volatile read the
// compiler cannot hoist), so that the addresses formed from them are not held across the caller's loop.
__device__ __forceinline__ void lane_coords_again(int& lrow, int& lmat) {
    if (DKV_LDSM_ADDR32 == 2) {
        int lane;
        asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
        lrow = lane % 8;
        lmat = lane / 8;
    }
}
// ldmatrix from a 32-bit shared address (the MMA helpers' DKV_LDSM_ADDR32 form), or from a generic pointer into smem.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) { ldmatrix_x4(r, smem_addr(smem)); }
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* smem) {
    ldmatrix_x4_trans(r, smem_addr(smem));
}
template <typename T>
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], SmemPtr32<T> p) { ldmatrix_x4(r, p.addr); }
template <typename T>
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], SmemPtr32<T> p) { ldmatrix_x4_trans(r, p.addr); }

// D = A * B + D for one m16n8k16 tile; A: 4 regs (row-major 16x16), B: 2 regs (16x8, k-major), D: 4 floats.
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." DKV_MMA_TYPE "." DKV_MMA_TYPE
                 ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x with the MUFU unit (flushes denormals, like --use_fast_math's exp2f); exp2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
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

// Byte offset of 16-byte chunk c of row r in a kRows-row tile in the wgmma 128-byte-swizzle K-major layout: the
// head dim is cut into 64-element atoms stored one after another (kRows rows of 128 bytes each), and chunk c % 8
// of row r sits at (c % 8) ^ (r % 8). The tile must start 1024-byte aligned.
template <int kRows>
__device__ __forceinline__ int swizzled_offset(int r, int c) {
    return (c / 8) * kRows * 128 + r * 128 + (((c % 8) ^ (r % 8)) << 4);
}

// Copy kRows rows of HEAD_DIM elements into a smem tile: padded rows (kRowStride, for ldmatrix) or, with kSwizzle,
// the wgmma layout above. row_ptr(r) returns the row's global address, or nullptr for a row that does not exist
// (zero-filled).
template <int kRows, bool kSwizzle = false, typename RowPtr>
__device__ __forceinline__ void load_rows_async(elem_t* smem, const elem_t* any_valid, RowPtr row_ptr) {
    for (int idx = threadIdx.x; idx < kRows * kChunksPerRow; idx += kThreads) {
        const int r = idx / kChunksPerRow;
        const int c = idx % kChunksPerRow;
        const elem_t* row = row_ptr(r);
        void* dst = kSwizzle ? static_cast<void*>(reinterpret_cast<unsigned char*>(smem) + swizzled_offset<kRows>(r, c))
                             : static_cast<void*>(smem + r * kRowStride + c * 8);
        cp_async_16(dst, row ? row + c * 8 : any_valid, row != nullptr);
    }
}

// The same for rows first + r * row_stride, r < count (the rest zero-filled). Where the threads tile the rows
// evenly, each thread keeps one chunk column and, rows advancing by a multiple of 8, one swizzle phase: a fully
// unrolled loop with one 64-bit add per row (this runs every key block, so its instruction count matters). Swizzled
// tiles wider than the head dim (kHeadDimAcc = 128 at head dim 96) are tiled by their kHeadDimAcc / 8 chunk columns,
// and the threads of the columns past the head dim load nothing.
template <int kRows, bool kSwizzle = false>
__device__ __forceinline__ void load_strided_rows(elem_t* smem, const elem_t* first, long long row_stride, int count,
                                                  const elem_t* any_valid) {
    constexpr int kSlots = kSwizzle ? kHeadDimAcc / 8 : kChunksPerRow;  // chunk columns the threads tile
    constexpr int kRowsPerPass = kThreads / kSlots;
    if constexpr (kThreads % kSlots == 0 && kRows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0) {
#if DKV_ROWS_TID_AGAIN
        const int tid = thread_index_again();
        const int r0 = tid / kSlots, c = tid % kSlots;
#else
        const int r0 = threadIdx.x / kSlots, c = threadIdx.x % kSlots;
#endif
        if constexpr (kSlots != kChunksPerRow) {
            if (c >= kChunksPerRow) return;
        }
        unsigned char* dst = reinterpret_cast<unsigned char*>(smem) +
                             (kSwizzle ? swizzled_offset<kRows>(r0, c) : (r0 * kRowStride + c * 8) * 2);
        constexpr int kDstStep = kSwizzle ? kRowsPerPass * 128 : kRowsPerPass * kRowStride * 2;
        const elem_t* src = first + r0 * row_stride + c * 8;
        const long long step = kRowsPerPass * row_stride;
#pragma unroll
        for (int i = 0; i < kRows / kRowsPerPass; ++i) {
            const bool ok = r0 + i * kRowsPerPass < count;
            cp_async_16(dst + i * kDstStep, ok ? src : any_valid, ok);
            src += step;
        }
    } else {
        load_rows_async<kRows, kSwizzle>(smem, any_valid, [=](int r) -> const elem_t* {
            return r < count ? first + r * row_stride : nullptr;
        });
    }
}

// load_strided_rows into a tile given by its 32-bit shared address (bwd_dkdv.cu's DKV_DKDV_SMEM32 & 2): the same
// copies, each destination formed in 32 bits. (An overload, not one template over the tile type: that template changed
// the SASS of the forward and dQ kernels' builds under NVRTC 13.0 and 13.5, nvdisasm hashes, s39.)
template <int kRows, bool kSwizzle = false>
__device__ __forceinline__ void load_strided_rows(SmemPtr32<elem_t> smem, const elem_t* first, long long row_stride,
                                                  int count, const elem_t* any_valid) {
    constexpr int kSlots = kSwizzle ? kHeadDimAcc / 8 : kChunksPerRow;  // (as load_strided_rows above)
    constexpr int kRowsPerPass = kThreads / kSlots;
    if constexpr (kThreads % kSlots == 0 && kRows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0) {
#if DKV_ROWS_TID_AGAIN
        const int tid = thread_index_again();
        const int r0 = tid / kSlots, c = tid % kSlots;
#else
        const int r0 = threadIdx.x / kSlots, c = threadIdx.x % kSlots;
#endif
        if constexpr (kSlots != kChunksPerRow) {
            if (c >= kChunksPerRow) return;
        }
        const SmemPtr32<unsigned char> dst{
            smem.addr + static_cast<unsigned>(kSwizzle ? swizzled_offset<kRows>(r0, c) : (r0 * kRowStride + c * 8) * 2)};
        constexpr int kDstStep = kSwizzle ? kRowsPerPass * 128 : kRowsPerPass * kRowStride * 2;
        const elem_t* src = first + r0 * row_stride + c * 8;
        const long long step = kRowsPerPass * row_stride;
#pragma unroll
        for (int i = 0; i < kRows / kRowsPerPass; ++i) {
            const bool ok = r0 + i * kRowsPerPass < count;
            cp_async_16(dst + i * kDstStep, ok ? src : any_valid, ok);
            src += step;
        }
    } else {  // (load_rows_async's loop)
        for (int idx = threadIdx.x; idx < kRows * kChunksPerRow; idx += kThreads) {
            const int r = idx / kChunksPerRow;
            const int c = idx % kChunksPerRow;
            const bool ok = r < count;
            const SmemPtr32<unsigned char> dst{
                smem.addr + static_cast<unsigned>(kSwizzle ? swizzled_offset<kRows>(r, c) : (r * kRowStride + c * 8) * 2)};
            cp_async_16(dst, ok ? first + r * row_stride + c * 8 : any_valid, ok);
        }
    }
}

template <int kN8>
__device__ __forceinline__ void zero_acc(float (&acc)[kN8][4]) {
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
}

// A warp's accumulator slab (16 rows from row0, 8 kN8 columns from col0, m16n8 layout), times scale, as 16-bit
// values into a padded (kRowStride) smem tile.
template <int kN8>
__device__ __forceinline__ void stage_acc_rows(elem_t* tile, const float (&acc)[kN8][4], int row0, int col0,
                                               int g, int t4, float scale) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = row0 + g + 8 * hh;
#pragma unroll
        for (int nt = 0; nt < kN8; ++nt)
            *reinterpret_cast<unsigned*>(tile + r * kRowStride + col0 + nt * 8 + 2 * t4) =
                pack2(acc[nt][2 * hh] * scale, acc[nt][2 * hh + 1] * scale);
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


// ---- Warp-level GEMMs on padded smem tiles (rows of kRowStride elements), MS 16-row slabs per warp.

// acc[MS][N/8] (16*MS rows x N cols) = A (smem rows a_row0..) x B^T (smem rows 0..N-1), over HEAD_DIM.
template <int MS, int N, typename PA, typename PB>
__device__ __forceinline__ void gemm_rows_rows(float (&acc)[MS][N / 8][4], PA sA, PB sB, int a_row0, int lrow,
                                               int lmat) {
#pragma unroll
    for (int sl = 0; sl < MS; ++sl)
#pragma unroll
        for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[sl][nt][e] = 0.f;
#if DKV_LDSM_ADDR32
    lane_coords_again(lrow, lmat);
    const unsigned a0 = smem_addr(sA + (a_row0 + (lmat % 2) * 8 + lrow) * kRowStride + (lmat / 2) * 8);
    const unsigned b0 = smem_addr(sB + ((lmat / 2) * 8 + lrow) * kRowStride + (lmat % 2) * 8);
#endif
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        unsigned a[MS][4];
#pragma unroll
        for (int sl = 0; sl < MS; ++sl)
#if DKV_LDSM_ADDR32
            ldmatrix_x4(a[sl], a0 + (sl * 16 * kRowStride + kk * 16) * kElemBytes);
#else
            ldmatrix_x4(a[sl], sA + (a_row0 + sl * 16 + (lmat % 2) * 8 + lrow) * kRowStride + kk * 16 + (lmat / 2) * 8);
#endif
#pragma unroll
        for (int np = 0; np < N / 16; ++np) {
            unsigned b[4];
#if DKV_LDSM_ADDR32
            ldmatrix_x4(b, b0 + (np * 16 * kRowStride + kk * 16) * kElemBytes);
#else
            ldmatrix_x4(b, sB + (np * 16 + (lmat / 2) * 8 + lrow) * kRowStride + kk * 16 + (lmat % 2) * 8);
#endif
#pragma unroll
            for (int sl = 0; sl < MS; ++sl) {
                mma_16816(acc[sl][2 * np], a[sl], b[0], b[1]);
                mma_16816(acc[sl][2 * np + 1], a[sl], b[2], b[3]);
            }
        }
    }
}

// acc[MS][COLS/8] += frag (16*MS rows x K, A layout) x B (smem rows 0..K-1, columns col0..col0+COLS-1).
template <int MS, int K, int COLS, typename PB>
__device__ __forceinline__ void gemm_frag_rows(float (&acc)[MS][COLS / 8][4], const unsigned (&frag)[MS][K / 16][4],
                                               PB sB, int col0, int lrow, int lmat) {
#if DKV_LDSM_ADDR32
    lane_coords_again(lrow, lmat);
    const unsigned b0 = smem_addr(sB + ((lmat % 2) * 8 + lrow) * kRowStride + col0 + (lmat / 2) * 8);
#endif
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < COLS / 16; ++np) {
            unsigned b[4];
#if DKV_LDSM_ADDR32
            ldmatrix_x4_trans(b, b0 + (kk * 16 * kRowStride + np * 16) * kElemBytes);
#else
            ldmatrix_x4_trans(b, sB + (kk * 16 + (lmat % 2) * 8 + lrow) * kRowStride + col0 + np * 16 + (lmat / 2) * 8);
#endif
#pragma unroll
            for (int sl = 0; sl < MS; ++sl) {
                mma_16816(acc[sl][2 * np], frag[sl][kk], b[0], b[1]);
                mma_16816(acc[sl][2 * np + 1], frag[sl][kk], b[2], b[3]);
            }
        }
    }
}

// acc[MS][COLS/8] += A (smem rows a_row0.., K columns, row stride a_stride) x B (smem rows 0..K-1 of kRowStride,
// columns col0..col0+COLS-1): a product whose A operand another warp wrote (bwd_dkdv.cu's P^T and dS^T).
template <int MS, int K, int COLS, typename PA, typename PB>
__device__ __forceinline__ void gemm_smem_rows(float (&acc)[MS][COLS / 8][4], PA sA, int a_stride, int a_row0, PB sB,
                                               int col0, int lrow, int lmat) {
#if DKV_LDSM_ADDR32
    lane_coords_again(lrow, lmat);
    const unsigned a0 = smem_addr(sA + (a_row0 + (lmat % 2) * 8 + lrow) * a_stride + (lmat / 2) * 8);
    const unsigned b0 = smem_addr(sB + ((lmat % 2) * 8 + lrow) * kRowStride + col0 + (lmat / 2) * 8);
#endif
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
        unsigned a[MS][4];
#pragma unroll
        for (int sl = 0; sl < MS; ++sl)
#if DKV_LDSM_ADDR32
            ldmatrix_x4(a[sl], a0 + (sl * 16 * a_stride + kk * 16) * kElemBytes);
#else
            ldmatrix_x4(a[sl], sA + (a_row0 + sl * 16 + (lmat % 2) * 8 + lrow) * a_stride + kk * 16 + (lmat / 2) * 8);
#endif
#pragma unroll
        for (int np = 0; np < COLS / 16; ++np) {
            unsigned b[4];
#if DKV_LDSM_ADDR32
            ldmatrix_x4_trans(b, b0 + (kk * 16 * kRowStride + np * 16) * kElemBytes);
#else
            ldmatrix_x4_trans(b, sB + (kk * 16 + (lmat % 2) * 8 + lrow) * kRowStride + col0 + np * 16 + (lmat / 2) * 8);
#endif
#pragma unroll
            for (int sl = 0; sl < MS; ++sl) {
                mma_16816(acc[sl][2 * np], a[sl], b[0], b[1]);
                mma_16816(acc[sl][2 * np + 1], a[sl], b[2], b[3]);
            }
        }
    }
}

// ---- The same two products with the B operand in a swizzled tile (bwd_dkdv.cu's DKV_QDO_SWIZZLE: its Q and dO
// tiles): kRowsB rows x HEAD_DIM in swizzled_offset<kRowsB>'s layout (64-column atoms of kRowsB rows of 128 bytes;
// chunk c % 8 of row r at (c % 8) ^ (r % 8)), so that a cp.async copy of 128 contiguous global bytes fills one
// 128-byte smem line (with padded rows 7 in 8 rows straddle two: ncu counted 2.6x the ideal shared wavefronts and 1.5x
// the ideal L2 sectors on those copies, checks/s31ncu-*). The tile must start 128-byte aligned. A lane's rows advance
// by multiples of 8 from a row that is lrow mod 8, so its swizzle phase is lrow; the chunk's bits above the ones the
// loop varies are its own, and XOR with a compile-time constant moves between chunks (one LOP3 per address).

// acc[MS][N/8] (16*MS rows x N cols) = A (padded smem rows a_row0..) x B^T (swizzled rows b_row0.., b_row0 % 8 == 0).
template <int MS, int N, int kRowsB, typename PA, typename PB>
__device__ __forceinline__ void gemm_rows_swz(float (&acc)[MS][N / 8][4], PA sA, PB sB, int b_row0, int a_row0,
                                              int lrow, int lmat) {
    static_assert(kHeadDim % 64 == 0, "swizzled tiles: whole 64-column atoms");
#pragma unroll
    for (int sl = 0; sl < MS; ++sl)
#pragma unroll
        for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[sl][nt][e] = 0.f;
#if DKV_LDSM_ADDR32
    lane_coords_again(lrow, lmat);
    const unsigned a0 = smem_addr(sA + (a_row0 + (lmat % 2) * 8 + lrow) * kRowStride + (lmat / 2) * 8);
#endif
    // B: row b_row0 + 16 np + 8 (lmat / 2) + lrow, chunk 2 kk + lmat % 2
    const unsigned b0 = smem_addr(sB) + (b_row0 + (lmat / 2) * 8 + lrow) * 128 + (((lmat % 2) ^ lrow) << 4);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        unsigned a[MS][4];
#pragma unroll
        for (int sl = 0; sl < MS; ++sl)
#if DKV_LDSM_ADDR32
            ldmatrix_x4(a[sl], a0 + (sl * 16 * kRowStride + kk * 16) * kElemBytes);
#else
            ldmatrix_x4(a[sl], sA + (a_row0 + sl * 16 + (lmat % 2) * 8 + lrow) * kRowStride + kk * 16 + (lmat / 2) * 8);
#endif
        const unsigned bk = (b0 ^ ((kk % 4) * 32)) + (kk / 4) * kRowsB * 128;
#pragma unroll
        for (int np = 0; np < N / 16; ++np) {
            unsigned b[4];
            ldmatrix_x4(b, bk + np * 16 * 128);
#pragma unroll
            for (int sl = 0; sl < MS; ++sl) {
                mma_16816(acc[sl][2 * np], a[sl], b[0], b[1]);
                mma_16816(acc[sl][2 * np + 1], a[sl], b[2], b[3]);
            }
        }
    }
}

// acc[MS][COLS/8] += A (padded smem rows a_row0.., K columns, row stride a_stride) x B (swizzled rows 0..K-1, columns
// col0..col0+COLS-1; col0 a multiple of COLS).
template <int MS, int K, int COLS, int kRowsB, typename PA, typename PB>
__device__ __forceinline__ void gemm_smem_swz(float (&acc)[MS][COLS / 8][4], PA sA, int a_stride, int a_row0, PB sB,
                                              int col0, int lrow, int lmat) {
    static_assert(kHeadDim % 64 == 0 && (COLS & (COLS - 1)) == 0 && COLS >= 16 && COLS <= 64,
                  "swizzled tiles: whole atoms, and a warp's chunk bits below its columns' own");
#if DKV_LDSM_ADDR32
    lane_coords_again(lrow, lmat);
    const unsigned a0 = smem_addr(sA + (a_row0 + (lmat % 2) * 8 + lrow) * a_stride + (lmat / 2) * 8);
#endif
    // B: row 16 kk + 8 (lmat % 2) + lrow, chunk c0 + 2 np with c0 = col0 / 8 + lmat / 2 (2 np < COLS / 8 sets bits
    // that c0 % 8 leaves clear, and never carries into the atom)
    const int c0 = col0 / 8 + lmat / 2;
    const unsigned b0 = smem_addr(sB) + (c0 / 8) * kRowsB * 128 + ((lmat % 2) * 8 + lrow) * 128 +
                        (((c0 % 8) ^ lrow) << 4);
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
        unsigned a[MS][4];
#pragma unroll
        for (int sl = 0; sl < MS; ++sl)
#if DKV_LDSM_ADDR32
            ldmatrix_x4(a[sl], a0 + (sl * 16 * a_stride + kk * 16) * kElemBytes);
#else
            ldmatrix_x4(a[sl], sA + (a_row0 + sl * 16 + (lmat % 2) * 8 + lrow) * a_stride + kk * 16 + (lmat / 2) * 8);
#endif
#pragma unroll
        for (int np = 0; np < COLS / 16; ++np) {
            unsigned b[4];
            ldmatrix_x4_trans(b, (b0 ^ (np * 32)) + kk * 16 * 128);
#pragma unroll
            for (int sl = 0; sl < MS; ++sl) {
                mma_16816(acc[sl][2 * np], a[sl], b[0], b[1]);
                mma_16816(acc[sl][2 * np + 1], a[sl], b[2], b[3]);
            }
        }
    }
}

// A warp's C fragments (MS 16-row slabs x N columns, m16n8 layout) as 16-bit values into a smem tile of row stride
// `stride` at rows row0.., columns col0...
template <int MS, int N>
__device__ __forceinline__ void store_frag_rows(elem_t* tile, int stride, const float (&acc)[MS][N / 8][4], int row0,
                                                int col0, int g, int t4) {
#pragma unroll
    for (int sl = 0; sl < MS; ++sl)
#pragma unroll
        for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                *reinterpret_cast<unsigned*>(tile + (row0 + sl * 16 + g + 8 * hh) * stride + col0 + nt * 8 + 2 * t4) =
                    pack2(acc[sl][nt][2 * hh], acc[sl][nt][2 * hh + 1]);
}
template <int MS, int N>
__device__ __forceinline__ void store_frag_rows(SmemPtr32<elem_t> tile, int stride, const float (&acc)[MS][N / 8][4],
                                                int row0, int col0, int g, int t4) {
#pragma unroll
    for (int sl = 0; sl < MS; ++sl)
#pragma unroll
        for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                st_u32(tile + (row0 + sl * 16 + g + 8 * hh) * stride + col0 + nt * 8 + 2 * t4,
                       pack2(acc[sl][nt][2 * hh], acc[sl][nt][2 * hh + 1]));
}

// C fragments (fp32, N columns) -> A fragments (16-bit, k = N) for the next product.
template <int MS, int N>
__device__ __forceinline__ void to_a_frag(unsigned (&frag)[MS][N / 16][4], const float (&acc)[MS][N / 8][4]) {
#pragma unroll
    for (int sl = 0; sl < MS; ++sl)
#pragma unroll
        for (int kk = 0; kk < N / 16; ++kk) {
            frag[sl][kk][0] = pack2(acc[sl][2 * kk][0], acc[sl][2 * kk][1]);
            frag[sl][kk][1] = pack2(acc[sl][2 * kk][2], acc[sl][2 * kk][3]);
            frag[sl][kk][2] = pack2(acc[sl][2 * kk + 1][0], acc[sl][2 * kk + 1][1]);
            frag[sl][kk][3] = pack2(acc[sl][2 * kk + 1][2], acc[sl][2 * kk + 1][3]);
        }
}

}  // namespace dkv
