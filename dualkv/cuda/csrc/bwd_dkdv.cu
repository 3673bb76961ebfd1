// DualKV backward, dK and dV: key-block parallel, deterministic, no atomics.
//
// A CTA owns one key block (kBlockKeys keys) of one K/V head and walks every query that can see it:
//   * the queries of the segment that owns the keys (causal: positions >= the block's first key), and
//   * every query of every segment that uses these keys as its context (the N responses of a prompt group) —
//     for them the block is fully visible (up to a sliding window).
// Its dK/dV accumulate in fp32 registers over all of them and over the kGroup query heads sharing the K/V head
// (the GQA reduction), and are cast once at the end. So the N sequences' shared-context gradients are summed in
// fp32, in a fixed order, by exactly one CTA.
//
// Per query tile (kBlockM positions, one query head), with the warps split over keys (16 per warp; with DKV_QWARPS=2
// 32 keys x half the queries, P^T and dS^T through smem, see below):
//   S^T = K Q^T, P^T = exp(S^T * scale - LSE), dP^T = V dO^T, dS^T = P^T * (dP^T - D),
//   dV += P^T dO, dK += dS^T Q   (dK *= softmax_scale at the end).
// Query rows beyond a segment get LSE = +inf, so their P is exactly 0.
//
// With DKV_DQ_ATOMIC (the non-deterministic mode, head dims <= 128) the kernel also computes this step's
// dQ = dS K through a transposed dS tile in smem and adds it with atomics, as FlashAttention-2 does, into an fp32
// accumulator in fragment order (dualkv/cuda/dq_layout.py); otherwise dQ comes from the separate, deterministic bwd_dq
// kernel.
//
// DKV_DQ_ORDERED (deterministic, five products per step, no window) computes dQ = dS K the same way but adds it in a
// FIXED ORDER, as the warp-specialised Hopper backward does (dualkv/cuda/ws_schedule.py states the walk, the ranks
// and the launch order, with this kernel's step and key block as its Geometry): every (query head, query tile of
// kBlockM rows) has a counter, and a contribution of rank r waits until it reads r, adds, then sets it to r + 1. The
// accumulator is the atomic mode's (fragment order). The walk visits the dependents'
// tiles, then the own tiles from the last down (heads innermost), so the CTAs of a run stay one step apart; the grid
// is 1-D, key tile major and K/V head minor, and the launcher orders the key tiles so that a CTA only ever waits on
// CTAs launched before it. A CTA releases a step's counter one step late (after the next step's products, when its
// adds have long landed), so it never stalls on its own adds. With DKV_TREE (prefix trees, the ordered mode only:
// segment rows are tree nodes and a key tile's dependents are the node's descendants, dualkv/cuda/tree_schedule.py)
// a dependent's rank also counts the blocks of the nodes between it and the key's node (bwd_sm90_ws.cu's tree
// ranks), and the counters are indexed by the query tile's first token; DKV_TREE_ROOT_FIRST=1 takes the root-first
// order (bwd_sm90_ws.cu).
// (An order-free deterministic alternative, int64 fixed-point adds at a per-row unit, measured 9-20% slower than this
// order on an H200: the dQ adds run near L2's atomic throughput and 8-byte adds double their bytes; 32-bit ones would
// at best match the atomic mode, at a coarser grid. experiments/results/checks/s41-fixed-dq-*.json. Two rank chains,
// rank r into fp32 accumulator r % 2 so that block b waits on b - 2, measured 1-4% slower: checks/s41e-dq-chains-*.
// The waits themselves cost 1-2% on an H200, 1.6-2.4% with the barrier after them (DKV_DBG_NOWAIT below): the rest of
// the gap to the atomic dQ at large P is the ordered mode's other structure, checks/s41f-dq-waits-*.)
//
// Tile macros: DKV_BLOCK_M (query positions per step), DKV_DSPLIT (warps sharing 16 keys, each owning
// HEAD_DIM / DKV_DSPLIT columns of dK/dV), DKV_STAGES (1 or 2 smem buffers of the Q/dO tiles), DKV_QWARPS (2: the
// FlashAttention-2-like warp layout below), DKV_DO_STAGES (1: one dO buffer beside two Q buffers), DKV_DQ_ATOMIC,
// DKV_DQ_ORDERED.
// The ordered dQ builds re-read the thread index for their row copies (load_strided_rows: K / V once, Q / dO every
// step; common.cuh, DKV_ROWS_TID_AGAIN, which DUALKV_EXTRA_DEFINES=DKV_ROWS_TID_AGAIN=0 turns off for an A/B).
#if defined(DKV_DQ_ORDERED) && DKV_DQ_ORDERED && !defined(DKV_ROWS_TID_AGAIN)
#define DKV_ROWS_TID_AGAIN 1
#endif
// DKV_DKDV_ADDR32 = 0, 1 or 2: this kernel's ldmatrix addressing (common.cuh, DKV_LDSM_ADDR32; no other kernel takes
// it). build.py chooses it per build: the first mode, in an order set by the NVRTC release (dkdv_addr32_modes), that
// ptxas compiles without spills; DUALKV_EXTRA_DEFINES=DKV_DKDV_ADDR32=... fixes it for an A/B.
#ifndef DKV_DKDV_ADDR32
#define DKV_DKDV_ADDR32 0
#endif
#ifndef DKV_LDSM_ADDR32
#define DKV_LDSM_ADDR32 DKV_DKDV_ADDR32
#endif
// DKV_DKDV_SMEM32 (#13; default 0): the main loop's shared addresses formed in 32 bits from one conversion of the smem
// base and the tiles' byte offsets (common.cuh SmemPtr32), in bits: 1 the MMA operands (ldmatrix; with
// DKV_DKDV_ADDR32=0 each address is then base + offset in 32 bits, as NVRTC 13.5 forms the pointer form's); 2 the step's
// cp.async copies (Q, dO, LSE, D) and the LSE = inf / D = 0 rows past a segment; 4 the P^T / dS^T stores (st.shared)
// and the step's LSE / D reads, one 8-byte ld.shared per lane and 8 columns, read where they are used (a volatile asm
// read per use, unmerged, took 96 loads a step). NVRTC 12.8-13.0 keep shared pointers in 64 bits (13.5's PTX:
// `mov.u32 %r, smem_raw`, every ld/st.shared on a 32-bit register), so each shared address formed from a generic
// pointer costs 64-bit adds and a truncation (cvt.u32.u64 before each ldmatrix / cp.async) that ptxas does not fold.
// d = 128 causal shared-first ordered build, main loop SASS instructions and spill bytes (stores / loads), NVRTC 13.0
// | 13.5, default modes (1): sm_90 1343, 16 / 20 | 1307, 0; sm_80 1529, 0 | 1487, 0. With 7: sm_90 mode 0 1306, 0 |
// 1312, 0; mode 1 1317, 32 / 48 | 1323, 32 / 48; mode 2 1332, 0 | 1337, 0; sm_80 mode 0 1500, 0 | 1500, 0; mode 1
// 1500, 0 | 1499, 0; mode 2 1585, 44 / 64 | 1584, 44 / 64 (experiments/results/checks/s39addr-cpu-20261130.log; untimed).
#ifndef DKV_DKDV_SMEM32
#define DKV_DKDV_SMEM32 0
#endif
#if DKV_DKDV_SMEM32 < 0 || DKV_DKDV_SMEM32 > 7
#error "DKV_DKDV_SMEM32 takes bits 1, 2 and 4 (0 to 7)"
#endif
#include "flags.cuh"
#include "kernel_params.cuh"
#include "keywalk.cuh"
#include "split_parts.cuh"

