// DualKV backward for Hopper, warp-specialised (sm_90a): dK, dV and dQ in ONE kernel, five products per step, with
// a deterministic dQ. What follows describes head dims 64 to 128; at 192 and 256 (DKV_WIDE) the CTA owns 64 keys, the
// two consumer warpgroups split the work by role and exchange P^T / dS^T / dS through smem, and dQ_step is handed
// over in the step's own Q/dO stage (bwd_sm90_ws_wide.cuh); the producer warpgroup, the walk and the dQ order are
// the same.
//
// CTA = one key tile (128 keys of one K/V head, keywalk.cuh's KeyTile) walking every query that sees it, 64 queries
// of one query head per step. Warpgroup 0 is the producer: warp 0 issues the TMA copies (K and V once; each step's Q
// and dO tiles into a ring of kStages stages), warp 1 stages each step's LSE and D, warp 2 writes dQ. Warpgroups 1
// and 2 (64 keys each) compute per step
//   S^T = K Q^T, dP^T = V dO^T     (wgmma, smem operands)          P^T = exp2(S^T scale - LSE), masked
//   dV += P^T dO,  dK += dS^T Q    (wgmma, P^T / dS^T from registers) dS^T = P^T (dP^T - D)
//   dS^T -> smem (stmatrix, transposed), then dQ_step = dS K          (each warpgroup one half of the head dim)
// and hand dQ_step (fp32, through smem) to the dQ warp, which adds it into ONE (H, T + 64, kHeadDim) fp32
// accumulator with bulk reduce-adds IN A FIXED ORDER: each (query head, query tile) has a counter, and a contribution
// whose rank is r waits until the counter reads r (every earlier contribution has landed), adds, then sets it to r + 1.
// Ranks (the own-first order, DUALKV_TWO_LEVEL_DQ_ORDER=own): a response's own (causal) key blocks b = 0, 1, ... come
// first (rank b), then the blocks b of the keys its group shares (rank = own blocks reaching the tile + b); a prompt's
// (or any context-free segment's) own blocks have rank b; the launcher puts every own-response tile before every
// shared-key tile. The default shared-first order (the DKV_TREE_ROOT_FIRST=1 build) ranks the shared blocks b first
// (rank b) and a response's own blocks after all of them, and the launcher puts the shared-key tiles first. Either way
// blocks stay in order within a run (dualkv/cuda/ws_schedule.py states and checks it), so a CTA only ever waits on
// CTAs launched before it. The dQ warp
// keeps one add in flight: it releases a counter once the NEXT step's add is issued (the earlier one has then
// completed), and frees the smem buffer as soon as the bulk copy has read it. The walk keeps the CTAs of a run in step:
// first every dependent segment's queries (all see the block), then the own segment's causal queries from the LAST tile
// down, so no CTA waits on one with more work. The grid is 1-D, in the CTA order below (DKV_HEAD_MAJOR). dK, dV: fp32
// in registers over the whole walk (all N responses and the GQA group), cast once.
//
// The step record is read from smem right after S^T / dP^T are issued, LSE and D after the waits on them; ncu
// (head-major build, (16, 32K): checks/ncu-ws-bwd-source-h100-20261128T0446Z.json) shows the consumers stalled on
// those reads, but they overlap the products still running: reading the step record before issuing and LSE before
// the wait measured the same (bwd 130.75 against 131.29 / 131.66 ms at (16, 32K), 16.50 against 16.43 / 16.08 at
// (8, 8K)), and D before its wait slower (134.61 ms; its registers raised the d = 128 build's spill stores from 20
// to 64 bytes, a CPU build of 8a8bc86; checks/ws-hoist-h100-20261128T0455Z.json).
// The products run in the order S^T, dP^T, dV, dQ_step, dK, so dQ_step goes to smem while dK runs (dK before dQ_step
// measured the same at (16, 32K), 132.2 against 132.4 / 130.9 ms; checks/ws-bwd-dqfirst-h100-20261127T0834Z.json).
// Issuing the next step's S^T / dP^T before this step's dQ hand-off needs them in flight across the loop's back edge,
// where ptxas serializes every wgmma (C7515); with every product waited for before the back edge it runs out of
// registers (C7511). S^T alone, issued behind dK once dQ_step is stored, with P^T kept apart from S^T's accumulator,
// compiles clean, but ran 1.8-2.2% slower at d = 128 (16, 32K) on an H200 whether dP^T then waited for S^T or queued
// behind it, with no gain at d = 64 / 96 (experiments/results/checks/s24searly-h200-20261128T2151Z.log).
//
// Tried and removed (#12): CTA pairs (clusters of two on key blocks 2p, 2p + 1; the upper CTA's dQ_step copied over
// DSMEM to the lower one, one reduce-add per pair: half the fp32 traffic into L2). Clusters cost nothing by themselves
// (66 clusters of two on 132 SMs: full occupancy; with no dQ hand-off 119.4 against 118.7 ms at (16, 32K)), but the
// sum of the two parts did: 205 ms in the lower CTA's consumer registers (each copy's latency on their path), 265 ms
// summed in smem by a producer warp, against 131 ms; with that sum skipped (wrong dQ) 134 ms, so even a free sum only
// ties (experiments/results/checks/ws-bwd-pairs-*-20261127T11*.json). The bound on any such saving, timed with wrong
// dQ: reduce-adds of half the rows (DKV_DBG_HALFRED) 5.4% faster at (16, 32K), none 9.7% (H200,
// checks/s24diag-h200-20261128T2200Z.log). Half the Q / dO bytes into the SM (DKV_DBG_HALFQDO, wrong gradients; what a
// TMA multicast of each stage to a CTA pair walking the same query tiles would save, at most) 9.2% faster at (16, 32K),
// 4.4% at (8, 8K) (checks/s24qdo-h200-20261128T2257Z.log); halved on the steps whose queries see the block fully only
// (DKV_DBG_HALFQDO=2: responses on prompt keys, 65% of the pairs) 2.7%, so most of it is the causal steps' bytes
// (checks/s24qdo2-h200-20261128T2258Z.log). The TMA multicast itself (clusters of two on adjacent key blocks of one
// run, each CTA loading half of every common step's Q / dO for both, a stage refilled once both CTAs released it;
// dQ, dK, dV bitwise equal to this build) was 29-35% slower on an H200: bwd 162.3 / 162.8 against 126.3 / 126.2 ms at
// (16, 32K), 20.4 / 20.2 against 15.1 / 15.2 at (8, 8K). Without the dQ order's waits (DKV_DBG_NOSEM) still 11-15%
// (143.4 / 144.6 against 129.3 / 128.8): multicast halves the reads from L2 but not the bytes into each SM, which is
// what the bound above halved, and the pair's shared stage ring fights the dQ chain (block b waits for b - 1 at every
// query tile, so the pair cannot keep its 3 stages ahead of both). Removed (checks/s34mc-*, s34mc2-*).
// L2 cache policies (evict_last / evict_first on the reduce-adds, evict_first on K / V, evict_last on Q / dO) moved
// nothing beyond noise (ws-bwd-l2hints-*.json).
//
// DKV_TREE=1 (prefix trees, dualkv/cuda/tree_schedule.py): segment rows are tree nodes (q_start, q_len, runs, pos)
// and a key tile (i, blk, i + 1, end) owns keys of node i, seen causally by its own queries (pos plays ctx_len's part,
// so the masks are unchanged) and fully by its descendants [i + 1, end). A query tile of node j receives its own
// blocks first, then its parent's, grandparent's, ... (nearest ancestor first): ancestor i's block b has rank
// (own blocks reaching the tile) + (A[j] - A[i] - blocks(i)) + b, with A the ancestors' key-block count stored in
// the second int of each node's context-list header; the launcher puts deeper nodes' tiles first. The dQ counters
// are indexed by the query tile's first token (the tree table has no per-segment tile offsets). With
// DKV_TREE_ROOT_FIRST=1 the order is reversed along the chain: the root's blocks first, the own blocks last, so block
// b of node i has rank A[i] + b at every tile it reaches, and the launcher puts shallower nodes' tiles first.
#include "keywalk.cuh"
#include "sm90.cuh"
#include "split_parts.cuh"
#include "tma.cuh"

