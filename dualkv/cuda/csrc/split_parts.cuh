// Split key tiles (dualkv/cuda/ws_split.py), shared by the backwards whose dQ adds in a fixed order (bwd_sm90_ws.cu,
// and bwd_dkdv.cu's ordered mode): the key-tile table's first `partial_rows` rows come in runs of `parts` rows whose
// CTAs hold the same keys and walk disjoint ranges of their dependents. dQ is untouched (each (head, query tile) still
// receives every key block once, at the same rank). dK / dV: each CTA of a run puts its fp32 accumulator fragments
// into its slot (row * kv_heads + kv_head; float4s thread-minor, array by array), and the last CTA of the run to arrive
// (a counter per run and KV head) sums the run's slots in part order - the same order whichever CTA is last, so the
// bits do not depend on timing - then stores the result like an unsplit CTA.
#pragma once

namespace dkv {

// One (kN8 x 4) accumulator array of this thread (tid of kT threads) into array slot `array` of a CTA's slot.
template <int kN8, int kT>
__device__ __forceinline__ void part_put(float* slot, const float (&acc)[kN8][4], int array, int tid) {
    float4* dst = reinterpret_cast<float4*>(slot) + array * kN8 * kT + tid;
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt)
        __stcg(dst + nt * kT, make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]));
}

// acc = (slot 0 + slot 1) + ... (the run's `parts` slots, `stride` floats apart, added in part order), from L2.
template <int kN8, int kT>
__device__ __forceinline__ void part_sum(const float* slot0, long long stride, int parts, float (&acc)[kN8][4],
                                         int array, int tid) {
    const float4* src = reinterpret_cast<const float4*>(slot0) + array * kN8 * kT + tid;
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt) {
        const float4 v = __ldcg(src + nt * kT);
        acc[nt][0] = v.x;
        acc[nt][1] = v.y;
        acc[nt][2] = v.z;
        acc[nt][3] = v.w;
    }
#pragma unroll 1
    for (int p = 1; p < parts; ++p) {
        src += stride / 4;
#pragma unroll
        for (int nt = 0; nt < kN8; ++nt) {
            const float4 v = __ldcg(src + nt * kT);
            acc[nt][0] += v.x;
            acc[nt][1] += v.y;
            acc[nt][2] += v.z;
            acc[nt][3] += v.w;
        }
    }
}

// After this thread's part_put, between two barriers of every thread that put (the caller's `sync`): whether this
// CTA is its run's last; thread `tid` 0 counts. s_flag: an int of smem nothing else uses now.
template <typename Sync>
__device__ __forceinline__ bool part_last(int* counter, int parts, int tid, volatile int* s_flag, Sync sync) {
    __threadfence();  // this thread's slot before the count that tells the last CTA to read it
    sync();
    if (tid == 0) *s_flag = atomicAdd(counter, 1) == parts - 1;
    sync();
    const bool last = *s_flag != 0;
    if (last) __threadfence();
    return last;
}

}  // namespace dkv