#ifndef DKV_DQ_ORDERED
#define DKV_DQ_ORDERED 0
#endif
#ifndef DKV_TREE
#define DKV_TREE 0
#endif
// DKV_SPLIT_TILES (the ordered mode): the build that runs split shared-key tiles (split_parts.cuh), launched only for a
// split table (dualkv/cuda/split_args.py refuses a split for the other builds). The others have no split epilogue:
// at 255 registers it added to ptxas's spills inside the main loop (NVRTC 13.0, the GPU machine's; d = 128 sm_90 causal
// shared-first: 96 / 152 bytes of spill stores / loads with it, 92 / 136 without, 60 / 104 with the thread index
// re-read too). This kernel's time at (16, 32K) (H200, torch.profiler): 244.8 ms with it, 240.5 without, 238.4-238.9
// with the re-read; another call 244.3 against 237.0, and eca2523, before the split existed, 231.2 with 12 / 12
// (experiments/results/checks/s28variants-h200-20261129T1051Z.log; ncu's source counters, s28ncu-source-*, put the
// whole difference between eca2523 and the build without the epilogue on the spills).
#ifndef DKV_SPLIT_TILES
#define DKV_SPLIT_TILES 0
#endif
// Diagnostic (DUALKV_EXTRA_DEFINES): 1 skips the ordered mode's waits (adds in any order: not deterministic), keeping
// its counters, releases, barriers and launch order, so a timing against the default isolates what the waits cost; 2
// also skips the barrier after the wait (safe for the shared memory only in builds of two Q / dO stages).
#ifndef DKV_DBG_NOWAIT
#define DKV_DBG_NOWAIT 0
#endif
#ifndef DKV_TREE_ROOT_FIRST
#define DKV_TREE_ROOT_FIRST 0  // 1: the root-first (tree) / shared-first (two-level) dQ order, as bwd_sm90_ws.cu's
#endif
// Ordered dQ: when thread 0 reads its step's counter (DKV_DQ_PREFETCH). 2 (the default): an acquire read issued
// before the dQ product, whose latency the product hides; at the wait it spins only if that read came too early. 1: a
// relaxed read there, then a fence at the wait (or a spin). 0: an acquire spin after the product, where the wait
// barrier held every thread for the read's round trip to L2. H100, ordered backward at (8, 8K) / (16, 32K): 35.67 /
// 295.47 ms (2), 37.35 / 308.83 (1), 37.64 / 310.54 (0) (checks/ordprefetch-h100-20261128T0505Z.json).
#ifndef DKV_DQ_PREFETCH
#define DKV_DQ_PREFETCH 2
#endif
// Ordered dQ: what orders a step's adds before the counter release that hands the tile to the next contributor
// (DKV_DQ_FENCE; run_pending.sh ordearly measured all three on an H100 with DKV_DQ_PREFETCH=0, ordered backward at
// (8, 8K) / (16, 32K)):
//   2 (the default): nothing beyond thread 0's st.release itself. The release comes after a CTA barrier that follows
//     every thread's adds, and in the PTX memory model a release is cumulative over what the barrier ordered before
//     it (the pattern of the cooperative-groups grid barrier, whose fence + relaxed atomic this release is): 36.92 /
//     310.16 ms;
//   1: thread 0 also runs __threadfence() before its release: 39.23 / 325.40 ms;
//   0: every thread fences its own adds (each waits for its REDs to land): 39.49 / 334.00 ms.
// (Tried and dropped: thread 0 reading its counter as the step starts, parked in smem, with a fence instead of the
// acquire spin at the wait: 0.4-3.6% slower in every combination; the fence waits on the next step's copies. Its
// acquire read issued before the dK product rather than the dQ product: 304.8 against 295.4 ms at (16, 32K). Each warp
// waiting alone, lane 0 reading the counter and __syncwarp in place of the wait barrier: 266.64 against 265.71 ms,
// no faster. Not waiting at all (nondeterministic; a diagnostic): 245.98 ms, so the ordering costs 8% at (16, 32K)
// and the rest of the mode runs as fast as the atomic mode: checks/warpwait-* and ordlayout-*, H100. On the FA2-like
// layout, keeping a step's dQ fragment in registers past the back edge and waiting / adding after the next step's
// S^T product, one more product of slack (the GPU tests passed): H200, ordered backward at (28, 4K) / (8, 8K) /
// (16, 32K) 46.20 / 28.48 / 246.72 and 45.78 / 28.54 / 246.04 ms against 46.58 / 28.31 / 241.69 and 47.37 / 29.01 /
// 242.23, slower at the largest shape: checks/defer-h200-20261128T1446Z.log.)
#ifndef DKV_DQ_FENCE
#define DKV_DQ_FENCE 2
#endif
// DKV_QWARPS=2: the FlashAttention-2-like warp layout (every warp holds 32 keys x 32 queries of S^T and dP^T, which go
// through smem as P^T and dS^T; dV / dK with warps over keys x columns; dQ with 32-row warps where the columns stay
// whole MMA tiles): each warp reads fewer smem bytes per step (about 72 KB against 92 KB at head dim 128 with 64-query
// steps), at one more smem tile (P^T). H200, d = 128 backward at (16, 32K): ordered 241.84 against 272.86 ms, atomic
// 232.32 against 246.54 (checks/qwarps-h200-20261128T0937Z.json). (32-bit ldmatrix addresses were tried on the CPU then
// and gave the same SASS, under NVRTC 13.5, which forms them in 32 bits itself; under 12.9 / 13.0 they do not:
// DKV_DKDV_ADDR32 above.)
#ifndef DKV_QWARPS
#define DKV_QWARPS 1
#endif
// DKV_DO_STAGES=1 (DKV_QWARPS=2, two stages): one dO buffer, so that head dim 128 fits an A100's 163 KB of smem. A step's
// dO is copied after the previous step's last read of it (the dV product) and waited for before the dP^T product,
// behind the S^T product; one more barrier per step.
#ifndef DKV_DO_STAGES
#define DKV_DO_STAGES DKV_STAGES
#endif
// DKV_QDO_SWIZZLE=1 (the default; the FA2-like layout at head dims 64 and 128): the step's Q and dO tiles in the
// swizzled layout (common.cuh gemm_rows_swz / gemm_smem_swz) rather than padded rows, so that each cp.async copy of
// 128 global bytes fills one 128-byte smem line (ncu, padded: 2.6x the ideal shared wavefronts and 1.5x the ideal L2
// sectors on those copies, checks/s31ncu-source-*). H200, NVRTC 13.0, backward ms at (8, 8K) / (16, 32K), 0 / 1
// alternating, two rounds: ordered 27.40 / 227.66 and 27.44 / 227.18 against 27.17 / 224.80 and 27.51 / 224.74; atomic
// 27.90 / 221.07 and 27.71 / 221.36 against 26.76 / 213.18 and 26.76 / 213.80 (checks/s31swz-h200-20261129T2142Z.json).
#ifndef DKV_QDO_SWIZZLE
#define DKV_QDO_SWIZZLE 1
#endif
#if DKV_QDO_SWIZZLE != 0 && DKV_QDO_SWIZZLE != 1
#error "DKV_QDO_SWIZZLE must be 0 or 1"
#endif
// Tried and dropped (#13, experiments/results/checks/s32mid-*): (a) the dQ product and its adds between the dV and dK
// products, FlashAttention-2's order, so that the adds drain behind the dK product (ncu had put 7% of this kernel's
// stall samples on LG throttle at the step's 32 adds per warp, FA2's kernel 0.06%: checks/s32next-*); (b) with it, q_start
// read anew for the adds rather than kept from the step's start, which left ptxas 13.0 no spill in the loop (the kept
// value's spill store waited on its load: 4.2% of the stall samples). H200, sm_90, ordered / atomic backward ms at
// (16, 32K), two rounds of alternating processes: this kernel 225.88 / 213.37 and 225.91 / 214.55; (a) 228.17 / 215.49
// and 228.21 / 215.19; (a) + (b) 240.94 / 216.98 and 241.13 / 217.44. Under NVRTC 13.5 (no spills either way) this
// kernel 215.36 / 210.34 and 216.04 / 209.96, (a) + (b) 226.15 / 212.01 and 225.57 / 211.46. Most likely the ordered
// wait, earlier in the step, then has less work behind the counter's prefetch read.
// Tried and dropped (s33seg, H200): the step's segment row staged in smem by thread 0 with the step's copies, read
// there rather than from the segment table (which left NVRTC 13.0's sm_90 ordered build spill-free on the CPU). Backward
// at (16, 32K), ordered / atomic dQ, ms: 13.0 229.43 / 217.12 and 229.29 / 216.52 against 228.27 / 216.85 and
// 228.05 / 217.59 without; 13.5 222.02 / 212.50 and 222.16 / 212.73 against 216.88 / 212.50 and 218.53 / 211.72.
// Ordered dQ: where thread 0 releases the previous step's counter (DKV_DQ_RELEASE). 0 (the default): after the step's
// dS barrier; 1: after the S^T product, before the next step's walk and copies (its st.release is a MEMBAR.GPU, which
// waits for thread 0's copies in flight; the step's first barrier already follows every thread's adds). H200, FA2-like
// layout, ordered backward at (8, 8K) / (16, 32K), alternating processes: 0 29.17 / 242.30 and 29.10 / 242.01 ms, 1 28.93
// / 244.28 and 29.08 / 244.00: no faster (checks/release-h200-20261128T1017Z.log; the GPU tests passed under 1).
#ifndef DKV_DQ_RELEASE
#define DKV_DQ_RELEASE 0
#endif
#if defined(DKV_DQ_FENCE_ONE) || defined(DKV_DQ_EARLY)
#error "DKV_DQ_FENCE_ONE is now DKV_DQ_FENCE (0 every thread, 1 thread 0, 2 the release alone); DKV_DQ_EARLY was removed"
#endif

