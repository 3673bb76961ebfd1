// Shared by the query-tile wgmma kernels (fwd_sm90.cu, bwd_dq_sm90.cu): their shape checks and the two smem stages
// of K and V blocks that follow their query-side tiles (128-byte-swizzle layout, 1024-byte aligned).
#pragma once

#include "qtile.cuh"
#include "sm90.cuh"

namespace dkv {

static_assert(kMSlabs == 1 && kDSplit == 1 && kWarps == 8, "the query-tile wgmma kernels run two warpgroups of 64 rows");
static_assert(kHeadDimAcc % 64 == 0 && kBlockN % 64 == 0, "swizzle atoms are 64 elements wide");

constexpr int kTileBytesQ = kBlockM * kHeadDimAcc * 2;   // one query-side tile (Q, dO)
constexpr int kTileBytesKV = kBlockN * kHeadDimAcc * 2;  // one K or V block

// K and V blocks of the visiting order, double-buffered from `first` on: K stage 0, K stage 1, V stage 0, V stage 1;
// block `it` lives in stage it & 1.
struct KVStages {
    unsigned char* first;

    __device__ __forceinline__ elem_t* k(int it) const {
        return reinterpret_cast<elem_t*>(first + (it & 1) * kTileBytesKV);
    }
    __device__ __forceinline__ elem_t* v(int it) const {
        return reinterpret_cast<elem_t*>(first + (2 + (it & 1)) * kTileBytesKV);
    }
};

}  // namespace dkv
