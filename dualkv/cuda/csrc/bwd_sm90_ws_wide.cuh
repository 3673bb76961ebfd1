// The consumer warpgroups of the warp-specialised Hopper backward at head dims 192 and 256 (DKV_WIDE: 64-key CTAs),
// included by bwd_sm90_ws.cu after its constants; the producer warpgroup (TMA, LSE/D, the fixed-order dQ adds) is
// that file's, unchanged.
//
// At these head dims one warpgroup cannot hold dK and dV of 64 keys beside its other registers (2 x 64 x 256 fp32 is
// 256 registers a thread), so the warpgroups split the work by ROLE: warpgroup 0 accumulates dV, warpgroup 1 dK,
// each over all 64 keys and the whole head dim (128 / 96 registers). Per step of 64 queries, warpgroup w takes the
// step's queries 32w .. 32w + 31 for the score products, then both meet in shared memory:
//   S^T = K Q_w^T, dP^T = V dO_w^T        (wgmma m64 n32, K / V and Q / dO K-major in smem)
//   P^T = exp2(S^T scale - LSE), masked;  dS^T = P^T (dP^T - D)      (fp32, in registers)
//   P^T, dS^T -> smem as (keys x queries); dS -> smem as (queries x keys)   (stmatrix; both warpgroups' halves)
//   warpgroup 0: dV += P^T dO;  warpgroup 1: dK += dS^T Q             (wgmma m64 n{head dim}, A and B from smem)
//   dQ_step[:, atom a] = dS K[:, atom a] for the 64-column atoms a = w, w + 2, ...   (wgmma m64 n64)
// and dQ_step goes to the producer's dQ warp, which adds it as at head dim 128. It overwrites the step's own Q/dO
// stage (dq_buffers 0, bwd_sm90_ws.cu's kDqInStage) once both warpgroups' products are done (its fp32 bytes are
// exactly the bf16 Q and dO tiles'), and the dQ warp frees the stage for the producer once its add has read it:
// shared memory at 256 is K, V 64 KB, two Q/dO stages 128 KB, P^T / dS^T / dS 24 KB; at 192 three stages
// (configs.SM90_WS_BWD_TILES). A separate dQ buffer would leave room for one stage at 256 (measured: bwd 187.8
// against 161.6 ms at (16, 16K), experiments/results/checks/wsbuf-d256-*.log, wsstage3-d256-*.log).
// Consumer barriers per step: after the P^T / dS^T / dS writes, and before dQ_step overwrites the stage (which
// also orders the next step's writes after every read of these tiles).
#pragma once
#if DKV_WIDE