using namespace dkv;

namespace {

constexpr int kBlockM = DKV_BLOCK_M;
constexpr int kDSplit = DKV_DSPLIT;
constexpr int kQWarps = DKV_QWARPS;
static_assert(kQWarps == 1 || (kQWarps == 2 && kDSplit == 1), "DKV_QWARPS: 1, or 2 without a d-split");
constexpr int kBlockKeys = kWarps / kDSplit * 16;
// Warps over the keys: kQWarps == 1, each warp's 16 keys (dK/dV columns split over kDSplit warps); kQWarps == 2,
// warps 4 (keys) x 2 (queries) in the S^T / dP^T products and 4 (keys) x 2 (dK/dV columns) in the dV / dK
// products, so each warp holds kKeySlabs 16-key slabs.
constexpr int kKeyWarps = kWarps / kDSplit / kQWarps;
constexpr int kKeySlabs = kQWarps;
constexpr int kCols = kHeadDim / kDSplit / kQWarps;  // dK/dV columns per warp
constexpr int kSdpQueries = kBlockM / kQWarps;       // queries per warp in the S^T / dP^T products
static_assert(kSdpQueries % 16 == 0, "S^T / dP^T: whole 16-query MMA tiles per warp");
constexpr int kDoStages = DKV_DO_STAGES;
constexpr bool kDoSingle = kDoStages != DKV_STAGES;  // one dO buffer beside two Q buffers
static_assert(!kDoSingle || (kDoStages == 1 && DKV_STAGES == 2 && kQWarps == 2), "DKV_DO_STAGES=1: qwarps 2, two stages");
constexpr int kStages = DKV_STAGES;
#if DKV_QDO_SWIZZLE && DKV_QWARPS == 2 && DKV_HEAD_DIM % 64 == 0
#define DKV_QDO_SWZ 1  // (a macro: the swizzled helpers assert whole atoms, so other builds must not see the calls)
#else
#define DKV_QDO_SWZ 0
#endif
constexpr bool kQdoSwizzle = DKV_QDO_SWZ != 0;
constexpr bool kDqAtomic = DKV_DQ_ATOMIC != 0;
constexpr bool kDqOrdered = DKV_DQ_ORDERED != 0;
constexpr bool kDqHere = kDqAtomic || kDqOrdered;  // this kernel computes dQ = dS K
static_assert(!(kDqAtomic && kDqOrdered), "one dQ mode");
static_assert(DKV_DQ_FENCE >= 0 && DKV_DQ_FENCE <= 2 && DKV_DQ_PREFETCH >= 0 && DKV_DQ_PREFETCH <= 2,
              "DKV_DQ_FENCE and DKV_DQ_PREFETCH take 0, 1 or 2");
static_assert((DKV_DQ_RELEASE == 0 || DKV_DQ_RELEASE == 1) && !(DKV_DQ_RELEASE == 1 && DKV_DQ_FENCE == 0),
              "DKV_DQ_RELEASE takes 0 or 1 (1: not with DKV_DQ_FENCE=0, whose fences precede the dS barrier)");
// a key block holds whole query tiles, so a causal own walk starts at a counter's tile
static_assert(!kDqOrdered || (!kWindow && kBlockKeys % kBlockM == 0), "ordered dQ: no window, whole query tiles");
constexpr bool kTree = DKV_TREE != 0;
// (kSplitTiles, a new constant, changed the other builds' cubin bytes but not their SASS: checked under NVRTC 13.0)
constexpr bool kSplitTiles = DKV_SPLIT_TILES != 0;
static_assert(!kSplitTiles || (kDqOrdered && !kTree), "DKV_SPLIT_TILES: the two-level ordered dQ mode's build");
// (a macro, not a constexpr, when it was added: a new namespace-scope constant would have changed every other build's
// cubin bytes)
static_assert(!DKV_TREE_ROOT_FIRST || kDqOrdered, "the root-first / shared-first dQ order is the ordered dQ mode's");
constexpr bool kDqPrefetch = kDqOrdered && DKV_DQ_PREFETCH != 0;
static_assert(!kTree || (kDqOrdered && kCausal), "the dK/dV kernel's tree build is the causal ordered dQ mode's");
static_assert(kBlockM % 16 == 0 && kCols % 16 == 0, "tile sizes");
static_assert(kStages == 1 || kStages == 2, "1 or 2 stages");
// dQ partial of a step: kBlockM rows x HEAD_DIM, warps as (row warps of kDqSlabs 16-row slabs) x (column parts);
// with kQWarps == 2, 32-row warps where the column parts stay whole MMA tiles (fewer smem bytes per product).
constexpr bool kDqWide = kQWarps == 2 && kBlockM % 32 == 0 && kWarps % (kBlockM / 32) == 0 &&
                         (kHeadDim / (kWarps / (kBlockM / 32))) % 16 == 0;
constexpr int kDqSlabs = kDqWide ? 2 : 1;
constexpr int kDqRowWarps = kBlockM / (16 * kDqSlabs);
constexpr int kDqColParts = kWarps / kDqRowWarps;
constexpr int kDqCols = kHeadDim / (kDqColParts > 0 ? kDqColParts : 1);
constexpr int kDsStride = kBlockM + 8;  // padded row stride of the transposed dS (and P) tile (elements)
static_assert(!kDqHere || (kDqColParts * kDqRowWarps == kWarps && kDqCols % 16 == 0), "dQ warp layout");

using KeyWalk = Walk<kBlockM, kDqOrdered>;
// Split key tiles (the ordered mode, split_parts.cuh): one CTA's slot holds every thread's dK and dV slabs.
constexpr long long kPartFloats = 2LL * kKeySlabs * (kCols / 8) * 4 * kThreads;

// Ordered dQ: the rank of this step's contribution at its (head, query tile) counter (ws_schedule.rank): block b of
// the segment's own keys has rank b; for a dependent, the own blocks reaching the tile come first, and in a tree
// then the blocks of the nodes strictly between the dependent j and the key's node i: A[j] - A[i] - blocks(i), A
// being the second int of a node's context-list header. (Segments are read again rather than kept live through
// the dQ product.)
__device__ __forceinline__ int dq_rank(const KeyWalk& w, const Cursor& c) {
#if DKV_TREE_ROOT_FIRST && DKV_TREE  // root-first: A[key node] + block at every tile the key block reaches
    const Segment node = load_segment(w.segments, w.kt.own_seg);
    return w.segments[2 * node.ctx_start + 1] + w.kt.blk;
#elif DKV_TREE_ROOT_FIRST  // two-level shared-first: block b of the shared keys, own blocks after all the context's
    if (!w.is_own(c.src)) return w.kt.blk;
    return w.kt.blk + (load_segment(w.segments, w.seg_of(c.src)).ctx_len + kBlockKeys - 1) / kBlockKeys;
#endif
    if (w.is_own(c.src)) return w.kt.blk;
    const Segment seg = load_segment(w.segments, w.seg_of(c.src));
    int rank = w.kt.blk + (kCausal ? (c.pos + kBlockM - 1) / kBlockKeys + 1
                                   : (seg.q_len + kBlockKeys - 1) / kBlockKeys);
    if (kTree) {
        const Segment node = load_segment(w.segments, w.kt.own_seg);
        rank += w.segments[2 * seg.ctx_start + 1] - w.segments[2 * node.ctx_start + 1] -
                (node.q_len + kBlockKeys - 1) / kBlockKeys;
    }
    return rank;
}

// Ordered dQ: the index of a step's counter among its head's n_qtiles: tile t of segment s at qtile_offset[s] + t;
// in a tree, the tile's first token (a tree table has no per-segment tile offsets).
__device__ __forceinline__ int dq_counter(const KeyWalk& w, const Cursor& c, const int* qtile_offset, int q_start) {
    return kTree ? q_start + c.pos : qtile_offset[w.seg_of(c.src)] + c.pos / kBlockM;
}

}  // namespace

