// DualKV backward, dK and dV, for Hopper (sm_90a): the walk, masks and fp32 accumulation of bwd_dkdv.cu (one CTA per
// key block and K/V head, no atomics, deterministic), with the four products on warpgroup MMAs.
//
// kWarps = 8: two warpgroups of 64 keys each (warp w owns keys 16w .. 16w + 15, the mma.sync kernel's rows). K and
// V of the block stay in shared memory; each step's Q and dO tiles (kBlockM queries of one head) and their LSE / D
// go through three cp.async buffers. Per step and warpgroup (smem tiles in the 128-byte-swizzle layout):
//   S^T  = K Q^T     and   dP^T = V dO^T       wgmma m64 n{kBlockM}, both operands K-major, issued together;
//   P^T  = exp2(S^T * scale_log2 - LSE)        (masked), in registers, while dP^T runs;
//   dV  += P^T dO    wgmma m64 n{HEAD_DIM}, A (P^T) from registers, B (dO) N-major;
//   dS^T = P^T * (dP^T - D);  dK += dS^T Q     likewise.
// dK *= softmax_scale at the end; both are cast once and stored through padded smem tiles.
//
// Steps run in pairs: the first step's dV/dK products keep running while the second step's S^T/dP^T are issued behind
// them, so the tensor cores drain once per pair instead of once per step (dK/dV 121 -> 100 ms at N=16, P=32K on an
// H200). Leaving products in flight across the loop's back edge instead makes ptxas serialize every wgmma (C7515: it
// cannot count the groups in flight there). The first k-step of S^T and dP^T is wgmma_ss_first (write-only
// accumulators: no value flows into them from the previous step); ptxas does not need it here, it is the build that
// was checked on the GPU.
#include "kernel_params.cuh"
#include "keywalk.cuh"
#include "sm90.cuh"

using namespace dkv;

