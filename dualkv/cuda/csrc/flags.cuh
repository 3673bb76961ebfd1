// GPU-scope flags that order work between CTAs (the deterministic dQ sums of bwd_sm90_ws.cu and of bwd_dkdv.cu's
// ordered mode): an acquire spin that traps rather than hang, and a release store. sm_70+ PTX.
#pragma once

#ifndef DKV_WAIT_LIMIT
#define DKV_WAIT_LIMIT 4194304  // failed mbarrier tries before a trap (debug: raise it to tell a hang from a slow wait)
#endif

namespace dkv {

__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// Spin until *p == v (acquire); traps after ~2^24 polls (seconds) rather than hang on an ordering bug.
__device__ __forceinline__ void wait_flag(const int* p, int v) {
    for (unsigned polls = 0; ld_acquire(p) != v;) {
        if (++polls > 256) __nanosleep(64);
        if (polls == (unsigned)DKV_WAIT_LIMIT * 4u) __trap();
    }
}
// A relaxed read, issued early so that other work hides its latency, and the fence that makes one that read v an
// acquire of it (PTX's acquire pattern: a strong read followed by fence.acq_rel).
__device__ __forceinline__ int ld_relaxed(const int* p) {
    int v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// Acquire *p == v given `seen`, an earlier relaxed read of *p: a fence if it already read v, else a spin.
__device__ __forceinline__ void acquire_flag(const int* p, int v, int seen) {
    if (seen == v)
        asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
    else
        wait_flag(p, v);
}
__device__ __forceinline__ void st_release(int* p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// *p += v in fp32 without waiting for it (RED): bwd_dkdv.cu's ordered mode, where atomicAdd with its result unused
// compiled to a returning ATOM that stalled the thread on every add (ncu, H100: 13% of the samples). The next step's
// dS barrier (the last step's: the barrier after the loop), then thread 0's release (cumulative), order it for the
// next contributor (PTX causality order). No "memory" clobber (the builds measured and tested have none); being
// volatile it is not moved across the barriers and fences around it.
__device__ __forceinline__ void red_add(float* p, float v) {
    asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;\n" ::"l"(p), "f"(v));
}

}  // namespace dkv