using namespace dkv;

namespace {

#ifndef DKV_TREE
#define DKV_TREE 0  // 1: prefix trees (a macro, not a constexpr: the two-level cubin stays byte-identical)
#endif
#ifndef DKV_TREE_ROOT_FIRST
#define DKV_TREE_ROOT_FIRST 0  // 1: the root-first (tree) / shared-first (two-level) dQ order (ws_schedule.py)
#endif

constexpr int kStep = DKV_BLOCK_M;  // queries per step
// DKV_WIDE (head dims 192, 256; tiles of dsplit 2): CTAs of 64 keys whose two consumer warpgroups split dV and dK
// (bwd_sm90_ws_wide.cuh); otherwise 128 keys, 64 per consumer warpgroup.
#define DKV_WIDE (DKV_DSPLIT == 2)
constexpr int kBlockKeys = DKV_WIDE ? 64 : 128;
constexpr int kStages = DKV_STAGES;
constexpr int kConsumerThreads = 256;
// Tiles and accumulators have kHeadDimAcc columns (head dim 96: 128, as in the wgmma_v1 kernels, sm90.cuh); the TMA
// zero-fills the columns past the head dim, so they add nothing, and only kHeadDim columns are stored. dQ rows (smem
// and the accumulator) have kHeadDim columns: the reduce-adds move no zero columns.
constexpr int kAtoms = kHeadDimAcc / 64;
constexpr int kKeyBytes = kBlockKeys * kHeadDimAcc * 2;
constexpr int kStepBytes = kStep * kHeadDimAcc * 2;
constexpr int kDsBytes = kStep * kBlockKeys * 2;
// dQ_step rows (fp32) in smem exactly as they land in the accumulator, so ONE bulk reduce-add moves a step: the
// 16-byte chunks of a row are permuted within groups of 8 by the row's token index (chunk c at c ^ (token & 7)),
// which spreads the consumers' writes over the banks; the launcher undoes the permutation when it casts dQ.
constexpr int kDqRowBytes = kHeadDim * 4;
static_assert(kHeadDim % 32 == 0, "dQ rows of whole groups of 8 16-byte chunks");
__device__ __forceinline__ int dq_chunk(int chunk, int token) { return chunk ^ (token & 7); }
// dQ hand-off buffers: with 2 the consumers write step i + 1's dQ while the dQ warp still adds step i's; the smem
// for the second comes from dS, then single-buffered (one more consumer barrier per step).
// 0 (wide builds): no buffer of its own; each step's dQ_step (fp32, 64 x head dim: exactly the bytes of its bf16 Q
// and dO tiles) overwrites the step's own Q/dO stage once every product has read it, and the dQ warp frees the stage
// for the producer once its add has read it. That smem pays for a second Q/dO stage at head dim 256.
constexpr int kDqBuffers = DKV_DQ_BUFFERS;
constexpr bool kDqInStage = kDqBuffers == 0;
constexpr int kDsBuffers = DKV_WIDE ? 3 : 3 - kDqBuffers;  // wide: P^T, dS^T and dS
// a stage: Q then dO, adjacent when dQ_step takes their place (one bulk add reads it), else Q tiles then dO tiles
constexpr int kStageStride = kDqInStage ? 2 * kStepBytes : kStepBytes;
// dQ hand-off barriers (full / empty pairs): one per buffer, or with dQ_step in the stage one per stage. A single one
// would let the consumers complete its phase twice (the stage ring, not the dQ warp, paces them) before the dQ warp,
// still waiting on an earlier step's counter, reads the parity: it would then wait forever.
constexpr int kDqRing = kDqInStage ? kStages : kDqBuffers;
static_assert(kDqBuffers == 1 || kDqBuffers == 2 || (kDqInStage && DKV_WIDE),
              "one or two dQ buffers, or (wide builds) dQ_step in the step's Q/dO stage");
static_assert(!kDqInStage || kStep * kHeadDim * 4 == 2 * kStepBytes, "dQ_step fills exactly a Q/dO stage");
static_assert(kWarps == 8 && kStep == 64 && !kWindow &&
                  ((DKV_DSPLIT == 1 && (kHeadDim == 128 || kHeadDim == 64 || (kHeadDim == 96 && kHeadDimAcc == 128))) ||
                   (DKV_WIDE && (kHeadDim == 192 || kHeadDim == 256) && kHeadDimAcc == kHeadDim && kDqInStage)),
              "two consumer warpgroups of 64 keys (head dim 64, 96 with tiles of 128, 128) or sharing 64 keys (192, "
              "256, dQ_step in the stage), 64-query steps, no window");
// dQ_step = dS K: each consumer warpgroup computes half the head dim's columns, kDqCols from column wg * kDqCols.
// Head dim 128: B is K's 64-column atom wg, N-major. Head dim 64: half an atom (N = 32) is narrower than the N-major
// 128-byte swizzle's 64 columns, so each CTA first copies K transposed (head dim x keys, K-major over keys, two
// 64-key atoms; DKV_DQ_FROM_KT) and B is rows wg * 32 .. of that copy: a K-major operand takes any N that is a
// multiple of 8.
constexpr int kDqCols = kHeadDimAcc / 2;
#define DKV_DQ_FROM_KT (DKV_HEAD_DIM == 64)  // a macro: the head-dim-128 build keeps its exact code
constexpr int kKtBytes = DKV_DQ_FROM_KT ? kHeadDim * kBlockKeys * 2 : 0;
constexpr int kBarConsumers = 1;
// Bisection switches (DUALKV_EXTRA_DEFINES): skip the dQ counters' waits / the whole dQ hand-off; register split.
#ifndef DKV_DBG_NOSEM
#define DKV_DBG_NOSEM 0
#endif
#ifndef DKV_DBG_NODQ
#define DKV_DBG_NODQ 0
#endif
static_assert(!(kDqInStage && DKV_DBG_NODQ), "with dQ_step in the stage the dQ warp frees the stages");
#ifndef DKV_DBG_NORED  // 1: the dQ warp keeps its counters but adds nothing (wrong dQ: times the reduce-adds)
#define DKV_DBG_NORED 0
#endif
#ifndef DKV_DBG_HALFRED  // 1: each reduce-add covers half the step's rows (wrong dQ: what halving the traffic would save)
#define DKV_DBG_HALFRED 0
#endif
#ifndef DKV_DBG_HALFQDO  // 1: each step loads Q's and dO's even 64-column atoms only (wrong dQ / dK / dV: what halving
#define DKV_DBG_HALFQDO 0  // the Q / dO bytes into the SM, as a multicast to CTA pairs would, could save); 2: only the
#endif                     // steps of queries that see the block's keys fully (those a pair of key blocks shares)
static_assert(!DKV_DBG_HALFQDO || kAtoms % 2 == 0, "DKV_DBG_HALFQDO needs an even number of 64-column atoms");
#ifndef DKV_DBG_NOBAR  // 1: no barrier between dS to smem and dQ_step (wrong dQ: times the warpgroups' lockstep)
#define DKV_DBG_NOBAR 0
#endif
// 1: the dQ warp keeps one add in flight (releases a counter one step late); 0: it waits for each add to complete.
#ifndef DKV_DQ_INFLIGHT
#define DKV_DQ_INFLIGHT 1
#endif
constexpr bool kDqInFlight = DKV_DQ_INFLIGHT != 0;
// (Freeing the smem buffer before publishing the previous add measured 6% slower at (16, 32K): the adds then come
// faster than L2 absorbs them; checks/ws-bwd-dqpath-h100-20261127T0840Z.json.)
// (The consumers adding dQ_step from registers instead, red.v2.f32 with no smem round trip, unordered and spill-free,
// measured 20-25% slower on an H200: bwd 157.0 / 157.8 against 125.2 / 125.6 ms at (16, 32K), 18.5 / 18.2 against
// 15.2 / 15.1 at (8, 8K), although the hand-off moves 64 KB of smem per step and ncu puts shared memory at 78%; the
// fixed order itself costs nothing measurable: unordered bulk adds 126.2 / 126.7;
// checks/s34red-h200-20261130T0551Z.json.)
// CTA order (the spec's head_major, configs.WS_CTA_ORDERS): 0, the KV heads of a key tile adjacent (blockIdx.x =
// tile * kv_heads + head; prefix trees); 1, head-major in two parts: the table's first `first_tiles` tiles of every
// KV head in turn (blockIdx.x = head * first_tiles + tile), then its other tiles of every KV head in turn. The CTAs
// running together then sweep the query rows of ONE KV head's query heads (an eighth of the Q / dO / dQ lines at 8
// KV heads), and with the shared-first table (the shared-key tiles, the heaviest, first: first_tiles of them) every
// head's heavy tiles launch before any light own-response tile, so the light ones fill the last wave instead of the
// last KV head's heaviest tiles running alone (ws_schedule.cta_order; first_tiles = the table's length gives the
// plain head-major order; keywalk.cuh's cta_head_tile). Only the launch order changes: every counter (one query
// head) still receives its tiles in table order, and a CTA still waits only on CTAs of its own KV head launched
// before it.
#ifndef DKV_HEAD_MAJOR
#define DKV_HEAD_MAJOR 0
#endif
#ifndef DKV_PRODUCER_REGS
#define DKV_PRODUCER_REGS 24  // 32 (with 240 for the consumers: exactly the register file) hangs in setmaxnreg
#endif
#ifndef DKV_CONSUMER_REGS
#define DKV_CONSUMER_REGS 240
#endif

// Where the CTA's walk is: phase 0 visits dependent segments (src) in order, query tiles ascending; phase 1 the own
// segment's query tiles from the last down to the block's first; query heads innermost.
struct StepCursor {
    int phase, src, qt, h;
    bool valid;
};

struct WsWalk {
    KeyTile kt;
    const int* segments;
    int group, key0, count, qt_lo;
    bool own_response;

