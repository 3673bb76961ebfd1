// Hopper (sm_90) asynchronous-copy primitives: mbarriers, bulk tensor copies (TMA) driven by host-encoded tensor
// maps, named barriers and warpgroup register reallocation. Thin PTX wrappers; the pipelines are in the kernels.
#pragma once

#include "common.cuh"
#include "flags.cuh"  // DKV_WAIT_LIMIT, and the GPU-scope flags the warp-specialised backward orders dQ with

#define DKV_STR2(x) #x
#define DKV_STR(x) DKV_STR2(x)

namespace dkv {

// A CUtensorMap (cuTensorMapEncodeTiled, see dualkv/cuda/tma.py) passed by value as a __grid_constant__ kernel
// parameter: 128 opaque bytes, 64-byte aligned.
struct alignas(64) TmaDesc {
    unsigned long long opaque[16];
};

// ---- mbarrier (shared::cta), phase-parity protocol.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA) before any copy completes on them.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// One arrival that also announces `bytes` of asynchronous copies completing on this barrier in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar),
                 "r"(bytes) : "memory");
}
// Block until the phase with parity `phase` of the barrier has completed. A pipeline bug would hang the GPU
// silently; after 2^22 failed tries (each waits a while in hardware: far longer than any real wait) it traps
// instead, which the launcher reports as an error. One asm block: the compiler sees no loop around the wgmma code.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned phase) {
    asm volatile(
        "{\n.reg .pred done, more;\n.reg .u32 tries;\n"
        "mov.u32 tries, 0;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@done bra DONE_%=;\n"
        "add.u32 tries, tries, 1;\n"
        "setp.lt.u32 more, tries, " DKV_STR(DKV_WAIT_LIMIT) ";\n"
        "@more bra WAIT_%=;\n"
        "trap;\n"
        "DONE_%=:\n}\n" ::"r"(bar),
        "r"(phase)
        : "memory");
}

// ---- TMA: a box of a 3-D tensor map ({inner, middle, outer} element coordinates) into shared memory; completion
// (its bytes) is signalled on `bar`.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TmaDesc* map, int c0, int c1, int c2, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void tma_prefetch_desc(const TmaDesc* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

// ---- Bulk (non-tensor) copies from shared to global: fp32 reduce-add of `bytes` (multiple of 16, 16-byte aligned
// both sides), grouped per thread (commit_group), waited for with bulk_wait / bulk_wait_read.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most kPending of this thread's groups are incomplete / still reading their shared-memory source.
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Orders this thread's async-proxy global writes (bulk copies) before its later generic-proxy accesses.
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// ---- stmatrix: four 8x8 16-bit matrices from mma C-fragment registers (thread l: row l / 4, columns 2 (l % 4), +1
// of each) to shared memory, transposed; lanes 8j .. 8j + 7 give the addresses of matrix j's 8 (transposed) rows.
__device__ __forceinline__ void stmatrix_x4_trans(unsigned addr, const unsigned (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

// The same without the transpose: matrix j's 8 rows as the fragments hold them (lanes 8j .. 8j + 7: their addresses).
__device__ __forceinline__ void stmatrix_x4(unsigned addr, const unsigned (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
                 "r"(r[2]), "r"(r[3])
                 : "memory");
}

// ---- Named barriers (id 0 is __syncthreads): sync waits for `count` threads; arrive signals without waiting.
__device__ __forceinline__ void named_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// ---- Warpgroup register reallocation (every warp of the warpgroup executes the same one).
template <int kRegs>
__device__ __forceinline__ void regs_dealloc() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_alloc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace dkv
