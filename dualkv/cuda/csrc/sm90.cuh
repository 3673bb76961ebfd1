// Hopper (sm_90a) helpers of the wgmma kernels: shared-memory matrix descriptors of the 128-byte-swizzle tiles
// (common.cuh: swizzled_offset), the proxy fence, and register fences around in-flight wgmma operands.
#pragma once

#include "wgmma.cuh"

namespace dkv {

// wgmma's swizzle pattern is anchored to 1024-byte boundaries: the first such boundary at or after p (kernels
// allocate 1 KB of slack).
__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
    return p + ((1024 - (smem_addr(p) & 1023)) & 1023);
}

// Shared-memory matrix descriptor, 128-byte swizzle (layout type 1 in bits 62-63); offsets in bytes.
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr, unsigned leading, unsigned stride) {
    return (unsigned long long)((addr >> 4) & 0x3FFF) | ((unsigned long long)((leading >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)((stride >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// Head dim 96 (DKV_HEAD_DIM_ACC = 128): every tile has two 64-column atoms, laid out exactly as at head dim 128;
// the loads write global columns 0..95 (chunks c < 12 of swizzled_offset) and never columns 96..127. The products
// that contract over the head dim (S = Q K^T, dP = dO V^T) take kHeadDim / 16 = 6 k-steps, whose descriptors are
// head dim 128's first six, so they read written columns only. The products whose N is the head dim (O += P V,
// dQ += dS K, dV += P^T dO, dK += dS^T Q) run at N = 128, head dim 128's instruction and descriptors: output column
// n < 96 reads only B's column n (written), and columns 96..127 (whatever the unwritten smem holds, NaN included)
// land only in accumulator columns 96..127, which no later step reads across columns and the stores drop
// (kChunksPerRow = 12). Costs: smem and accumulator registers as at head dim 128, and 4/3 of the N-side MMA work.
// dualkv/cuda/swizzle.py models these addresses on the CPU (proofs_tests/test_cuda_swizzle.py).

// Descriptors are built once per tile (kmajor_tile / nmajor_tile) and stepped by adding the k-step's byte offset
// >> 4 to the start-address field (bits 0-13, no carry: shared addresses are < 256 KB), so each wgmma costs one add.

// K-major operand (rows x HEAD_DIM tile, rows from row0): k-step s is atom s / 4, 32 bytes per step inside the
// 128-byte row; 8-row groups 1024 bytes apart (stride).
__device__ __forceinline__ unsigned long long kmajor_tile(unsigned tile, int row0) {
    return smem_desc(tile + row0 * 128, 16, 1024);
}
template <int kRows>
__device__ __forceinline__ unsigned long long kmajor_desc(unsigned long long tile_desc, int s) {
    return tile_desc + ((((s / 4) * kRows * 128) + (s % 4) * 32) >> 4);
}

// A (rows x HEAD_DIM) tile as the N-major B operand of a product over its rows (O += P V, dV += P^T dO, ...),
// k-step s = rows 16s .. 16s + 15: 64-column atoms kRows * 128 bytes apart (leading), 8-row groups 1024 bytes
// apart (stride); the wgmma transposes it.
template <int kRows>
__device__ __forceinline__ unsigned long long nmajor_tile(unsigned tile) {
    return smem_desc(tile, kRows * 128, 1024);
}
__device__ __forceinline__ unsigned long long nmajor_desc(unsigned long long tile_desc, int s) {
    return tile_desc + ((s * 16 * 128) >> 4);
}

__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Orders the compiler's use of a register tile (accumulators, or A fragments) that an in-flight wgmma reads or writes.
template <typename T, int N>
__device__ __forceinline__ void fence_regs(T (&regs)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) reg_fence(regs[i][e]);
}

}  // namespace dkv