    __device__ __forceinline__ int n_qt(int seg) const { return (load_segment(segments, seg).q_len + kStep - 1) / kStep; }
    __device__ __forceinline__ int own_top() const { return n_qt(kt.own_seg) - 1; }

    __device__ __forceinline__ StepCursor first() const {
        if (kt.dep_end > kt.dep_begin) return StepCursor{0, kt.dep_begin, 0, 0, true};
        return StepCursor{1, kt.own_seg, own_top(), 0, kt.own_seg >= 0 && own_top() >= qt_lo};
    }
    __device__ __forceinline__ StepCursor next(StepCursor c) const {
        if (++c.h < group) return c;
        c.h = 0;
        if (c.phase == 0) {
            if (++c.qt < n_qt(c.src)) return c;
            c.qt = 0;
            if (++c.src < kt.dep_end) return c;
            c.phase = 1;
            c.src = kt.own_seg;
            if (kt.own_seg < 0) {
                c.valid = false;
                return c;
            }
            c.qt = own_top();
            c.valid = c.qt >= qt_lo;
            return c;
        }
        c.valid = --c.qt >= qt_lo;
        return c;
    }
};

// Steps of the walk (the cursor's count): the consumers loop this many times and take each step's geometry from the
// stage record the LSE/D warp writes, so they carry no walk state across the loop (it spilled at 240 registers).
__device__ __forceinline__ int walk_steps(const WsWalk& w) {
    int n = 0;
    for (int src = w.kt.dep_begin; src < w.kt.dep_end; ++src) n += max(w.n_qt(src), 1);  // first() visits qt 0
    if (w.kt.own_seg >= 0) n += max(0, w.own_top() - w.qt_lo + 1);
    return n * w.group;
}

// DKV_TREE: the key blocks of a node's proper ancestors (A; tree_schedule.rank_base), the second int of its
// context-list header (seg.ctx_start is the header's int2 index in a tree table).
__device__ __forceinline__ int tree_rank_base(const int* segments, const Segment& seg) {
    return segments[2 * seg.ctx_start + 1];
}

__device__ __forceinline__ WsWalk make_ws_walk(const int* key_tiles, int tile, const int* segments, int group,
                                               int& key_token0) {
    const int4 kt4 = reinterpret_cast<const int4*>(key_tiles)[tile];
    WsWalk w;
    w.kt = KeyTile{kt4.x, kt4.y, kt4.z, kt4.w};
    w.segments = segments;
    w.group = group;
    w.key0 = w.kt.blk * kBlockKeys;
    const bool has_own = w.kt.own_seg >= 0;
    const Segment key_seg = load_segment(segments, has_own ? w.kt.own_seg : w.kt.dep_begin);
    key_token0 = (has_own ? key_seg.q_start : key_seg.ctx_start) + w.key0;
    w.count = min(kBlockKeys, (has_own ? key_seg.q_len : key_seg.ctx_len) - w.key0);
    w.own_response = has_own && key_seg.ctx_len > 0;  // a response's own keys (rank first), or keys a group shares
    w.qt_lo = w.key0 / kStep;
    return w;
}

// DKV_TREE: the blocks of the nodes strictly between a dependent node j and the key's node i (A[j] - A[i] -
// blocks(i)), added by the dQ warp to a dependent step's rank; tree_rank_skip is A[i] + blocks(i).
__device__ __forceinline__ int tree_rank_skip(const WsWalk& w) {
    const Segment key_seg = load_segment(w.segments, w.kt.own_seg);
    return tree_rank_base(w.segments, key_seg) + (key_seg.q_len + kBlockKeys - 1) / kBlockKeys;
}

// What every role needs to know about one step.
struct StepInfo {
    int seg, tok0, n, head, q_pos0, key_base, rank;
    bool own, need_mask;
};

__device__ __forceinline__ StepInfo step_info(const WsWalk& w, const StepCursor& c, int kv_head) {
    StepInfo si;
    si.seg = c.src;
    const Segment seg = load_segment(w.segments, c.src);
    si.own = c.phase == 1;
    const int pos0 = c.qt * kStep;
    si.tok0 = seg.q_start + pos0;
    si.n = min(kStep, seg.q_len - pos0);
    si.head = kv_head * w.group + c.h;
    si.q_pos0 = seg.ctx_len + pos0;
    si.key_base = (si.own ? seg.ctx_len : 0) + w.key0;
    si.need_mask = w.count < kBlockKeys || (si.own && si.key_base + kBlockKeys - 1 > si.q_pos0);
    // a dependent's tile first receives its own causal blocks 0 .. (last row of the tile) / kBlockKeys
    si.rank = w.kt.blk + (si.own ? 0 : (c.qt * kStep + kStep - 1) / kBlockKeys + 1);
    return si;
}

// One dQ_step fragment (m64 n8 kN8 fp32, this warp's 16 rows from row0, columns from col0) into the dQ_step rows
// at dst in the accumulator's chunk order (dq_chunk); columns past the head dim (128-column tiles at 96) skipped.
// Head dim 256: rows g and g + 8 (row0 a multiple of 8; every caller's is of 16) share the permutation key and col0 is
// a multiple of 32 (whole groups of 8 chunks; every caller's is of 64), so only the low three bits of a chunk index, 2
// (nt % 4) + t4 / 2, are permuted: four offsets a step, the rest immediates. With the wide builds' unmasked P^T path
// (bwd_sm90_ws_wide.cuh) it cut the d = 256 build's spills from 68 / 72 bytes to 24 / 24 and its backward by 2-2.4%
// (H200, (8, 8K) / (16, 16K): 41.12 / 147.08 and 40.92 / 146.84 ms against 41.94 / 150.69 and 41.96 / 150.31); at 128
// the four-offset form measured the same (126.94 / 126.56 against 126.86 / 127.33 ms at (16, 32K)) and at 192, both
// changes together 0-1% slower (33.59 / 33.45 against 33.17 / 33.18 ms at (8, 8K)), so those builds keep the per-store
// form (experiments/results/checks/s23put-h200-20261128T1832Z.log).
template <int kN8>
__device__ __forceinline__ void put_dq_step(unsigned char* dst, const float (&acc)[kN8][4], int col0, int row0, int g,
                                            int t4, int tok7) {
    if constexpr (kHeadDim == 256) {
        const int key = (tok7 + g) & 7;
        unsigned char* lo = dst + (row0 + g) * kDqRowBytes + col0 * 4 + (t4 & 1) * 8;
        int chunk_off[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) chunk_off[k] = ((2 * k + t4 / 2) ^ key) * 16;
#pragma unroll
        for (int nt = 0; nt < kN8; ++nt) {
            unsigned char* at = lo + chunk_off[nt % 4] + (nt / 4) * 128;
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                *reinterpret_cast<float2*>(at + 8 * hh * kDqRowBytes) =
                    make_float2(acc[nt][2 * hh], acc[nt][2 * hh + 1]);
        }
        return;
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int row = row0 + g + 8 * hh;
#pragma unroll
        for (int nt = 0; nt < kN8; ++nt) {
            if (kHeadDimAcc > kHeadDim && col0 + nt * 8 >= kHeadDim) continue;  // a zero column
            const int col = col0 + nt * 8 + 2 * t4;  // fp32 column; chunk col / 4, offset col % 4
            *reinterpret_cast<float2*>(dst + row * kDqRowBytes + (dq_chunk(col / 4, tok7 + row) * 4 + col % 4) * 4) =
                make_float2(acc[nt][2 * hh], acc[nt][2 * hh + 1]);
        }
    }
}

// P^T of one step in place (both consumer layouts): acc holds S^T of this warp's 16 keys (first key wkey0 of the
// block) x 8 kN8 queries; masked are keys past the block's count and the causal diagonal (need_mask: the block
// reaches it), and rows past the segment have LSE = +inf, so P = 0. q_pos0 is the first query's position.
// kSplitMask: a step that needs no mask takes an unmasked copy of the exp2 loop, rather than a predicated compare and
// select on every element of every step. H200, bwd at (28, 4K) / (8, 8K) / (16, 32K), own processes: 26.20 / 15.54 /
// 124.62 and 26.41 / 15.68 / 124.75 ms against 26.86 / 16.05 / 129.17 and 27.45 / 16.23 / 129.54
// (experiments/results/checks/s23mask-h200-20261128T1802Z.log). Every build but the wide d = 192 one takes it
// (see put_dq_step for the wide builds' numbers).
// LSE and D by 8-byte pair loads here and in dscores_t (16 fewer LDS a step) ran 3% slower at d = 128 (bwd (16, 32K):
// 131.15 / 130.67 against 126.88 / 126.86 ms) and the same at 256, so both keep the 4-byte loads
// (experiments/results/checks/s24lse-h200-20261128T2131Z.log). A quarter or three eighths of the exponentials on the
// FMA pipe (a degree-3 fit of 2^f after a round-to-nearest split), off MUFU, measured the same: (16, 32K) means 125.85
// and 125.40 against 125.31 ms, so MUFU does not bound this phase (checks/s24poly-h200-20261128T2156Z.log).
template <int kN8, bool kSplitMask>
__device__ __forceinline__ void ws_probs_t(float (&acc)[kN8][4], const float* lse, float scale_log2, bool need_mask,
                                           int count, int key_base, int q_pos0, int wkey0, int g, int t4) {
    if constexpr (kSplitMask) {
        if (need_mask) {
            ws_probs_t<kN8, false>(acc, lse, scale_log2, true, count, key_base, q_pos0, wkey0, g, t4);
        } else {
            ws_probs_t<kN8, false>(acc, lse, scale_log2, false, count, key_base, q_pos0, wkey0, g, t4);
        }
        return;
    }
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int q = nt * 8 + 2 * t4 + (e & 1);
            const int kl = wkey0 + g + 8 * (e >> 1);
            float p = fast_exp2(fmaf(acc[nt][e], scale_log2, -lse[q]));
            if (need_mask && (kl >= count || key_base + kl > q_pos0 + q)) p = 0.f;
            acc[nt][e] = p;
        }
}

