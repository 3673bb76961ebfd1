// dQ = scale * acc / u in 16 bits, (T, H, d) with token/head strides, from the fixed-point dQ mode's int64
// accumulator in fragment order (bwd_dkdv.cu DKV_DQ_FIXED; dualkv/cuda/dq_layout.py) and each row's unit u
// (bwd_prep.cu; NaN where the row's bound was not finite, which makes the row NaN). As bwd_dq_frag_cast.cu: one
// thread per 8 outputs, the 8 threads of a chunk 8 consecutive tokens.
#include "common.cuh"

using namespace dkv;

extern "C" __global__ void __launch_bounds__(kThreads) dualkv_bwd_dq_fixed_cast(
    const long long* __restrict__ acc, long long acc_sh, const float* __restrict__ unit, long long unit_sh,
    elem_t* __restrict__ dq, long long dq_st, long long dq_sh, int tokens, int heads, float scale) {
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
    const float inv = 1.f / unit[h * unit_sh + t];  // exact: u is a power of two in [2^-126, 2^126] (or NaN)
    const longlong2* src = reinterpret_cast<const longlong2*>(acc + h * acc_sh + (t >> 3) * (8 * kHeadDim) + 64 * c +
                                                               4 * r8);
    const longlong2 e0 = src[0], e1 = src[1], o0 = src[16], o1 = src[17];  // even columns, then odd ones 32 on
    auto val = [&](long long x) { return __ll2float_rn(x) * scale * inv; };
    const uint4 out = make_uint4(pack2(val(e0.x), val(o0.x)), pack2(val(e0.y), val(o0.y)),
                                 pack2(val(e1.x), val(o1.x)), pack2(val(e1.y), val(o1.y)));
    *reinterpret_cast<uint4*>(dq + t * dq_st + h * dq_sh + 8 * c) = out;
}
