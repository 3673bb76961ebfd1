// dQ = scale * acc in 16 bits, (T, H, d) with token/head strides, from the warp-specialised backward's fp32 accumulator
// (H, rows, acc_row >= d; the kernel writes rows of d), whose row t holds its 16-byte chunks permuted within
// groups of 8 (logical chunk c at c ^ (t & 7), bwd_sm90_ws.cu): one pass, one thread per 8 output elements.
#include "common.cuh"

using namespace dkv;

extern "C" __global__ void __launch_bounds__(kThreads) dualkv_bwd_dq_cast(
    const float* __restrict__ acc, long long acc_sh, long long acc_row, elem_t* __restrict__ dq, long long dq_st,
    long long dq_sh, int tokens, int heads, float scale) {
    const long long idx = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;  // (token, head, chunk)
    if (idx >= static_cast<long long>(tokens) * heads * kChunksPerRow) return;
    const int c = static_cast<int>(idx % kChunksPerRow);
    const long long row = idx / kChunksPerRow;
    const int h = static_cast<int>(row % heads), t = static_cast<int>(row / heads);
    const float* src = acc + h * acc_sh + static_cast<long long>(t) * acc_row;
    const float4 a = *reinterpret_cast<const float4*>(src + 4 * ((2 * c) ^ (t & 7)));
    const float4 b = *reinterpret_cast<const float4*>(src + 4 * ((2 * c + 1) ^ (t & 7)));
    const uint4 out = make_uint4(pack2(a.x * scale, a.y * scale), pack2(a.z * scale, a.w * scale),
                                 pack2(b.x * scale, b.y * scale), pack2(b.z * scale, b.w * scale));
    *reinterpret_cast<uint4*>(dq + t * dq_st + h * dq_sh + 8 * c) = out;
}