// Split key tiles (split_parts.cuh): one CTA's slot holds dK and dV in every consumer (the wide builds: one role's
// accumulator), 4 floats per 8 tile columns per consumer thread.
constexpr int kPartArrays = DKV_WIDE ? 1 : 2;
constexpr long long kPartFloats = (long long)kPartArrays * (kHeadDimAcc / 8) * 4 * kConsumerThreads;

}  // namespace

#include "bwd_sm90_ws_wide.cuh"

extern "C" __global__ void __launch_bounds__(kConsumerThreads + 128, 1) dualkv_bwd_sm90_ws(
    const __grid_constant__ TmaDesc tm_q, const __grid_constant__ TmaDesc tm_do, const __grid_constant__ TmaDesc tm_kd,
    const __grid_constant__ TmaDesc tm_vd, const __grid_constant__ TmaDesc tm_kc, const __grid_constant__ TmaDesc tm_vc,
    const float* __restrict__ lse2, const float* __restrict__ delta, long long lse_sh, elem_t* __restrict__ dkc,
    long long dkc_st, long long dkc_sh, elem_t* __restrict__ dvc, long long dvc_st, long long dvc_sh,
    elem_t* __restrict__ dkd, long long dkd_st, long long dkd_sh, elem_t* __restrict__ dvd, long long dvd_st,
    long long dvd_sh, float* __restrict__ dq_acc, long long dqa_head, int* __restrict__ sems, int n_qtiles,
    const int* __restrict__ qtile_offset, const int* __restrict__ segments, const int* __restrict__ key_tiles,
    int kv_heads, int first_tiles, int group_size, float scale_log2, float scale, float* __restrict__ part_acc,
    int* __restrict__ part_sems, int parts, int partial_rows) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* base = align_1024(smem_raw);
    const unsigned sk = smem_addr(base), sv = sk + kKeyBytes;
    const unsigned skt = sv + kKeyBytes;                    // K transposed (head dim 64 only: kKtBytes)
    const unsigned sq0 = skt + kKtBytes;                    // Q stage s at sq0 + s * kStageStride
    const unsigned sdo0 = sq0 + (kDqInStage ? kStepBytes : kStages * kStepBytes);  // dO stage s, + s * kStageStride
    const unsigned sds0 = sq0 + 2 * kStages * kStepBytes;   // dS (rows = queries, K-major over keys)
    const unsigned sdq0 = sds0 + kDsBuffers * kDsBytes;     // dQ_step fp32, kHeadDim wide; buffer b at + b * kStep rows
    float* s_lse = reinterpret_cast<float*>(base + (sdq0 - sk) + kDqBuffers * kStep * kDqRowBytes);  // [kStages][kStep]
    float* s_delta = s_lse + kStages * kStep;
    // per stage: (key_base, q_pos0, need_mask, token & 7 of the step's first row) for the consumers
    int4* s_info = reinterpret_cast<int4*>(s_delta + kStages * kStep);
    const unsigned bar0 = smem_addr(s_info + kStages);
    const unsigned bar_kv = bar0, bar_full = bar0 + 8, bar_empty = bar0 + 8 + 8 * kStages;
    const unsigned bar_dq_full = bar0 + 8 + 16 * kStages, bar_dq_empty = bar_dq_full + 8 * kDqRing;

    int key_token0;
    const int2 cta = cta_head_tile(kv_heads, first_tiles, DKV_HEAD_MAJOR);
    const int kv_head = cta.x;
    const WsWalk w = make_ws_walk(key_tiles, cta.y, segments, group_size, key_token0);
    const bool has_own = w.kt.own_seg >= 0;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        mbar_init(bar_kv, 1);
        for (int s = 0; s < kStages; ++s) {
            mbar_init(bar_full + 8 * s, 2);       // the TMA thread (with its bytes) and the LSE/D warp
            mbar_init(bar_empty + 8 * s, kDqInStage ? 1 : kWarps);  // the dQ warp, or every consumer warp's lane 0
        }
        for (int b = 0; b < kDqRing; ++b) {
            mbar_init(bar_dq_full + 8 * b, kWarps);
            mbar_init(bar_dq_empty + 8 * b, 1);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (warp < 4) {  // ---------------------------------------------------------------------------- producer
        regs_dealloc<DKV_PRODUCER_REGS>();
        if (warp == 0 && lane == 0) {  // TMA: K and V once, then each step's Q and dO
            const TmaDesc* tk = has_own ? &tm_kd : &tm_kc;
            const TmaDesc* tv = has_own ? &tm_vd : &tm_vc;
            mbar_arrive_expect_tx(bar_kv, 2 * kKeyBytes);
#pragma unroll
            for (int a = 0; a < kAtoms; ++a) {
                tma_load_3d(sk + a * kBlockKeys * 128, tk, a * 64, kv_head, key_token0, bar_kv);
                tma_load_3d(sv + a * kBlockKeys * 128, tv, a * 64, kv_head, key_token0, bar_kv);
            }
            int i = 0;
            for (StepCursor c = w.first(); c.valid; c = w.next(c), ++i) {
                const int s = i % kStages;
                if (i >= kStages) mbar_wait(bar_empty + 8 * s, ((i / kStages) + 1) & 1);
                const StepInfo si = step_info(w, c, kv_head);
                const bool half_qdo = DKV_DBG_HALFQDO == 1 || (DKV_DBG_HALFQDO == 2 && !si.own);
                mbar_arrive_expect_tx(bar_full + 8 * s, (half_qdo ? 1 : 2) * kStepBytes);
#pragma unroll
                for (int a = 0; a < kAtoms; ++a) {
                    if (half_qdo && a % 2) continue;
                    tma_load_3d(sq0 + s * kStageStride + a * kStep * 128, &tm_q, a * 64, si.head, si.tok0,
                                bar_full + 8 * s);
                    tma_load_3d(sdo0 + s * kStageStride + a * kStep * 128, &tm_do, a * 64, si.head, si.tok0,
                                bar_full + 8 * s);
                }
            }
        } else if (warp == 1) {  // LSE (log2) and D of each step's rows; rows past the segment: P = 0, D = 0
            int i = 0;
            for (StepCursor c = w.first(); c.valid; c = w.next(c), ++i) {
                const int s = i % kStages;
                if (i >= kStages) mbar_wait(bar_empty + 8 * s, ((i / kStages) + 1) & 1);
                const StepInfo si = step_info(w, c, kv_head);
#pragma unroll
                for (int r = lane; r < kStep; r += 32) {
                    const long long idx = si.head * lse_sh + si.tok0 + r;
                    s_lse[s * kStep + r] = r < si.n ? lse2[idx] : kInf;
                    s_delta[s * kStep + r] = r < si.n ? delta[idx] : 0.f;
                }
                if (lane == 0) s_info[s] = make_int4(si.key_base, si.q_pos0, si.need_mask ? 1 : 0, si.tok0 & 7);
                __syncwarp();
                if (lane == 0) mbar_arrive(bar_full + 8 * s);
            }
        } else if (warp == 2 && !DKV_DBG_NODQ) {  // dQ: fixed-order bulk reduce-adds into the accumulator
            int* pending = nullptr;  // the counter of the add in flight, released once it has completed
            int pending_rank = 0;
            int i = 0;
            for (StepCursor c = w.first(); c.valid; c = w.next(c), ++i) {
                StepInfo si = step_info(w, c, kv_head);
#if DKV_TREE_ROOT_FIRST && DKV_TREE  // A[key node] + block, re-read per step: a value live across the loop spills
                si.rank = tree_rank_base(segments, load_segment(segments, w.kt.own_seg)) + w.kt.blk;
#elif DKV_TREE_ROOT_FIRST  // two-level shared-first: block b of the shared keys, own blocks after all ctx_len's
                si.rank = w.kt.blk + (si.own ? (si.q_pos0 - c.qt * kStep + kBlockKeys - 1) / kBlockKeys : 0);
#else
                if (DKV_TREE && !si.own)  // per step: a value live across the loop spills at 24 registers
                    si.rank += tree_rank_base(segments, load_segment(segments, si.seg)) - tree_rank_skip(w);
#endif
#if DKV_TREE  // one counter per (head, first token of the query tile)
                int* sem = sems + si.head * (long long)n_qtiles + si.tok0;
#else
                int* sem = sems + si.head * (long long)n_qtiles + qtile_offset[si.seg] + c.qt;
#endif
                const int b = i % kDqRing;
                const unsigned sdq = kDqInStage ? sq0 + (i % kStages) * kStageStride : sdq0 + b * kStep * kDqRowBytes;
                mbar_wait(bar_dq_full + 8 * b, (i / kDqRing) & 1);
                if (lane == 0) {
                    if (!DKV_DBG_NOSEM) {
                        wait_flag(sem, si.rank);
                        fence_async_global();  // the add below (async proxy) after the acquire
                    }
                    if (!DKV_DBG_NORED)
                        bulk_reduce_add_f32(dq_acc + si.head * dqa_head + (long long)si.tok0 * kHeadDim, sdq,
                                            (DKV_DBG_HALFRED ? (si.n + 1) / 2 : si.n) * kDqRowBytes);
                    bulk_commit();
                    if (kDqInFlight && pending) {  // the previous add has completed: publish it
                        bulk_wait<1>();
                        fence_async_global();
                        if (!DKV_DBG_NOSEM) st_release(pending, pending_rank + 1);
                    }
                    if (kDqInFlight) {
                        bulk_wait_read<0>();  // the smem buffer has been read
                        pending = sem;
                        pending_rank = si.rank;
                    } else {
                        bulk_wait<0>();
                        fence_async_global();
                        if (!DKV_DBG_NOSEM) st_release(sem, si.rank + 1);
                    }
                    // the stage goes back to the producer (dQ_step in the stage), or the buffer to the consumers
                    mbar_arrive(kDqInStage ? bar_empty + 8 * (i % kStages) : bar_dq_empty + 8 * b);
                }
                __syncwarp();
            }
            if (lane == 0 && pending) {
                bulk_wait<0>();
                fence_async_global();
                if (!DKV_DBG_NOSEM) st_release(pending, pending_rank + 1);
            }
        }
        return;
    }

    // ---------------------------------------------------------------------------------------------- consumers
    regs_alloc<DKV_CONSUMER_REGS>();
    const int ct = threadIdx.x - 128;
    const int cw = ct / 32;                                  // consumer warp 0..7
    const int wg = __shfl_sync(0xffffffff, cw / 4, 0);      // its warpgroup (64 keys each)
    const int g = lane / 4, t4 = lane % 4;
    int row;  // the CTA's table row, found again after the walk (cheap): keeping it live across the loop cost registers
#if DKV_WIDE
    {
        float acc[kHeadDimAcc / 8][4];  // warpgroup 0: dV; warpgroup 1: dK (unscaled)
        zero_acc(acc);
        mbar_wait(bar_kv, 0);
        wide_consumer_loop(acc, walk_steps(w), w.count, wg, cw, lane, base, sk, sv, sq0, sdo0, sds0, s_lse, s_delta,
                           s_info, bar_full, bar_dq_full, scale_log2);
        row = cta_head_tile(kv_heads, first_tiles, DKV_HEAD_MAJOR, block_index_again()).y;
        if (row < partial_rows) {  // a split key tile (split_parts.cuh)
            part_put<kHeadDimAcc / 8, kConsumerThreads>(part_acc + ((long long)row * kv_heads + kv_head) * kPartFloats,
                                                        acc, 0, ct);
            if (!part_last(part_sems + (long long)(row / parts) * kv_heads + kv_head, parts, ct,
                           reinterpret_cast<volatile int*>(s_lse), [] { named_sync(kBarConsumers, kConsumerThreads); }))
                return;
            part_sum<kHeadDimAcc / 8, kConsumerThreads>(
                part_acc + ((long long)(row - row % parts) * kv_heads + kv_head) * kPartFloats, kv_heads * kPartFloats,
                parts, acc, 0, ct);
        }
        named_sync(kBarConsumers, kConsumerThreads);  // K and V are no longer read: dK into K's tile, dV into V's
        const float acc_scale = wg ? scale : 1.f;
        unsigned char* tile = base + (wg ? 0 : kKeyBytes);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = (cw % 4) * 16 + g + 8 * hh;
#pragma unroll
            for (int nt = 0; nt < kHeadDim / 8; ++nt)
                *reinterpret_cast<unsigned*>(tile + swizzled_offset<kBlockKeys>(r, nt) + t4 * 4) =
                    pack2(acc[nt][2 * hh] * acc_scale, acc[nt][2 * hh + 1] * acc_scale);
        }
    }
