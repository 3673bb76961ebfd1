// DualKV forward for Hopper, warp-specialised (sm_90a): the schedule, masks and online softmax of fwd.cu / fwd_sm90.cu
// with TMA loads, mbarrier pipelines and producer/consumer warpgroups.
//
// CTA (tile, head group) as in qtile.cuh; 3 warpgroups:
//   warpgroup 0 (producer): gives most of its registers away (setmaxnreg); one thread issues the TMA copies — the
//     query tile once (one box per packed head and 64-column atom), then K and V of every block of the visiting
//     order into a ring of kStages stages, each stage's K and V on their own "full" mbarrier, a stage refilled once
//     both consumer warpgroups released it on its "empty" mbarrier;
//   warpgroups 1, 2 (consumers, 64 query rows each, more registers): per block it
//     S[it] = Q K[it]^T (wgmma, both operands from the 128-byte-swizzled smem TMA wrote) issued together with
//     O += P[it-1] V[it-1] (P from registers), then the online softmax of S[it] while the other warpgroup's products
//     run: with DKV_PINGPONG the two warpgroups take turns issuing (named barriers), so one's softmax hides under
//     the other's tensor-core work; with DKV_FWD_WAIT1 (below) it also overlaps the warpgroup's own P V[it-1].
// Rows of a tile past the segment, and keys past a partial block (TMA reads the following rows of the tensor, or
// zeros past its end), are masked exactly as in the other forwards.
#include "softmax.cuh"
#include "sm90.cuh"
#include "tma.cuh"

using namespace dkv;