namespace {

constexpr int kBlockM = DKV_BLOCK_M;
constexpr int kBlockKeys = 128;
constexpr int kStages = 3;
static_assert(kWarps == 8 && DKV_DSPLIT == 1 && DKV_STAGES == kStages && DKV_DQ_ATOMIC == 0,
              "the wgmma dK/dV kernel runs two warpgroups of 64 keys, three stages, deterministic dQ elsewhere");
static_assert(kHeadDimAcc % 64 == 0 && kBlockM % 64 == 0, "swizzle atoms are 64 elements wide");
constexpr int kKeyBytes = kBlockKeys * kHeadDimAcc * 2;  // tiles of kHeadDimAcc columns (sm90.cuh: head dim 96)
constexpr int kStepBytes = kBlockM * kHeadDimAcc * 2;

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1) dualkv_bwd_dkdv_sm90(DKV_DKDV_PARAMS) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* base = align_1024(smem_raw);
    elem_t* sK = reinterpret_cast<elem_t*>(base);
    elem_t* sV = reinterpret_cast<elem_t*>(base + kKeyBytes);
    auto sQ = [=](int b) { return reinterpret_cast<elem_t*>(base + 2 * kKeyBytes + b * kStepBytes); };
    auto sdO = [=](int b) { return reinterpret_cast<elem_t*>(base + 2 * kKeyBytes + (kStages + b) * kStepBytes); };
    float* sLse = reinterpret_cast<float*>(base + 2 * kKeyBytes + 2 * kStages * kStepBytes);  // [kStages][kBlockM]
    float* sDelta = sLse + kStages * kBlockM;                                                 // [kStages][kBlockM]

    const KeyBlock<kBlockM> kb = make_key_block<kBlockM>(key_tiles, blockIdx.x, segments, group_size, window_left,
                                                         kBlockKeys);
    const Walk<kBlockM>& w = kb.w;
    const int kv_head = blockIdx.y;
    {
        const StridedRows<const elem_t> k_rows = kb.rows(kd, kd_st, kd_sh, kc, kc_st, kc_sh, kv_head);
        const StridedRows<const elem_t> v_rows = kb.rows(vd, vd_st, vd_sh, vc, vc_st, vc_sh, kv_head);
        load_strided_rows<kBlockKeys, true>(sK, k_rows.first, k_rows.stride, w.count, q);
        load_strided_rows<kBlockKeys, true>(sV, v_rows.first, v_rows.stride, w.count, q);
    }

    // Stage the Q/dO rows, LSE and D of one step into buffer `buf`.
    auto load_step = [&](const Cursor& c, int buf) {
        load_walk_step<kBlockM, true>(w, c, kv_head, q, q_st, q_sh, dout, do_st, do_sh, lse2, delta, lse_sh, sQ(buf),
                                      sdO(buf), sLse + buf * kBlockM, sDelta + buf * kBlockM);
    };

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int warp_key0 = warp * 16;
    const int wg_key0 = __shfl_sync(0xffffffff, (warp / 4) * 64, 0);  // warp-uniform: descriptors in uniform registers
    const unsigned long long k_desc = kmajor_tile(smem_addr(sK), wg_key0), v_desc = kmajor_tile(smem_addr(sV), wg_key0);

    float acc_dk[1][kHeadDimAcc / 8][4], acc_dv[1][kHeadDimAcc / 8][4];
    zero_acc(acc_dk[0]);
    zero_acc(acc_dv[0]);

    // One step's four products on staged buffer `buf`. It returns with its dV and dK products in flight; when the
    // previous step's are in flight too, its wait for S^T retires them (the fragments they read stay untouched until
    // then). `retire` waits for everything.
    unsigned p_frag[1][kBlockM / 16][4], ds_frag[1][kBlockM / 16][4];
    auto step = [&](const Cursor& c, int buf) {
        const float* bLse = sLse + buf * kBlockM;
        const float* bDelta = sDelta + buf * kBlockM;
        const StepGeometry sg = step_geometry(w, c, kBlockKeys);
        const unsigned q_addr = smem_addr(sQ(buf)), do_addr = smem_addr(sdO(buf));
        const unsigned long long q_desc = kmajor_tile(q_addr, 0), do_desc = kmajor_tile(do_addr, 0);
        const unsigned long long qn_desc = nmajor_tile<kBlockM>(q_addr), don_desc = nmajor_tile<kBlockM>(do_addr);

        float acc_s[1][kBlockM / 8][4], acc_dp[1][kBlockM / 8][4];
        wgmma_fence();
        wgmma_ss_first(acc_s[0], kmajor_desc<kBlockKeys>(k_desc, 0), kmajor_desc<kBlockM>(q_desc, 0));
#pragma unroll
        for (int s = 1; s < kHeadDim / 16; ++s)  // S^T = K Q^T
            wgmma_ss(acc_s[0], kmajor_desc<kBlockKeys>(k_desc, s), kmajor_desc<kBlockM>(q_desc, s), 1);
        wgmma_commit();
        wgmma_ss_first(acc_dp[0], kmajor_desc<kBlockKeys>(v_desc, 0), kmajor_desc<kBlockM>(do_desc, 0));
#pragma unroll
        for (int s = 1; s < kHeadDim / 16; ++s)  // dP^T = V dO^T
            wgmma_ss(acc_dp[0], kmajor_desc<kBlockKeys>(v_desc, s), kmajor_desc<kBlockM>(do_desc, s), 1);
        wgmma_commit();
        wgmma_wait<1>();  // S^T done (and any earlier step's dV and dK)
        fence_regs(acc_s[0]);
        fence_regs(acc_dk[0]);
        fence_regs(acc_dv[0]);
        fence_regs(p_frag[0]);
        fence_regs(ds_frag[0]);

        probs_t(acc_s[0], bLse, sg.need_mask, sg.key_base + warp_key0, sg.query_pos0, window_left, g, t4,
                scale_log2);  // P^T
        to_a_frag<1, kBlockM>(p_frag, acc_s);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < kBlockM / 16; ++s)  // dV += P^T dO
            wgmma_rs(acc_dv[0], p_frag[0][s], nmajor_desc(don_desc, s));
        wgmma_commit();
        wgmma_wait<1>();  // dP^T done (dV may still run)
        fence_regs(acc_dp[0]);

        dscores_t(acc_dp[0], acc_s[0], bDelta, t4);  // dS^T
        to_a_frag<1, kBlockM>(ds_frag, acc_dp);
        fence_regs(acc_dk[0]);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < kBlockM / 16; ++s)  // dK += dS^T Q
            wgmma_rs(acc_dk[0], ds_frag[0][s], nmajor_desc(qn_desc, s));
        wgmma_commit();
    };
    auto retire = [&]() {
        wgmma_wait<0>();
        fence_regs(acc_dk[0]);
        fence_regs(acc_dv[0]);
        fence_regs(p_frag[0]);
        fence_regs(ds_frag[0]);
    };
    // Wait for step `c`'s loads (issued one step ago), then start the loads of the step after it into `nxt_buf`.
    auto advance = [&](const Cursor& c, int nxt_buf) {
        const Cursor nxt = w.next(c);
        cp_async_wait<0>();
        fence_async_smem();
        // Step c's Q/dO/LSE/D (and the K/V block) are in smem everywhere, and nxt_buf's last step (two steps back,
        // the previous pair) was retired by every warpgroup; the previous step's buffer may still be read.
        __syncthreads();
        if (nxt.valid) load_step(nxt, nxt_buf);
        cp_async_commit();
        return nxt;
    };

    Cursor cur = w.first();
    if (cur.valid) load_step(cur, 0);
    cp_async_commit();
    int buf = 0;
    auto following = [](int b) { return b + 1 == kStages ? 0 : b + 1; };
    while (cur.valid) {
        Cursor nxt = advance(cur, following(buf));
        step(cur, buf);
        cur = nxt;
        buf = following(buf);
        if (cur.valid) {  // the pair's second step: its S^T/dP^T queue behind the first step's dV/dK
            nxt = advance(cur, following(buf));
            step(cur, buf);
            cur = nxt;
            buf = following(buf);
        }
        retire();
    }
    cp_async_wait<0>();
    __syncthreads();

    // dK (scaled) and dV through padded smem tiles (the K/V/Q/dO tiles are free now), coalesced 16-byte stores.
    elem_t* tile_dk = reinterpret_cast<elem_t*>(base);
    elem_t* tile_dv = tile_dk + kBlockKeys * kRowStride;
    stage_acc_rows(tile_dk, acc_dk[0], warp_key0, 0, g, t4, scale);
    stage_acc_rows(tile_dv, acc_dv[0], warp_key0, 0, g, t4, 1.f);
    __syncthreads();
    const StridedRows<elem_t> dk_rows = kb.rows(dkd, dkd_st, dkd_sh, dkc, dkc_st, dkc_sh, kv_head);
    const StridedRows<elem_t> dv_rows = kb.rows(dvd, dvd_st, dvd_sh, dvc, dvc_st, dvc_sh, kv_head);
    store_padded_rows(dk_rows.first, dk_rows.stride, tile_dk, kBlockKeys, w.count);
    store_padded_rows(dv_rows.first, dv_rows.stride, tile_dv, kBlockKeys, w.count);
}