#else
    const int wkey0 = wg * 64 + (cw % 4) * 16;              // this warp's first key in the block
    const unsigned long long k_desc = kmajor_tile(sk, wg * 64), v_desc = kmajor_tile(sv, wg * 64);
#if DKV_DQ_FROM_KT
    const unsigned long long kn_desc = kmajor_tile(skt, wg * kDqCols);  // dQ's B: rows of K^T (DKV_DQ_FROM_KT)
#else
    const unsigned long long kn_desc = nmajor_tile<kBlockKeys>(sk + wg * kBlockKeys * 128);  // K atom wg as N-major B
#endif

    float acc_dk[kHeadDimAcc / 8][4], acc_dv[kHeadDimAcc / 8][4];
    zero_acc(acc_dk);
    zero_acc(acc_dv);
    unsigned p_frag[1][kStep / 16][4], ds_frag[1][kStep / 16][4];

    mbar_wait(bar_kv, 0);
#if DKV_DQ_FROM_KT
    {  // K^T: element (key, d) of the K tile to (d, key), once per CTA
        for (int idx = ct; idx < kBlockKeys * kHeadDim; idx += kConsumerThreads) {
            const int key = idx / kHeadDim, d = idx % kHeadDim;
            *reinterpret_cast<elem_t*>(base + (skt - sk) + swizzled_offset<kHeadDim>(d, key / 8) + (key % 8) * 2) =
                *reinterpret_cast<const elem_t*>(base + swizzled_offset<kBlockKeys>(key, d / 8) + (d % 8) * 2);
        }
        fence_async_smem();
        named_sync(kBarConsumers, kConsumerThreads);
    }