namespace {

constexpr int kStages = DKV_STAGES;
constexpr bool kPingPong = DKV_PINGPONG != 0;
constexpr int kConsumerThreads = 256;
// Tiles and the output accumulator have kHeadDimAcc columns (head dim 96: 128, sm90.cuh); the TMA zero-fills the
// columns past the head dim and only kHeadDim columns are stored.
constexpr int kTileBytesQ = kBlockM * kHeadDimAcc * 2;
constexpr int kTileBytesKV = kBlockN * kHeadDimAcc * 2;
constexpr int kAtoms = kHeadDimAcc / 64;

static_assert(kWarps == 8 && kMSlabs == 1 && kDSplit == 1, "two consumer warpgroups of 64 query rows");
// Key blocks of a multiple of 16 rows up to 256 (configs.SM90_WS_FWD_TILES: 192, 112, 80): a K or V slot is then a
// whole number of 1024-byte swizzle periods (rows of 128 bytes per 64-column atom), a TMA box, and whole k-steps of
// P V. S's N is the block, so wgmma.cuh must have that width (gen_wgmma.WIDTHS; another fails to compile).
static_assert(kHeadDimAcc % 64 == 0 && kBlockN % 16 == 0 && kBlockN <= 256, "64-column swizzle atoms, TMA box <= 256");
static_assert(kPosPerTile % 8 == 0, "each packed head's rows start on a swizzle period");

// Named barrier ids (0 is __syncthreads).
constexpr int kBarTurn0 = 2;      // ping-pong: warpgroup 0's turn to issue (+1: warpgroup 1's)
constexpr int kBarWg0 = 4;        // one consumer warpgroup (+wg)

// DKV_SPLIT_RELEASE (the default with two stages: every head dim but 64, configs.SM90_WS_FWD_TILES): a stage's K and
// V slots are freed separately, K once S = Q K^T of its block has completed, V once P V has (an iteration later), so
// the producer refills the K slot an iteration earlier. Freed together after P V, two stages left the next K block
// only the softmax to arrive in: H100, head dim 256 (then on 64-key blocks), forward ms at (8, 8K), (16, 16K),
// (16, 32K) 9.9 / 36.7 / 84.2 against 11.7 / 45.0 / 103.1 (own processes, twice each; experiments/results/checks/
// fwd-split-release-h100-20261127T1846Z.log). With three stages it measured the same (128 on 128-key blocks: 8.9 /
// 44.7 against 8.6 / 44.6 ms at (28, 4K), (16, 32K); 192 on 64-key blocks: 13.7 / 70.0 against 13.9 / 69.8), so
// the three-stage build (head dim 64) keeps the joint release.
#ifndef DKV_SPLIT_RELEASE
#define DKV_SPLIT_RELEASE (DKV_STAGES < 3)
#endif
constexpr bool kSplitRelease = DKV_SPLIT_RELEASE != 0;
// DKV_FWD_WAIT1 (the tile's overlap, DKV_OVERLAP: FlashAttention-3's intra-warpgroup overlap; configs.SM90_WS_FWD_TILES
// turns it on at head dims 96 to 256, where it measured faster): a block's softmax waits for its S only (wgmma_wait<1>), so it overlaps the
// warpgroup's own P V of the block before; the output's rescale and the next A fragments wait for that product. Its
// registers (P V's A fragments live through the softmax) make the 192-key causal builds spill 32-72 bytes, 132-160
// with the lazy rescale (NVRTC 13.0), so it runs on 128-key blocks (none). H200, d = 128 forward ms at (28, 4K) /
// (8, 8K) / (16, 32K), own processes (experiments/results/checks/s35fwd-*; lazy: softmax.cuh's DKV_SOFTMAX_LAZY):
//   192-key blocks: without either 8.12 / 4.85 / 42.54; lazy 8.17 / 4.76 / 42.45; this overlap 8.52 / 4.72 / 43.11;
//     both 8.75-8.87 / 5.19-5.20 / 46.05;
//   128-key blocks with both: two stages 8.11-8.19 / 4.47-4.68 / 41.10-41.35; three stages 7.87-8.02 / 4.49-4.56 /
//     41.38-41.71.
#ifndef DKV_FWD_WAIT1
#define DKV_FWD_WAIT1 DKV_OVERLAP
#endif
constexpr bool kWait1 = DKV_FWD_WAIT1 != 0;

struct Barriers {
    unsigned q, full_k, full_v, empty, empty_v;  // shared addresses; stage s at +8 s (empty: K's, or the stage's)
};

__device__ __forceinline__ void issue_qk(float (&acc_s)[kBlockN / 8][4], unsigned long long q_desc, unsigned k_addr) {
    const unsigned long long k_desc = kmajor_tile(k_addr, 0);
#pragma unroll
    for (int s = 0; s < kHeadDim / 16; ++s)
        wgmma_ss(acc_s, kmajor_desc<kBlockM>(q_desc, s), kmajor_desc<kBlockN>(k_desc, s), s > 0);
}

__device__ __forceinline__ void issue_pv(float (&acc_o)[kHeadDimAcc / 8][4], const unsigned (&p_frag)[kBlockN / 16][4],
                                         unsigned v_addr) {
    const unsigned long long v_desc = nmajor_tile<kBlockN>(v_addr);
#pragma unroll
    for (int s = 0; s < kBlockN / 16; ++s) wgmma_rs(acc_o, p_frag[s], nmajor_desc(v_desc, s));
}

// Producer: the query tile, then K and V of every block through the stage ring.
__device__ __forceinline__ void produce(const QTile& t, const Barriers& bar, unsigned sq, unsigned skv,
                                        const TmaDesc* tm_q, const TmaDesc* tm_kd, const TmaDesc* tm_vd,
                                        const TmaDesc* tm_kc, const TmaDesc* tm_vc) {
    mbar_arrive_expect_tx(bar.q, kTileBytesQ);
    const int q_tok = t.seg.q_start + t.pos0;
#pragma unroll
    for (int h = 0; h < kPack; ++h)
#pragma unroll
        for (int a = 0; a < kAtoms; ++a)
            tma_load_3d(sq + a * kBlockM * 128 + h * kPosPerTile * 128, tm_q, a * 64, t.head0 + h, q_tok, bar.q);
    for (int it = 0; it < t.n_iter; ++it) {
        const int s = it % kStages;
        if (it >= kStages) mbar_wait(bar.empty + 8 * s, ((it / kStages) + 1) & 1);  // K[it - kStages] read
        bool is_own;
        const int k0 = block_start(t, it, is_own);
        const int tok = block_row(t, is_own, k0);
        const TmaDesc* tk = is_own ? tm_kd : tm_kc;
        const TmaDesc* tv = is_own ? tm_vd : tm_vc;
        const unsigned k_dst = skv + s * kTileBytesKV, v_dst = skv + (kStages + s) * kTileBytesKV;
        mbar_arrive_expect_tx(bar.full_k + 8 * s, kTileBytesKV);
#pragma unroll
        for (int a = 0; a < kAtoms; ++a) tma_load_3d(k_dst + a * kBlockN * 128, tk, a * 64, t.kv_head, tok, bar.full_k + 8 * s);
        if (kSplitRelease && it >= kStages) mbar_wait(bar.empty_v + 8 * s, ((it / kStages) + 1) & 1);
        mbar_arrive_expect_tx(bar.full_v + 8 * s, kTileBytesKV);
#pragma unroll
        for (int a = 0; a < kAtoms; ++a) tma_load_3d(v_dst + a * kBlockN * 128, tv, a * 64, t.kv_head, tok, bar.full_v + 8 * s);
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kConsumerThreads + 128, 1) dualkv_fwd_sm90_ws(
    const __grid_constant__ TmaDesc tm_q, const __grid_constant__ TmaDesc tm_kd, const __grid_constant__ TmaDesc tm_vd,
    const __grid_constant__ TmaDesc tm_kc, const __grid_constant__ TmaDesc tm_vc, elem_t* __restrict__ o,
    long long o_st, long long o_sh, float* __restrict__ lse, long long lse_sh, const int* __restrict__ segments,
    const int* __restrict__ tiles, int group_size, float scale_log2, int window_left) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* base = align_1024(smem_raw);  // TMA's and wgmma's 128-byte swizzle is anchored to 1024 bytes
    const unsigned sq = smem_addr(base);
    const unsigned skv = sq + kTileBytesQ;
    const unsigned bar0 = skv + 2 * kStages * kTileBytesKV;
    const Barriers bar{bar0, bar0 + 8, bar0 + 8 + 8 * kStages, bar0 + 8 + 16 * kStages, bar0 + 8 + 24 * kStages};

    const QTile t = make_qtile(segments, tiles, group_size, window_left);
    const int warp = threadIdx.x / 32;
    if (threadIdx.x == 0) {
        mbar_init(bar.q, 1);
        for (int s = 0; s < kStages; ++s) {
            mbar_init(bar.full_k + 8 * s, 1);
            mbar_init(bar.full_v + 8 * s, 1);
            mbar_init(bar.empty + 8 * s, kWarps);  // lane 0 of every consumer warp
            if (kSplitRelease) mbar_init(bar.empty_v + 8 * s, kWarps);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (warp < 4) {  // ---------------------------------------------------------------------------- producer
        regs_dealloc<24>();
        if (threadIdx.x == 0) {
            tma_prefetch_desc(&tm_kc);
            tma_prefetch_desc(&tm_vc);
            produce(t, bar, sq, skv, &tm_q, &tm_kd, &tm_vd, &tm_kc, &tm_vc);
        }
        return;
    }

    // ---------------------------------------------------------------------------------------------- consumers
    regs_alloc<240>();
    const int ct = threadIdx.x - 128;
    const int cwarp = ct / 32, lane = ct % 32;
    const int wg = __shfl_sync(0xffffffff, cwarp / 4, 0);  // warp-uniform
    QWarp qw;
    qw.dsplit = 0;
    qw.row0 = cwarp * 16;
    qw.col0 = 0;
    qw.g = lane / 4;
    qw.t4 = lane % 4;
    qw.lrow = lane % 8;
    qw.lmat = lane / 8;
    const unsigned long long q_desc = kmajor_tile(sq, wg * 64);

    float acc_o[1][kHeadDimAcc / 8][4];
    float row_max[1][2], row_sum[1][2];
    init_rows(acc_o, row_max, row_sum);
    unsigned p_frag[1][kBlockN / 16][4];

    if (kPingPong && wg == 1) named_arrive(kBarTurn0, kConsumerThreads);  // warpgroup 0 issues first
    mbar_wait(bar.q, 0);

    for (int it = 0; it < t.n_iter; ++it) {
        const int s = it % kStages;
        const int sp = (it + kStages - 1) % kStages;  // stage of block it - 1
        mbar_wait(bar.full_k + 8 * s, (it / kStages) & 1);
        if (it > 0) mbar_wait(bar.full_v + 8 * sp, ((it - 1) / kStages) & 1);
        if (kPingPong) named_sync(kBarTurn0 + wg, kConsumerThreads);
        float acc_s[1][kBlockN / 8][4];
        wgmma_fence();
        issue_qk(acc_s[0], q_desc, skv + s * kTileBytesKV);
        wgmma_commit();
        if (kWait1 && it > 0) {
            // (P V issued in this branch, so that ptxas sees two groups in flight at the wait<1>)
            issue_pv(acc_o[0], p_frag[0], skv + (kStages + sp) * kTileBytesKV);
            wgmma_commit();
            if (kPingPong) named_arrive(kBarTurn0 + (wg ^ 1), kConsumerThreads);
            // S[it] done; P[it - 1] V[it - 1] may still run: its accumulator and A fragments stay untouched until
            // the wait below, so this block's softmax overlaps it.
            wgmma_wait<1>();
            fence_regs(acc_s[0]);
            if (kSplitRelease) {
                __syncwarp();
                if (lane == 0) mbar_arrive(bar.empty + 8 * s);  // block it's K is no longer read
            }
            bool is_own;
            const int k0 = block_start(t, it, is_own);
            const int count = block_count(t, is_own, k0);
            const int key_base = block_key_base(t, is_own, k0);
            float alpha[1][2];
            const bool rescale = softmax_block(acc_s, row_max, row_sum, alpha, t, is_own, count, key_base,
                                               window_left, qw.row0, qw.g, qw.t4, scale_log2);
            wgmma_wait<0>();
            fence_regs(acc_o[0]);
            fence_regs(p_frag[0]);
            __syncwarp();
            if (lane == 0) mbar_arrive((kSplitRelease ? bar.empty_v : bar.empty) + 8 * sp);  // block it - 1's V (and K)
            if (rescale) rescale_out(acc_o, alpha);
            to_a_frag<1, kBlockN>(p_frag, acc_s);
            continue;
        }
        if (it > 0) {
            issue_pv(acc_o[0], p_frag[0], skv + (kStages + sp) * kTileBytesKV);
            wgmma_commit();
        }
        if (kPingPong) named_arrive(kBarTurn0 + (wg ^ 1), kConsumerThreads);
        wgmma_wait<0>();
        fence_regs(acc_s[0]);
        fence_regs(acc_o[0]);
        fence_regs(p_frag[0]);
        if (kSplitRelease) {
            __syncwarp();
            if (lane == 0) {
                mbar_arrive(bar.empty + 8 * s);                     // block it's K is no longer read
                if (it > 0) mbar_arrive(bar.empty_v + 8 * sp);      // block it - 1's V
            }
        } else if (it > 0) {
            __syncwarp();
            if (lane == 0) mbar_arrive(bar.empty + 8 * sp);  // block it - 1's K and V are no longer read
        }
        bool is_own;
        const int k0 = block_start(t, it, is_own);
        const int count = block_count(t, is_own, k0);
        const int key_base = block_key_base(t, is_own, k0);
        online_softmax_step(acc_s, acc_o, row_max, row_sum, t, is_own, count, key_base, window_left, qw.row0, qw.g,
                            qw.t4, scale_log2);
        to_a_frag<1, kBlockN>(p_frag, acc_s);
    }
    if (t.n_iter > 0) {
        const int sp = (t.n_iter - 1) % kStages;
        mbar_wait(bar.full_v + 8 * sp, ((t.n_iter - 1) / kStages) & 1);
        wgmma_fence();
        issue_pv(acc_o[0], p_frag[0], skv + (kStages + sp) * kTileBytesKV);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(acc_o[0]);
        fence_regs(p_frag[0]);
    }

    float inv_l[1][2];
    finish_rows(lse, lse_sh, t, row_max, row_sum, inv_l, qw);

    // O / l into this warpgroup's rows of the (no longer read) query tile, same swizzled layout, then coalesced
    // 16-byte stores of the valid rows.
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = qw.row0 + qw.g + 8 * hh;
#pragma unroll
        for (int nt = 0; nt < kHeadDim / 8; ++nt) {
            const unsigned off = swizzled_offset<kBlockM>(r, nt) + qw.t4 * 4;
            *reinterpret_cast<unsigned*>(base + off) =
                pack2(acc_o[0][nt][2 * hh] * inv_l[0][hh], acc_o[0][nt][2 * hh + 1] * inv_l[0][hh]);
        }
    }
    named_sync(kBarWg0 + wg, 128);
    const int wt = ct % 128;
    for (int idx = wt; idx < 64 * kChunksPerRow; idx += 128) {
        const int r = wg * 64 + idx / kChunksPerRow, c = idx % kChunksPerRow;
        const int p = r % kPosPerTile;
        if (p >= t.n_pos) continue;
        elem_t* out = o + (t.seg.q_start + t.pos0 + p) * o_st + (t.head0 + r / kPosPerTile) * o_sh + c * 8;
        *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(base + swizzled_offset<kBlockM>(r, c));
    }
}
