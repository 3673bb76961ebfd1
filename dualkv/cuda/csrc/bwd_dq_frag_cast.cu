// dQ = scale * acc in 16 bits, (T, H, d) with token/head strides, from the atomic and ordered dQ modes' fp32
// accumulator in fragment order (bwd_dkdv.cu; dualkv/cuda/dq_layout.py): head h's block at h * acc_sh, token t's 8-column chunk c at
// (t / 8) * 8d + 64 c + 4 (t % 8), its even columns there and its odd ones 32 floats on. One thread per 8 outputs;
// the 8 threads of a chunk are 8 consecutive tokens, so they read 128 contiguous bytes per load.
#include "common.cuh"

using namespace dkv;

extern "C" __global__ void __launch_bounds__(kThreads) dualkv_bwd_dq_frag_cast(
    const float* __restrict__ acc, long long acc_sh, elem_t* __restrict__ dq, long long dq_st, long long dq_sh,
    int tokens, int heads, float scale) {
    // idx = ((token group * heads + h) * chunks + c) * 8 + token % 8
    const long long idx = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
    const long long groups = (tokens + 7) / 8;
    if (idx >= groups * heads * kChunksPerRow * 8) return;
    const int r8 = static_cast<int>(idx % 8);
    const int c = static_cast<int>(idx / 8 % kChunksPerRow);
    const long long gh = idx / 8 / kChunksPerRow;
    const int h = static_cast<int>(gh % heads);
    const long long t = gh / heads * 8 + r8;
    if (t >= tokens) return;
    const float* src = acc + h * acc_sh + (t >> 3) * (8 * kHeadDim) + 64 * c + 4 * r8;
    const float4 even = *reinterpret_cast<const float4*>(src);
    const float4 odd = *reinterpret_cast<const float4*>(src + 32);
    const uint4 out = make_uint4(pack2(even.x * scale, odd.x * scale), pack2(even.y * scale, odd.y * scale),
                                 pack2(even.z * scale, odd.z * scale), pack2(even.w * scale, odd.w * scale));
    *reinterpret_cast<uint4*>(dq + t * dq_st + h * dq_sh + 8 * c) = out;
}