#endif
    float acc_s[1][kStep / 8][4], acc_dp[1][kStep / 8][4];
    // S^T = K Q^T and dP^T = V dO^T of step i (two commit groups).
    auto issue_sdp = [&](int i) {
        const int s = i % kStages;
        mbar_wait(bar_full + 8 * s, (i / kStages) & 1);
        const unsigned long long q_desc = kmajor_tile(sq0 + s * kStepBytes, 0);
        const unsigned long long do_desc = kmajor_tile(sdo0 + s * kStepBytes, 0);
        wgmma_fence();
#pragma unroll
        for (int st = 0; st < kHeadDim / 16; ++st)
            wgmma_ss(acc_s[0], kmajor_desc<kBlockKeys>(k_desc, st), kmajor_desc<kStep>(q_desc, st), st > 0);
        wgmma_commit();
#pragma unroll
        for (int st = 0; st < kHeadDim / 16; ++st)
            wgmma_ss(acc_dp[0], kmajor_desc<kBlockKeys>(v_desc, st), kmajor_desc<kStep>(do_desc, st), st > 0);
        wgmma_commit();
    };
    const int n_steps = walk_steps(w), count = w.count;
    for (int i = 0; i < n_steps; ++i) {
        const int s = i % kStages;
        const unsigned q_addr = sq0 + s * kStepBytes, do_addr = sdo0 + s * kStepBytes;
        const float* lse = s_lse + s * kStep;
        const float* dlt = s_delta + s * kStep;
        issue_sdp(i);
        const int4 info = s_info[s];  // written before the stage's full barrier completed
        const int key_base = info.x, q_pos0 = info.y, tok7 = info.w;  // tok7: the dQ rows' chunk permutation key
        const bool need_mask = info.z != 0;
        wgmma_wait<1>();
        fence_regs(acc_s[0]);

        ws_probs_t<kStep / 8, true>(acc_s[0], lse, scale_log2, need_mask, count, key_base, q_pos0, wkey0, g, t4);
        to_a_frag<1, kStep>(p_frag, acc_s);
        const unsigned long long don_desc = nmajor_tile<kStep>(do_addr), qn_desc = nmajor_tile<kStep>(q_addr);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kStep / 16; ++kk) wgmma_rs(acc_dv, p_frag[0][kk], nmajor_desc(don_desc, kk));  // dV += P^T dO
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(acc_dp[0]);
        dscores_t(acc_dp[0], acc_s[0], dlt, t4);  // dS^T
        to_a_frag<1, kStep>(ds_frag, acc_dp);

        // dS (queries x keys) into smem, K-major over keys: this warp's 16 keys x 64 queries, transposed.
        const unsigned sds = sds0 + (i % kDsBuffers) * kDsBytes;
