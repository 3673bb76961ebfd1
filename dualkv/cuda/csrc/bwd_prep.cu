// Backward preprocessing: D = rowsum(dO * O) (fp32, minus the gradient reaching the returned LSE when there is
// one) and the LSE in the log2 domain, both (H, T_q) fp32 — read once from the 16-bit tensors, with no fp32 copies
// of dO or O. kLanes threads share a (token, head) row: consecutive lanes read consecutive 16-byte chunks, so a warp
// reads 32 / kLanes whole rows of contiguous memory (one thread per row read 256-byte-strided chunks: 3x slower).
// Rows are walked warp-uniformly with a grid stride, so any grid size is correct.
#include "common.cuh"

using namespace dkv;

namespace {
#if DKV_BF16
__device__ __forceinline__ float2 to_float2(elem2_t v) { return __bfloat1622float2(v); }
#else
__device__ __forceinline__ float2 to_float2(elem2_t v) { return __half22float2(v); }
#endif

constexpr int kLanes = kChunksPerRow % 8 == 0 ? 8 : kChunksPerRow % 4 == 0 ? 4 : kChunksPerRow % 2 == 0 ? 2 : 1;
constexpr int kChunksPerLane = kChunksPerRow / kLanes;
constexpr int kRowsPerWarp = 32 / kLanes;
}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) dualkv_bwd_prep(
    const elem_t* __restrict__ dout, long long do_st, long long do_sh, const elem_t* __restrict__ out, long long o_st,
    long long o_sh, const float* __restrict__ lse, const float* __restrict__ d_lse, long long lse_sh,
    float* __restrict__ lse2, float* __restrict__ delta, int tokens, int heads) {
    const int lane = threadIdx.x % 32, sub = lane % kLanes;
    const long long total = static_cast<long long>(tokens) * heads;
    const long long stride = static_cast<long long>(gridDim.x) * kWarps * kRowsPerWarp;
    for (long long base = (static_cast<long long>(blockIdx.x) * kWarps + threadIdx.x / 32) * kRowsPerWarp;
         base < total; base += stride) {           // warp-uniform: every lane takes part in the shuffles
        const long long row = base + lane / kLanes;
        const bool valid = row < total;
        const int t = valid ? static_cast<int>(row / heads) : 0, h = valid ? static_cast<int>(row % heads) : 0;
        float acc = 0.f;
        if (valid) {
            const uint4* a = reinterpret_cast<const uint4*>(dout + t * do_st + h * do_sh);
            const uint4* b = reinterpret_cast<const uint4*>(out + t * o_st + h * o_sh);
#pragma unroll
            for (int j = 0; j < kChunksPerLane; ++j) {
                const uint4 x = a[sub + j * kLanes], y = b[sub + j * kLanes];
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
        }
#pragma unroll
        for (int off = kLanes / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (valid && sub == 0) {
            const long long idx = h * lse_sh + t;
            delta[idx] = d_lse ? acc - d_lse[idx] : acc;
            lse2[idx] = lse[idx] * 1.4426950408889634f;
        }
    }
}
