// Backward preprocessing, one thread per (token, head) row: D = rowsum(dO * O) (fp32, minus the gradient reaching
// the returned LSE when there is one) and the LSE in the log2 domain, both (H, T_q) fp32 — read once from the
// 16-bit tensors, with no fp32 copies of dO or O.
#include "common.cuh"

using namespace dkv;

namespace {
#if DKV_BF16
__device__ __forceinline__ float2 to_float2(elem2_t v) { return __bfloat1622float2(v); }
#else
__device__ __forceinline__ float2 to_float2(elem2_t v) { return __half22float2(v); }
#endif
}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) dualkv_bwd_prep(
    const elem_t* __restrict__ dout, long long do_st, long long do_sh, const elem_t* __restrict__ out, long long o_st,
    long long o_sh, const float* __restrict__ lse, const float* __restrict__ d_lse, long long lse_sh,
    float* __restrict__ lse2, float* __restrict__ delta, int tokens, int heads) {
    const long long row = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    if (row >= static_cast<long long>(tokens) * heads) return;
    const int t = static_cast<int>(row / heads), h = static_cast<int>(row % heads);
    const uint4* a = reinterpret_cast<const uint4*>(dout + t * do_st + h * do_sh);
    const uint4* b = reinterpret_cast<const uint4*>(out + t * o_st + h * o_sh);
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < kChunksPerRow; ++c) {
        const uint4 x = a[c], y = b[c];
        const elem2_t* xs = reinterpret_cast<const elem2_t*>(&x);
        const elem2_t* ys = reinterpret_cast<const elem2_t*>(&y);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 xf = to_float2(xs[e]);
            const float2 yf = to_float2(ys[e]);
            acc = fmaf(xf.x, yf.x, acc);
            acc = fmaf(xf.y, yf.y, acc);
        }
    }
    const long long idx = h * lse_sh + t;
    delta[idx] = d_lse ? acc - d_lse[idx] : acc;
    lse2[idx] = lse[idx] * 1.4426950408889634f;
}