#pragma unroll
        for (int kk = 0; kk < kStep / 16; ++kk) {
            const int j = lane / 8, r = lane % 8;
            const int q = 16 * kk + 8 * (j / 2) + r;
            stmatrix_x4_trans(sds + swizzled_offset<kStep>(q, wkey0 / 8 + (j % 2)), ds_frag[0][kk]);
        }
        fence_async_smem();
        if (!DKV_DBG_NOBAR) named_sync(kBarConsumers, kConsumerThreads);  // both warpgroups' dS is in place

        float acc_dq[kDqCols / 8][4];  // dQ_step[:, kDqCols wg ..] = dS K[:, that half]
        const unsigned long long ds_desc = kmajor_tile(sds, 0);
        wgmma_fence();
#pragma unroll
        for (int st = 0; st < kBlockKeys / 16; ++st)
#if DKV_DQ_FROM_KT
            wgmma_ss(acc_dq, kmajor_desc<kStep>(ds_desc, st), kmajor_desc<kHeadDim>(kn_desc, st), st > 0);
#else
            wgmma_ss_nb(acc_dq, kmajor_desc<kStep>(ds_desc, st), nmajor_desc(kn_desc, st), st > 0);
#endif
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < kStep / 16; ++kk) wgmma_rs(acc_dk, ds_frag[0][kk], nmajor_desc(qn_desc, kk));  // dK += dS^T Q
        wgmma_commit();
        wgmma_wait<1>();  // dQ_step (and dV) complete; dK runs while dQ_step goes to smem
        fence_regs(acc_dq);

        const int b = i % kDqBuffers;
        const unsigned sdq = sdq0 + b * kStep * kDqRowBytes;
        if (i >= kDqBuffers && !DKV_DBG_NODQ)  // the dQ warp has read this buffer's previous step
            mbar_wait(bar_dq_empty + 8 * b, ((i / kDqBuffers) + 1) & 1);
        put_dq_step(base + (sdq - sk), acc_dq, wg * kDqCols, (cw % 4) * 16, g, t4, tok7);
        fence_async_smem();
        __syncwarp();
        if (lane == 0 && !DKV_DBG_NODQ) mbar_arrive(bar_dq_full + 8 * b);
        wgmma_wait<0>();
        fence_regs(acc_dk);
        fence_regs(acc_dv);
        fence_regs(p_frag[0]);
        fence_regs(ds_frag[0]);
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_empty + 8 * s);  // Q, dO, LSE, D of this stage are no longer read
        if (kDsBuffers == 1) named_sync(kBarConsumers, kConsumerThreads);  // both warpgroups done reading dS
    }

    row = cta_head_tile(kv_heads, first_tiles, DKV_HEAD_MAJOR, block_index_again()).y;
    if (row < partial_rows) {  // a split key tile (split_parts.cuh)
        float* slot = part_acc + ((long long)row * kv_heads + kv_head) * kPartFloats;
        part_put<kHeadDimAcc / 8, kConsumerThreads>(slot, acc_dk, 0, ct);
        part_put<kHeadDimAcc / 8, kConsumerThreads>(slot, acc_dv, 1, ct);
        if (!part_last(part_sems + (long long)(row / parts) * kv_heads + kv_head, parts, ct,
                       reinterpret_cast<volatile int*>(s_lse), [] { named_sync(kBarConsumers, kConsumerThreads); }))
            return;
        const float* slot0 = part_acc + ((long long)(row - row % parts) * kv_heads + kv_head) * kPartFloats;
        part_sum<kHeadDimAcc / 8, kConsumerThreads>(slot0, kv_heads * kPartFloats, parts, acc_dk, 0, ct);
        part_sum<kHeadDimAcc / 8, kConsumerThreads>(slot0, kv_heads * kPartFloats, parts, acc_dv, 1, ct);
    }
    // dK (scaled) and dV: swizzled into the K / V tiles (no longer read once every consumer is here), then coalesced
    // 16-byte stores of the block's valid rows.
    named_sync(kBarConsumers, kConsumerThreads);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = wkey0 + g + 8 * hh;
