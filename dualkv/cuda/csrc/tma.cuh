// Hopper (sm_90) asynchronous-copy primitives: mbarriers, bulk tensor copies (TMA) driven by host-encoded tensor
// maps, named barriers and warpgroup register reallocation. Thin PTX wrappers; the pipelines are in the kernels.
#pragma once

#include "common.cuh"

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
// Block until the phase with parity `phase` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned phase) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
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