// The two-level shared-first ordered builds stage LSE / D one row per thread too (1), or by the strided loop (0). On
// sm_90 the causal d = 128 build then spills (stores / loads) 56 / 96 bytes against 28 / 40 and measured 0.9-1% faster
// (H200, bwd ms at (28, 4K) / (8, 8K) / (16, 32K): 45.49 / 28.11 / 235.25 against 46.02 / 28.37 / 237.72 and 45.90 /
// 28.34 / 237.69, own processes,
// experiments/results/checks/s25mma-h200-20261129T0131Z.log); on sm_80 it would spill 20 / 24 bytes where the loop
// spills none, and no sm_80 GPU was there to time it, so those builds keep the loop.
#ifndef DKV_SHARED_FIRST_ROW_STATS
#if __CUDA_ARCH__ >= 900
#define DKV_SHARED_FIRST_ROW_STATS 1
#else
#define DKV_SHARED_FIRST_ROW_STATS 0
#endif
#endif

extern "C" __global__ void __launch_bounds__(kThreads) dualkv_bwd_dkdv(DKV_DKDV_PARAMS) {
    extern __shared__ __align__(128) unsigned char smem_raw[];  // 128: the swizzled Q / dO tiles XOR address bits 4-6
    elem_t* sK = reinterpret_cast<elem_t*>(smem_raw);
    elem_t* sV = sK + kBlockKeys * kRowStride;
    elem_t* sQ = sV + kBlockKeys * kRowStride;                 // [kStages][kBlockM rows]
    elem_t* sdO = sQ + kStages * kBlockM * kRowStride;         // [kDoStages][kBlockM rows]
    float* sLse = reinterpret_cast<float*>(sdO + kDoStages * kBlockM * kRowStride);  // [kStages][kBlockM]
    float* sDelta = sLse + kStages * kBlockM;                                     // [kStages][kBlockM]
    elem_t* sdS = reinterpret_cast<elem_t*>(sDelta + kStages * kBlockM);  // [kBlockKeys][kDsStride] (dQ modes, kQWarps 2)
    elem_t* sP = sdS + kBlockKeys * kDsStride;                           // [kBlockKeys][kDsStride] (kQWarps 2)
#if DKV_DKDV_SMEM32  // the main loop's tiles as 32-bit shared addresses (mX: ldmatrix operands, wX: stores / loads)
    // (byte offsets of the tiles above, spelled out: a pointer difference is formed in 64 bits by NVRTC 13.0)
    constexpr unsigned kTileBytes = kBlockKeys * kRowStride * kElemBytes, kStepBytes = kBlockM * kRowStride * kElemBytes;
    constexpr unsigned kOffQ = 2 * kTileBytes, kOffdO = kOffQ + kStages * kStepBytes;
    constexpr unsigned kOffLse = kOffdO + kDoStages * kStepBytes, kOffDelta = kOffLse + kStages * kBlockM * 4;
    constexpr unsigned kOffdS = kOffDelta + kStages * kBlockM * 4, kOffP = kOffdS + kBlockKeys * kDsStride * kElemBytes;
    const unsigned smem0 = smem_addr(smem_raw);
    using TileE = SmemPtr32<elem_t>;
    (void)sP;
#endif
#if DKV_DKDV_SMEM32 & 1
    const TileE mK{smem0}, mV{smem0 + kTileBytes}, mdS{smem0 + kOffdS}, mP{smem0 + kOffP};
#else
    const elem_t* const mK = sK;
    const elem_t* const mV = sV;
    const elem_t* const mdS = sdS;
    const elem_t* const mP = sP;
#endif
#if DKV_DKDV_SMEM32 & 4
    const TileE wdS{smem0 + kOffdS}, wP{smem0 + kOffP};
#else
    elem_t* const wdS = sdS;
    elem_t* const wP = sP;
#endif

    // ordered dQ: a 1-D grid, head-major when first_tiles >= 0 (ws_schedule.cta_order), else a row's KV heads adjacent
    const int2 cta =
        kDqOrdered ? cta_head_tile(kv_heads, first_tiles, first_tiles >= 0) : make_int2(blockIdx.y, blockIdx.x);
    const int tile = cta.y;
    const int kv_head = cta.x;
    const KeyBlock<kBlockM, kDqOrdered> kb =
        make_key_block<kBlockM, kDqOrdered>(key_tiles, tile, segments, group_size, window_left, kBlockKeys);
    const KeyWalk& w = kb.w;
    {
        const StridedRows<const elem_t> k_rows = kb.rows(kd, kd_st, kd_sh, kc, kc_st, kc_sh, kv_head);
        const StridedRows<const elem_t> v_rows = kb.rows(vd, vd_st, vd_sh, vc, vc_st, vc_sh, kv_head);
        load_strided_rows<kBlockKeys>(sK, k_rows.first, k_rows.stride, w.count, q);
        load_strided_rows<kBlockKeys>(sV, v_rows.first, v_rows.stride, w.count, q);
    }

    // Stage the Q/dO rows, LSE and D of one step into buffer `buf` (kDoSingle: all but dO; load_do stages that). The
    // two-level ordered builds in the default order stage LSE / D one row per thread (keywalk.cuh says why only they).
    constexpr bool kStatsPerThread =
        kDqOrdered && !kTree && (!DKV_TREE_ROOT_FIRST || DKV_SHARED_FIRST_ROW_STATS) && kBlockM <= kThreads;
#if DKV_DKDV_SMEM32 & 2
    auto load_step = [&](const Cursor& c, int buf) {
        load_walk_step<kBlockM, kQdoSwizzle, kDqOrdered, kDoSingle ? 1 : 3, kStatsPerThread>(
            w, c, kv_head, q, q_st, q_sh, dout, do_st, do_sh, lse2, delta, lse_sh, TileE{smem0 + kOffQ + buf * kStepBytes},
            TileE{smem0 + kOffdO + (kDoSingle ? 0 : buf) * kStepBytes}, SmemPtr32<float>{smem0 + kOffLse + buf * kBlockM * 4},
            SmemPtr32<float>{smem0 + kOffDelta + buf * kBlockM * 4});
    };
    auto load_do = [&](const Cursor& c) {
        load_walk_step<kBlockM, kQdoSwizzle, kDqOrdered, 2>(w, c, kv_head, q, q_st, q_sh, dout, do_st, do_sh, lse2,
                                                            delta, lse_sh, TileE{smem0 + kOffQ}, TileE{smem0 + kOffdO},
                                                            SmemPtr32<float>{smem0 + kOffLse},
                                                            SmemPtr32<float>{smem0 + kOffDelta});
    };
#else
    auto load_step = [&](const Cursor& c, int buf) {
        load_walk_step<kBlockM, kQdoSwizzle, kDqOrdered, kDoSingle ? 1 : 3, kStatsPerThread>(
            w, c, kv_head, q, q_st, q_sh, dout, do_st, do_sh, lse2, delta, lse_sh, sQ + buf * kBlockM * kRowStride,
            sdO + (kDoSingle ? 0 : buf) * kBlockM * kRowStride, sLse + buf * kBlockM, sDelta + buf * kBlockM);
    };
    auto load_do = [&](const Cursor& c) {
        load_walk_step<kBlockM, kQdoSwizzle, kDqOrdered, 2>(w, c, kv_head, q, q_st, q_sh, dout, do_st, do_sh, lse2,
                                                            delta, lse_sh, sQ, sdO, sLse, sDelta);
    };
#endif

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int key_warp = warp % kKeyWarps, dsplit = warp / kKeyWarps;
    const int g = lane / 4, t4 = lane % 4;
    const int lrow = lane % 8, lmat = lane / 8;
    const int warp_key0 = key_warp * 16 * kKeySlabs;
    const int col0 = dsplit * kCols;
    const int sdp_q0 = kQWarps == 1 ? 0 : dsplit * kSdpQueries;  // the warp's first query in the S^T / dP^T products

    float acc_dk[kKeySlabs][kCols / 8][4], acc_dv[kKeySlabs][kCols / 8][4];
#pragma unroll
    for (int sl = 0; sl < kKeySlabs; ++sl) {
        zero_acc(acc_dk[sl]);
        zero_acc(acc_dv[sl]);
    }

    int* pending = nullptr;  // ordered dQ (thread 0): the counter of the adds last issued, released one step late
    int pending_rank = 0;

    Cursor cur = w.first();
    if (cur.valid) load_step(cur, 0);
    cp_async_commit();
    if (kDoSingle) {  // copy groups in flight at a step's start: its Q / LSE / D, then its dO
        if (cur.valid) load_do(cur);
        cp_async_commit();
    }
    int buf = 0;
    while (cur.valid) {
        Cursor nxt;
        if (kDoSingle) {
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // this step's Q/dO/LSE/D (kDoSingle: all but dO) and the K/V block are in smem

        const elem_t* bQ = sQ + buf * kBlockM * kRowStride;
        const elem_t* bdO = sdO + (kDoSingle ? 0 : buf) * kBlockM * kRowStride;
        const float* bLse = sLse + buf * kBlockM;
        const float* bDelta = sDelta + buf * kBlockM;
#if DKV_DKDV_SMEM32 & 1
        (void)bQ;
        (void)bdO;
        const TileE mQ{smem0 + kOffQ + buf * kStepBytes};
        const TileE mdO{smem0 + kOffdO + (kDoSingle ? 0 : buf) * kStepBytes};
#else
        const elem_t* const mQ = bQ;
        const elem_t* const mdO = bdO;
#endif
#if DKV_DKDV_SMEM32 & 4  // (this warp's columns: sdp_q0 on)
        (void)bLse;
        (void)bDelta;
        auto wLse_at = [&]() {
            return load_cols<kSdpQueries / 8>(SmemPtr32<float>{smem0 + kOffLse + buf * kBlockM * 4} + sdp_q0, t4);
        };
        auto wDelta_at = [&]() {
            return load_cols<kSdpQueries / 8>(SmemPtr32<float>{smem0 + kOffDelta + buf * kBlockM * 4} + sdp_q0, t4);
        };
#else
        auto wLse_at = [&]() { return bLse + sdp_q0; };
        auto wDelta_at = [&]() { return bDelta + sdp_q0; };
#endif
        const StepGeometry sg = step_geometry(w, cur, kBlockKeys);
        auto take_counter = [&]() {  // thread 0: this step's counter and rank
            pending = dq_sems + (kv_head * group_size + cur.h) * static_cast<long long>(n_qtiles) +
                      dq_counter(w, cur, qtile_offset, sg.seg.q_start);
            pending_rank = dq_rank(w, cur);
        };
        int seen = -1;  // DKV_DQ_PREFETCH (thread 0): the counter as read before the dQ product
        // Ordered mode, after the step's dS barrier (which follows every thread's adds of the previous step): thread 0
        // releases the previous step's counter and reads this step's early.
        auto release = [&]() {  // thread 0
            if (pending != nullptr) {
                if (DKV_DQ_FENCE == 1) __threadfence();
                st_release(pending, pending_rank + 1);
            }
        };
        auto release_and_prefetch = [&]() {
            if (threadIdx.x == 0) {
                if (DKV_DQ_RELEASE == 0) release();
                if (kDqPrefetch) {
                    take_counter();
                    seen = DKV_DQ_PREFETCH == 2 ? ld_acquire(pending) : ld_relaxed(pending);
                }
            }
        };

        float acc_s[kKeySlabs][kSdpQueries / 8][4];
#if DKV_QDO_SWZ
        gemm_rows_swz<kKeySlabs, kSdpQueries, kBlockM>(acc_s, mK, mQ, sdp_q0, warp_key0, lrow, lmat);  // S^T
#else
        gemm_rows_rows<kKeySlabs, kSdpQueries>(acc_s, mK, mQ + sdp_q0 * kRowStride, warp_key0, lrow, lmat);  // S^T
#endif
        // The next step's walk (segment-table loads) and copies go out here, behind the S^T product's MMAs, not
        // before it, where every warp waited on the walk's loads with no product in flight: the mma.sync backward
        // ran 4.9-5.5% faster on H100 (checks/mma-loadmid-h100-20261127T1556Z.json); the ordered mode, which had
        // issued them before the products with its LSE / D by plain loads, 10% faster with both here and by cp.async
        // (265.71 against 294.72 ms at (16, 32K), checks/ordlayout-h100-20261128T0645Z.json). (Two stages: these copies
        // follow this step's first barrier, which a warp passes only after every warp finished the previous step,
        // the last to read the other buffer.)
        if (kDqOrdered && DKV_DQ_RELEASE == 1 && threadIdx.x == 0) release();
        nxt = w.next(cur);
        if (kStages == 2) {
            if (nxt.valid) load_step(nxt, buf ^ 1);
            cp_async_commit();
        }
        float acc_dp[kKeySlabs][kSdpQueries / 8][4];
        if constexpr (kQWarps == 1) {  // (written for any kKeySlabs so that both branches type-check)
            probs_t(acc_s[0], wLse_at(), sg.need_mask, sg.key_base + warp_key0, sg.query_pos0, window_left, g, t4,
                    scale_log2);  // P^T
            unsigned p_frag[kKeySlabs][kSdpQueries / 16][4];
            to_a_frag<kKeySlabs, kSdpQueries>(p_frag, acc_s);
            gemm_frag_rows<kKeySlabs, kSdpQueries, kCols>(acc_dv, p_frag, mdO, col0, lrow, lmat);  // dV += P^T dO

            gemm_rows_rows<kKeySlabs, kSdpQueries>(acc_dp, mV, mdO, warp_key0, lrow, lmat);  // dP^T = V dO^T
            dscores_t(acc_dp[0], acc_s[0], wDelta_at(), t4);  // dS^T
            unsigned ds_frag[kKeySlabs][kSdpQueries / 16][4];
            to_a_frag<kKeySlabs, kSdpQueries>(ds_frag, acc_dp);
            gemm_frag_rows<kKeySlabs, kSdpQueries, kCols>(acc_dk, ds_frag, mQ, col0, lrow, lmat);  // dK += dS^T Q
        } else {
            // P^T and dS^T of this warp's 32 keys x 32 queries to smem; after the barrier, dV and dK with warps over
            // (keys x columns) read them back as A operands.
            // On this layout the ordered dQ mode masks only the steps that need it (an unmasked copy of the exp2
            // loop for the rest); the other modes, and every mode on the 16-key layout, mask every step
            // (predicated). H200, bwd at (28, 4K) / (8, 8K) / (16, 32K), own processes: ordered 45.66 / 28.21 /
            // 234.06 and 45.78 / 28.43 / 234.13 ms against 46.63 / 28.48 / 236.71 and 46.36 / 28.83 / 236.98; atomic
            // 49.84 / 29.47 / 231.51 and 50.07 / 29.53 / 233.43 against 48.44 / 28.41 / 227.69 and 48.45 / 28.63 /
            // 226.90, slower that way (experiments/results/checks/s23mask-h200-20261128T1802Z.log).
#if DKV_DKDV_SMEM32 & 4
            const auto lse_cols = wLse_at();
#define DKV_STEP_LSE lse_cols
#else
#define DKV_STEP_LSE wLse_at()  // (each call's own pointer, as the default build always had it)
#endif
            if (kDqOrdered && !sg.need_mask) {
#pragma unroll
                for (int sl = 0; sl < kKeySlabs; ++sl)
                    probs_t(acc_s[sl], DKV_STEP_LSE, false, 0, 0, window_left, g, t4, scale_log2);  // P^T
            } else {
#pragma unroll
                for (int sl = 0; sl < kKeySlabs; ++sl)
                    probs_t(acc_s[sl], DKV_STEP_LSE, sg.need_mask, sg.key_base + warp_key0 + sl * 16,
                            sg.query_pos0 + sdp_q0, window_left, g, t4, scale_log2);  // P^T
            }
            store_frag_rows<kKeySlabs, kSdpQueries>(wP, kDsStride, acc_s, warp_key0, sdp_q0, g, t4);
            if (kDoSingle) {
                cp_async_wait<1>();  // this step's dO (the next step's Q copies, committed since, may be in flight)
                __syncthreads();
            }
#if DKV_QDO_SWZ
            gemm_rows_swz<kKeySlabs, kSdpQueries, kBlockM>(acc_dp, mV, mdO, sdp_q0, warp_key0, lrow,
                                                           lmat);  // dP^T = V dO^T
#else
            gemm_rows_rows<kKeySlabs, kSdpQueries>(acc_dp, mV, mdO + sdp_q0 * kRowStride, warp_key0, lrow,
                                                   lmat);  // dP^T = V dO^T
#endif
#if DKV_DKDV_SMEM32 & 4
            const auto d_cols = wDelta_at();
#define DKV_STEP_D d_cols
#else
#define DKV_STEP_D wDelta_at()
#endif
#pragma unroll
            for (int sl = 0; sl < kKeySlabs; ++sl) dscores_t(acc_dp[sl], acc_s[sl], DKV_STEP_D, t4);  // dS^T
#undef DKV_STEP_LSE
#undef DKV_STEP_D
            store_frag_rows<kKeySlabs, kSdpQueries>(wdS, kDsStride, acc_dp, warp_key0, sdp_q0, g, t4);
            if (kDqOrdered && DKV_DQ_FENCE == 0) __threadfence();  // the previous step's adds land before the release
            __syncthreads();  // P^T and dS^T are in smem
            if (kDqOrdered) release_and_prefetch();
#if DKV_QDO_SWZ
            gemm_smem_swz<kKeySlabs, kBlockM, kCols, kBlockM>(acc_dv, mP, kDsStride, warp_key0, mdO, col0, lrow,
                                                              lmat);  // dV += P^T dO
            gemm_smem_swz<kKeySlabs, kBlockM, kCols, kBlockM>(acc_dk, mdS, kDsStride, warp_key0, mQ, col0, lrow,
                                                              lmat);  // dK += dS^T Q
#else
            gemm_smem_rows<kKeySlabs, kBlockM, kCols>(acc_dv, mP, kDsStride, warp_key0, mdO, col0, lrow,
                                                      lmat);  // dV += P^T dO
            gemm_smem_rows<kKeySlabs, kBlockM, kCols>(acc_dk, mdS, kDsStride, warp_key0, mQ, col0, lrow,
                                                      lmat);  // dK += dS^T Q
#endif
        }

        if (kDqHere) {
            if (kQWarps == 1) {
                // DKV_DQ_FENCE=0: the previous step's adds land before thread 0 releases them below
                if (kDqOrdered && DKV_DQ_FENCE == 0) __threadfence();
                // dS^T (this warp's 16 keys x kBlockM queries) to smem; then dQ_step = dS K, added in fp32.
                if (dsplit == 0) store_frag_rows<kKeySlabs, kSdpQueries>(wdS, kDsStride, acc_dp, warp_key0, 0, g, t4);
                __syncthreads();
                if (kDqOrdered) release_and_prefetch();
            }
            const int head = kv_head * group_size + cur.h;
            const int dq_rw = warp % kDqRowWarps, dq_part = warp / kDqRowWarps;
            float acc_dq[kDqSlabs][kDqCols / 8][4];
#pragma unroll
            for (int sl = 0; sl < kDqSlabs; ++sl) zero_acc(acc_dq[sl]);
#if DKV_LDSM_ADDR32
            const unsigned ds0 = smem_addr(mdS + ((lmat / 2) * 8 + lrow) * kDsStride + dq_rw * kDqSlabs * 16 +
                                           (lmat % 2) * 8);
#endif
#pragma unroll
            for (int kk = 0; kk < kBlockKeys / 16; ++kk) {
                unsigned a[kDqSlabs][1][4];  // dS rows (queries) x 16 keys, read transposed from sdS
#pragma unroll
                for (int sl = 0; sl < kDqSlabs; ++sl)
#if DKV_LDSM_ADDR32
                    ldmatrix_x4_trans(a[sl][0], ds0 + (kk * 16 * kDsStride + sl * 16) * kElemBytes);
#else
                    ldmatrix_x4_trans(a[sl][0], mdS + (kk * 16 + (lmat / 2) * 8 + lrow) * kDsStride +
                                                    (dq_rw * kDqSlabs + sl) * 16 + (lmat % 2) * 8);
#endif
                gemm_frag_rows<kDqSlabs, 16, kDqCols>(acc_dq, a, mK + kk * 16 * kRowStride, dq_part * kDqCols, lrow,
                                                      lmat);
            }
            // Ordered mode: thread 0 waits until every earlier contribution to this (head, query tile) has landed.
            if (kDqOrdered) {
                if (threadIdx.x == 0 && !DKV_DBG_NOWAIT) {
                    if (kDqPrefetch && DKV_DQ_PREFETCH == 2) {  // an acquire already: spin only if it read too early
                        if (seen != pending_rank) wait_flag(pending, pending_rank);
                    } else if (kDqPrefetch) {
                        acquire_flag(pending, pending_rank, seen);
                    } else {
                        take_counter();
                        wait_flag(pending, pending_rank);
                    }
                }
                if (DKV_DBG_NOWAIT < 2) __syncthreads();
            }
            // Each lane adds its fragment straight from registers into the fp32 accumulator in FRAGMENT ORDER
            // (bwd_dq_frag_cast.cu reads it back; dualkv/cuda/dq_layout.py states it): per head, tokens in groups
            // of 8 and columns in chunks of 8, a (group, chunk) block of 64 floats holding the chunk's even columns
            // (token t at 4 (t % 8) + column / 2), then its odd ones. An add instruction (fragment register nt, e)
            // then covers 32 consecutive floats when the slab starts a token group (two runs otherwise), every
            // address is one of two lane pointers plus a constant, and nothing is staged (the atomic mode's staged
            // row runs took ~170 instructions per warp and step; without them its backward measured 0.3-1.5%
            // faster on H100, checks/frag-*, and the cast needs no fp32 temporary). A slab's rows past its step's last
            // query add where their tokens' rows are (the next segment's, or the rows behind the accumulator,
            // dualkv/cuda/dq_layout.py TAIL_ROWS): their Q and dO rows are zero-filled and their LSE infinite, so
            // what they add is exactly +0 or -0, which leaves every nonzero value as it is (and a zero a zero: only
            // its sign could change, were an ordered add's result a negative subnormal, which red.add flushes to -0).
            // (They once went to one scratch block, every lane at one address, to keep those adds away from other
            // rows: those adds serialized, and on ragged micro-batches, where every response ends in a partial query
            // tile, the ordered backward took 2.2-3.6x the FA2 cascade's; experiments/results/checks/s27rl-*.) The
            // ordered mode adds the same way, after its wait: as fire-and-forget REDs (flags.cuh red_add), ordered
            // for the next contributor by its next step's dS barrier (the last step's: the barrier after the loop)
            // and thread 0's release after it (DKV_DQ_FENCE).
#pragma unroll
            for (int sl = 0; sl < kDqSlabs; ++sl) {
                const int slab = dq_rw * kDqSlabs + sl;
                const long long tok = sg.seg.q_start + cur.pos + slab * 16 + g;
                float* lane_lo = dq_acc + head * dqa_sh + (tok >> 3) * (8 * kHeadDim) + (tok & 7) * 4 + t4 +
                                 dq_part * kDqCols * 8;
#pragma unroll
                for (int nt = 0; nt < kDqCols / 8; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float* at = lane_lo + (e >> 1) * 8 * kHeadDim + nt * 64 + (e & 1) * 32;
                        if (kDqOrdered) {
                            red_add(at, acc_dq[sl][nt][e]);
                        } else {
                            atomicAdd(at, acc_dq[sl][nt][e]);
                        }
                    }
            }
        }

        // One stage (and kDoSingle's dO buffer): every warp is done with the buffer before the next step's copies
        // overwrite it (the ordered mode's wait barrier already did that). Two stages need no barrier here: the next copies (into this step's
        // buffer) and dS stores come after the next step's first barrier (without it the backward measured 0-1%
        // faster on H100: checks/mma-endbar-h100-20261127T1617Z.json).
        if (!kDqOrdered && (kStages == 1 || kDoSingle)) __syncthreads();
        if (kStages == 1 && nxt.valid) {
            load_step(nxt, 0);
            cp_async_commit();
        }
        if (kDoSingle) {  // (the ordered mode's wait barrier followed every warp's dV product)
            if (nxt.valid) load_do(nxt);
            cp_async_commit();
        }
        cur = nxt;
        if (kStages == 2) buf ^= 1;
    }
    cp_async_wait<0>();
    if (kDqOrdered && DKV_DQ_FENCE == 0) __threadfence();  // the last step's adds land before thread 0 releases them
    __syncthreads();
    if (kDqOrdered && threadIdx.x == 0 && pending != nullptr) {
        if (DKV_DQ_FENCE == 1) __threadfence();
        st_release(pending, pending_rank + 1);
    }
    if (kSplitTiles) {  // a split key tile (split_parts.cuh): its run's last CTA stores the sum of the run's dK / dV
        const int row = cta_head_tile(kv_heads, first_tiles, first_tiles >= 0, block_index_again()).y;
        if (row < partial_rows) {
            float* slot = part_acc + ((long long)row * kv_heads + kv_head) * kPartFloats;
#pragma unroll
            for (int sl = 0; sl < kKeySlabs; ++sl) {
                part_put<kCols / 8, kThreads>(slot, acc_dk[sl], sl, threadIdx.x);
                part_put<kCols / 8, kThreads>(slot, acc_dv[sl], kKeySlabs + sl, threadIdx.x);
            }
            // (LSE's smem is free: the last step's reads came before the barrier above)
            if (!part_last(part_sems + (long long)(row / parts) * kv_heads + kv_head, parts, threadIdx.x,
                           reinterpret_cast<volatile int*>(sLse), [] { __syncthreads(); }))
                return;
            const float* slot0 = part_acc + ((long long)(row - row % parts) * kv_heads + kv_head) * kPartFloats;
#pragma unroll
            for (int sl = 0; sl < kKeySlabs; ++sl) {
                part_sum<kCols / 8, kThreads>(slot0, kv_heads * kPartFloats, parts, acc_dk[sl], sl, threadIdx.x);
                part_sum<kCols / 8, kThreads>(slot0, kv_heads * kPartFloats, parts, acc_dv[sl], kKeySlabs + sl,
                                              threadIdx.x);
            }
        }
    }

    // dK (scaled) and dV through smem (the K/V tiles are free now), coalesced 16-byte stores of valid keys.
#pragma unroll
    for (int sl = 0; sl < kKeySlabs; ++sl) {
        stage_acc_rows(sK, acc_dk[sl], warp_key0 + sl * 16, col0, g, t4, scale);
        stage_acc_rows(sV, acc_dv[sl], warp_key0 + sl * 16, col0, g, t4, 1.f);
    }
    __syncthreads();
    const StridedRows<elem_t> dk_rows = kb.rows(dkd, dkd_st, dkd_sh, dkc, dkc_st, dkc_sh, kv_head);
    const StridedRows<elem_t> dv_rows = kb.rows(dvd, dvd_st, dvd_sh, dvc, dvc_st, dvc_sh, kv_head);
    store_padded_rows(dk_rows.first, dk_rows.stride, sK, kBlockKeys, w.count);
    store_padded_rows(dv_rows.first, dv_rows.stride, sV, kBlockKeys, w.count);
}