#pragma unroll
        for (int nt = 0; nt < kHeadDim / 8; ++nt) {
            const int off = swizzled_offset<kBlockKeys>(r, nt) + t4 * 4;
            *reinterpret_cast<unsigned*>(base + off) = pack2(acc_dk[nt][2 * hh] * scale, acc_dk[nt][2 * hh + 1] * scale);
            *reinterpret_cast<unsigned*>(base + kKeyBytes + off) = pack2(acc_dv[nt][2 * hh], acc_dv[nt][2 * hh + 1]);
        }
    }
#endif
    named_sync(kBarConsumers, kConsumerThreads);
    int token0_again;  // the walk again (cheap), for the same reason
    const WsWalk we = make_ws_walk(key_tiles, row, segments, group_size, token0_again);
    const bool own_keys = we.kt.own_seg >= 0;
    const Segment key_seg = load_segment(segments, own_keys ? we.kt.own_seg : we.kt.dep_begin);
    const long long row0 = own_keys ? key_seg.q_start + we.key0 : key_seg.ctx_start + we.key0;
    elem_t* dk_dst = own_keys ? dkd + row0 * dkd_st + kv_head * dkd_sh : dkc + row0 * dkc_st + kv_head * dkc_sh;
    elem_t* dv_dst = own_keys ? dvd + row0 * dvd_st + kv_head * dvd_sh : dvc + row0 * dvc_st + kv_head * dvc_sh;
    const long long dk_st = own_keys ? dkd_st : dkc_st, dv_st = own_keys ? dvd_st : dvc_st;
    for (int idx = ct; idx < kBlockKeys * kChunksPerRow; idx += kConsumerThreads) {
        const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
        if (r >= we.count) continue;
        const int off = swizzled_offset<kBlockKeys>(r, c);
        *reinterpret_cast<uint4*>(dk_dst + r * dk_st + c * 8) = *reinterpret_cast<const uint4*>(base + off);
        *reinterpret_cast<uint4*>(dv_dst + r * dv_st + c * 8) = *reinterpret_cast<const uint4*>(base + kKeyBytes + off);
    }
}