namespace {

constexpr int kHalfStep = kStep / 2;  // queries of a step per warpgroup in the score products

__device__ __forceinline__ void wide_consumer_loop(float (&acc)[kHeadDimAcc / 8][4], int n_steps, int count, int wg,
                                                   int cw, int lane, unsigned char* base, unsigned sk, unsigned sv,
                                                   unsigned sq0, unsigned sdo0, unsigned sds0, const float* s_lse,
                                                   const float* s_delta, const int4* s_info, unsigned bar_full,
                                                   unsigned bar_dq_full, float scale_log2) {
    const int g = lane / 4, t4 = lane % 4;
    const int wkey0 = (cw % 4) * 16;  // this warp's first key: both warpgroups cover all 64 keys
    const int wq0 = wg * kHalfStep;   // this warpgroup's first query of a step in the score products
    const unsigned s_pt = sds0, s_dst = sds0 + kDsBytes, s_ds = sds0 + 2 * kDsBytes;
    const unsigned long long k_desc = kmajor_tile(sk, 0), v_desc = kmajor_tile(sv, 0);
    // this warpgroup's product: dV += P^T dO (0) or dK += dS^T Q (1); A (keys x queries) K-major over the queries
    const unsigned long long role_a = kmajor_tile(wg ? s_dst : s_pt, 0);
    const unsigned long long ds_desc = kmajor_tile(s_ds, 0);  // dQ's A: dS (queries x keys), K-major over the keys
    for (int i = 0; i < n_steps; ++i) {
        const int s = i % kStages;
        const unsigned q_addr = sq0 + s * kStageStride, do_addr = sdo0 + s * kStageStride;
        const float* lse = s_lse + s * kStep + wq0;
        const float* dlt = s_delta + s * kStep + wq0;
        mbar_wait(bar_full + 8 * s, (i / kStages) & 1);
        float acc_s[1][kHalfStep / 8][4], acc_dp[1][kHalfStep / 8][4];
        {
            const unsigned long long q_desc = kmajor_tile(q_addr, wq0), do_desc = kmajor_tile(do_addr, wq0);
            wgmma_fence();
#pragma unroll
            for (int st = 0; st < kHeadDim / 16; ++st)
                wgmma_ss(acc_s[0], kmajor_desc<kBlockKeys>(k_desc, st), kmajor_desc<kStep>(q_desc, st), st > 0);
            wgmma_commit();
#pragma unroll
            for (int st = 0; st < kHeadDim / 16; ++st)
                wgmma_ss(acc_dp[0], kmajor_desc<kBlockKeys>(v_desc, st), kmajor_desc<kStep>(do_desc, st), st > 0);
            wgmma_commit();
        }
        const int4 info = s_info[s];  // written before the stage's full barrier completed
        const int key_base = info.x, q_pos0 = info.y + wq0, tok7 = info.w;
        const bool need_mask = info.z != 0;
        wgmma_wait<1>();
        fence_regs(acc_s[0]);
        ws_probs_t<kHalfStep / 8, kHeadDim == 256>(acc_s[0], lse, scale_log2, need_mask, count, key_base, q_pos0,
                                                   wkey0, g, t4);  // P^T
        wgmma_wait<0>();
        fence_regs(acc_dp[0]);
        dscores_t(acc_dp[0], acc_s[0], dlt, t4);  // dS^T
        unsigned p_frag[1][kHalfStep / 16][4], ds_frag[1][kHalfStep / 16][4];
        to_a_frag<1, kHalfStep>(p_frag, acc_s);
        to_a_frag<1, kHalfStep>(ds_frag, acc_dp);

        {  // (no barrier first: the previous step's last one followed every read of these tiles)
            const int j = lane / 8, r = lane % 8;
#pragma unroll
            for (int kk = 0; kk < kHalfStep / 16; ++kk) {
                const int q16 = wq0 + 16 * kk;
                // (keys x queries): matrix j holds keys + 8 (j % 2), queries + 8 (j / 2)
                const int off_t = swizzled_offset<kBlockKeys>(wkey0 + r + 8 * (j % 2), q16 / 8 + j / 2);
                stmatrix_x4(s_pt + off_t, p_frag[0][kk]);
                stmatrix_x4(s_dst + off_t, ds_frag[0][kk]);
                // (queries x keys), transposed
                stmatrix_x4_trans(s_ds + swizzled_offset<kStep>(q16 + 8 * (j / 2) + r, wkey0 / 8 + (j % 2)),
                                  ds_frag[0][kk]);
            }
        }
        fence_async_smem();
        named_sync(kBarConsumers, kConsumerThreads);  // both halves of P^T, dS^T and dS are in place

        // dQ_step atoms first (their hand-off waits on them), then this warpgroup's dV or dK product.
        // Head dim 192 has three atoms: warpgroup 1 computes its atom 1 twice and stores it once (a branch around a
        // wgmma makes ptxas serialize them all, C7514).
        float acc_dq[2][8][4];
        const bool second = kAtoms == 4 || wg == 0;
        wgmma_fence();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned long long kn_desc =
                nmajor_tile<kBlockKeys>(sk + (second ? wg + 2 * h : wg) * kBlockKeys * 128);
#pragma unroll
            for (int st = 0; st < kBlockKeys / 16; ++st)
                wgmma_ss_nb(acc_dq[h], kmajor_desc<kStep>(ds_desc, st), nmajor_desc(kn_desc, st), st > 0);
            wgmma_commit();
        }
        {
            const unsigned long long role_b = nmajor_tile<kStep>(wg ? q_addr : do_addr);
#pragma unroll
            for (int kk = 0; kk < kStep / 16; ++kk)
                wgmma_ss_nb(acc, kmajor_desc<kBlockKeys>(role_a, kk), nmajor_desc(role_b, kk), 1);
            wgmma_commit();
        }
        // dQ_step into this step's Q/dO stage once both warpgroups' products are done with it; the dQ warp frees
        // the stage once its add has read it
        wgmma_wait<0>();
        fence_regs(acc);
        named_sync(kBarConsumers, kConsumerThreads);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            fence_regs(acc_dq[h]);
            if (h == 1 && !second) break;
            put_dq_step(base + (q_addr - sk), acc_dq[h], (wg + 2 * h) * 64, (cw % 4) * 16, g, t4, tok7);
        }
        fence_async_smem();
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_dq_full + 8 * s);
    }
}

}  // namespace
#endif  // DKV_WIDE
