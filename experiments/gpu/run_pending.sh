#!/usr/bin/env bash
# One device call for the GPU work that landed without a GPU (CPU-verified only), in parts that each fit a call:
#   bash experiments/gpu/run_pending.sh tests   # GPU tests of the changed paths: the dK/dV kernels on heaviest-first
#                                               # key tiles (split and atomic dQ, trees), the custom ops' opcheck;
#                                               # with branch mmaord merged also the ordered-dQ mma.sync backward
#                                               # (DUALKV_MMA_BWD=ordered)
#   bash experiments/gpu/run_pending.sh mma     # Table (branch mmaord): mma.sync split vs ordered backward vs the FA2
#                                               # cascade (#13)
#   bash experiments/gpu/run_pending.sh dqorder # #13: the dQ kernel's load order: tests, vs the previous order, ncu
#   bash experiments/gpu/run_pending.sh lsecp   # #13: LSE / D staged by cp.async: tests, vs plain loads
#   bash experiments/gpu/run_pending.sh mmatable  # #13: mma.sync bwd and fwd+bwd vs the FA2 cascade, 4 shapes
#   bash experiments/gpu/run_pending.sh trees   # tree bench with the forward timed alone (#14: where (a)/(c) lose)
#   bash experiments/gpu/run_pending.sh hd96    # on a checkout with branch hd96 merged: its tests and benchmark
#   bash experiments/gpu/run_pending.sh orders  # the GPU tests under the opt-in orders (DUALKV_TREE_DQ_ORDER=root,
#                                               # DUALKV_KEY_TILE_ORDER=node), default and mma.sync ordered dQ
#   bash experiments/gpu/run_pending.sh orderbench  # order_bench.py: every setting on multi-group micro-batches
#                                               # and trees a, c (own processes, gradients compared bitwise)
#   bash experiments/gpu/run_pending.sh treebench  # tree_bench vs Flex under the orders set in the environment
#   bash experiments/gpu/run_pending.sh defaults   # tree GPU tests; dualkv_tree vs dualkv (depth-1); a 4-group
#                                               # micro-batch vs the cuDNN / FA2 cascades and Flex
#   bash experiments/gpu/run_pending.sh groups8    # the same on an 8-group micro-batch
#   bash experiments/gpu/run_pending.sh hybrid     # DUALKV_PATH=hybrid: GPU tests, vs the cuDNN cascade (1 and 4 groups)
#   bash experiments/gpu/run_pending.sh table1     # the seed's Table 1 shapes at the current defaults vs both cascades
#   bash experiments/gpu/run_pending.sh shared     # DUALKV_TWO_LEVEL_DQ_ORDER=shared: GPU tests and order_bench
#   bash experiments/gpu/run_pending.sh headmajor  # the WS backward's CTA orders (DUALKV_WS_CTA_ORDER tile / head)
#   bash experiments/gpu/run_pending.sh hd96cudnn  # head dim 96 vs the cuDNN / FA2 cascades (#12)
#   bash experiments/gpu/run_pending.sh wsprofile  # ncu source counters of the two-level WS backward (#12)
#   bash experiments/gpu/run_pending.sh wsdefaults # head-major default: GPU tests, order_bench, the
#                                               # head dims 64 / 96 against the cuDNN cascade (dispatch floor)
#   bash experiments/gpu/run_pending.sh ws64       # the warp-specialised backward at head dim 64: tests, vs cuDNN
#   bash experiments/gpu/run_pending.sh dqfirst    # WS backward with dQ_step before dK: timing vs variants, GPU tests
#   bash experiments/gpu/run_pending.sh dqpath     # the WS backward's dQ hand-off bisected (timing variants)
#   bash experiments/gpu/run_pending.sh wsfwd96    # the warp-specialised forward at head dim 96: tests, vs v1, cuDNN
#   bash experiments/gpu/run_pending.sh table1dq   # the head-dim-96 tests, then Table 1 vs the cuDNN cascade
#   bash experiments/gpu/run_pending.sh floor6496  # deterministic=False at head dims 64 / 96: fused, hybrid, cascade
#   bash experiments/gpu/run_pending.sh hybrid6496 # the hybrid and cascade GPU tests (head dims 64, 96, 128)
#   bash experiments/gpu/run_pending.sh wsfinal    # the WS backward's GPU tests and bwd time after a cleanup
#   bash experiments/gpu/run_pending.sh dq96       # head dim 96's dQ rows of 96 columns: tests, vs the cuDNN cascade
#   bash experiments/gpu/run_pending.sh final      # Table 1 and head dims 96 / 64 vs the cuDNN cascade, last commit
#   bash experiments/gpu/run_pending.sh floortests # GPU tests of deterministic=False, the cascade, the hybrid, d=96
#   bash experiments/gpu/run_pending.sh floorjson  # head dims 96 / 64: default, deterministic=False, hybrid, cascade
#   bash experiments/gpu/run_pending.sh ws96       # the same at head dim 96 (128-column tiles), and dualkv verify
#   bash experiments/gpu/run_pending.sh wswide     # #12: the WS backward at head dims 192 / 256: tests, vs cuDNN
#   bash experiments/gpu/run_pending.sh wsfinal2   # #12: its routing test, dualkv verify, d = 256 / 192 vs cuDNN
#   bash experiments/gpu/run_pending.sh wide256    # #12: head dim 256 vs the hybrid and the cuDNN cascade
#   bash experiments/gpu/run_pending.sh widetrees  # the wide WS backward on prefix trees: GPU tests, both dQ orders
#   bash experiments/gpu/run_pending.sh treedq  # #14: the tree backward's dQ hand-off, bisected (tree_bench under
#                                               # DUALKV_EXTRA_DEFINES variants) and profiled (ncu: DRAM / L2 traffic
#                                               # of the warp-specialised backward on workload a, default vs NOSEM)
#   bash experiments/gpu/run_pending.sh tiles16    # #12 A/B: forward key blocks at 128, K in registers (backward), d = 192
#   bash experiments/gpu/run_pending.sh fwd16b     # the 192-key forward: forward-path GPU tests, A/B at 96 and 64
#   bash experiments/gpu/run_pending.sh final16a   # d = 192 forward on 96-key blocks, tree GPU tests, dualkv verify
#   bash experiments/gpu/run_pending.sh final16b   # Table 1 and head dim 192 beside the cuDNN cascade
#   bash experiments/gpu/run_pending.sh final16c   # wide forwards on 80- / 112-key blocks: tests and A/B
#   bash experiments/gpu/run_pending.sh final16d   # dualkv verify and head dim 256 fwd+bwd with this session's tiles
#   bash experiments/gpu/run_pending.sh final16e   # tree and hybrid-path GPU tests on the shipped forward tiles
#   bash experiments/gpu/run_pending.sh atomicprof # #13: ncu of the mma.sync fused atomic dQ against FA2's kernel
#   bash experiments/gpu/run_pending.sh stage17    # #13: the row-run dQ adds, atomic/ordered GPU tests, A/B
#   bash experiments/gpu/run_pending.sh table17    # #13: the mma.sync family against the FA2 cascade, ncu of split
#   bash experiments/gpu/run_pending.sh final17    # #13: the "auto" routing's GPU tests
#   bash experiments/gpu/run_pending.sh verify17   # dualkv verify (with deterministic=False rows), both families
#   bash experiments/gpu/run_pending.sh ordprof    # #13: the ordered dQ mode's stalls (ncu), the one-thread fence
#                                                  # (DKV_DQ_FENCE) tested and A/B
#   bash experiments/gpu/run_pending.sh frag       # #13: the atomic dQ added from registers in fragment order: GPU
#                                                  # tests (cast, atomic modes, trees, paper API), A/B against the
#                                                  # previous commit's package (experiments/gpu/_old, when present)
#   bash experiments/gpu/run_pending.sh ordred     # #13: the ordered dQ mode's adds as REDs: tests, backward
#   bash experiments/gpu/run_pending.sh ordfrag    # #13 (branch ordfrag): the ordered mode in fragment order
#   bash experiments/gpu/run_pending.sh fragtable  # #13: the mma.sync family against the FA2 cascade, 4 shapes;
#                                                  # dualkv verify under it
#   bash experiments/gpu/run_pending.sh ordtable   # #13: split / ordered / atomic against the FA2 cascade, 4 shapes,
#                                                  # and split against ordered at head dims 32, 64, 96
#   bash experiments/gpu/run_pending.sh autoord    # #13: GPU tests of "auto"'s ordered dQ (mma.sync family), the
#                                                  # split backward's, trees split vs ordered, dualkv verify
#   bash experiments/gpu/run_pending.sh mmaprof    # #13 (not yet run): ncu of the ordered / atomic mma.sync backward
#                                                  # and FA2's backward kernel at (8, 8K)
#   bash experiments/gpu/run_pending.sh qwarps     # #13: the dK/dV kernel's FA2-like warp layout (DUALKV_MMA_BWD_QWARPS=2):
#                                                  # GPU tests under it, then bwd A/B against the 16-key layout
#   bash experiments/gpu/run_pending.sh qwarps2    # #13: the FA2-like layout with one dO buffer (the sm_80 fit at d = 128):
#                                                  # GPU tests, A/B at d = 128; both layouts at head dims 32, 64, 96
#   bash experiments/gpu/run_pending.sh qwfinal    # #13: the FA2-like layout as the default (d = 64-128): GPU tests (and
#                                                  # the sm_80 fit's), the mma.sync family against the FA2 cascade
#   bash experiments/gpu/run_pending.sh qwtests    # #13: the rest of the mma.sync family's backward GPU tests on the FA2-like
#                                                  # layout (fp16, paper API, determinism), trees split vs ordered
#   bash experiments/gpu/run_pending.sh release    # #13: the ordered dQ's counter released after the S^T product
#                                                  # (DKV_DQ_RELEASE=1): ordered GPU tests, A/B against the default;
#                                                  # the sm_80 fit (one dO buffer) timed after its fix
#   bash experiments/gpu/run_pending.sh fwdmask    # #13: the forward's unmasked-block loop: forward GPU tests (both
#                                                  # families), fwd A/B against experiments/gpu/_old and K early
#                                                  # (run at 7155be3+fwdmask; its variants' switches since removed)
#   bash experiments/gpu/run_pending.sh defer      # #13: the ordered dQ's adds one S^T product later (DKV_DQ_DEFER=1):
#                                                  # ordered GPU tests under it, backward A/B (and the sm_80 fit's)
#                                                  # (run at 7155be3+defer; the switch since removed)
#   bash experiments/gpu/run_pending.sh lsestage   # #13: LSE / D staged one row per thread: bwd A/B against
#                                                  # experiments/gpu/_old, the mma.sync backward GPU tests
#   bash experiments/gpu/run_pending.sh final22    # #13's table (mma.sync vs the FA2 cascade) and #12's three shapes
#                                                  # below target (default vs the cuDNN cascade), one call; a probe of
#                                                  # the d = 128 WS backward with three Q/dO stages
#   bash experiments/gpu/run_pending.sh wsstages3  # #12: GPU tests of the WS backward on three stages at d = 128
#   bash experiments/gpu/run_pending.sh s23stages  # #12: dualkv verify; three against two stages at d = 128 on the
#                                                  # small Table 1 shapes (bwd, own processes)
#   bash experiments/gpu/run_pending.sh s23mask    # #12 / #13: P^T masked only where needed (DKV_MASK_SPLIT), bwd A/B
#                                                  # (run at f5c6be5+masksplit; the switch since removed)
#   bash experiments/gpu/run_pending.sh s23tests   # its GPU tests as the default (WS backward, mma.sync ordered), verify
#   bash experiments/gpu/run_pending.sh s23tables  # #12 Table 1 vs the cuDNN cascade, #13 vs the FA2 cascade
#   bash experiments/gpu/run_pending.sh s23put     # #12: the WS dQ_step put (DKV_DQ_PUT2), the wide unmasked P^T: bwd A/B
#                                                  # (run at 8f6f808+put2; the switches since removed)
#   bash experiments/gpu/run_pending.sh s23wide    # #12: GPU tests of those as the d = 256 build, dualkv verify
#   bash experiments/gpu/run_pending.sh s23prof    # #12: wsprof2 (ncu of the d = 128 WS backward) at this session's end
#   bash experiments/gpu/run_pending.sh s24lse     # #12: LSE / D by 8-byte loads (DKV_LSE_VEC, since removed), bwd A/B
#                                                  # at d = 128 / 256; then d = 256 against the cuDNN cascade
#   bash experiments/gpu/run_pending.sh s24searly  # #12: the next step's S^T behind this step's dK (DKV_WS_S_EARLY, since
#                                                  # removed): A/B, tests, verify
#   bash experiments/gpu/run_pending.sh s24poly    # #12: part of P^T's exponentials on the FMA pipe (DKV_EXP_POLY, since
#                                                  # removed): A/B, then tests and verify when faster
#   bash experiments/gpu/run_pending.sh s24diag    # #12: the WS backward's wrong-dQ diagnostics (halfred, nored, ...)
#   bash experiments/gpu/run_pending.sh s24qdo     # #12: half the Q / dO bytes (halfqdo), the bound on a multicast
#   bash experiments/gpu/run_pending.sh s24qdo2    # #12: the same on the shared (non-causal) steps only
#   bash experiments/gpu/run_pending.sh s25split   # #12 / #13: the shared-first dQ order with the split head-major CTA
#                                                  # order (heavy tiles of every KV head first): its GPU test, bwd A/B
#   bash experiments/gpu/run_pending.sh s25tests   # its GPU tests as the default (WS backward, mma.sync ordered, depth-1
#                                                  # trees against two-level calls), dualkv verify; then s23tables
#   bash experiments/gpu/run_pending.sh s25mma     # #13: the ordered mma.sync backward head-major (DUALKV_MMA_CTA_ORDER)
#                                                  # and with LSE / D one row per thread (DKV_SHARED_FIRST_ROW_STATS):
#                                                  # the CTA-order GPU tests, bwd A/B
#   bash experiments/gpu/run_pending.sh s25final   # the ordered mode's GPU tests with LSE / D one row per thread (sm_90
#                                                  # shared-first default), then #13's table (s23tables' table13)
#   bash experiments/gpu/run_pending.sh s25floor   # #12 dispatch floor at the new default: fused, hybrid and cuDNN cascade
#                                                  # at head dims 64 / 96 / 128
#   bash experiments/gpu/run_pending.sh s26a       # the GPU tests changed after session 25's last call (opcheck, the WS
#                                                  # split spy, the WS depth-1 tree's dQ bits); short prompts with long
#                                                  # responses (the common RL case) against both cascades
#   bash experiments/gpu/run_pending.sh s26b       # the WS backward's split shared-key tiles (ws_split.py): its GPU tests,
#                                                  # bwd A/B off / auto at short prompts, against the cuDNN cascade
#   bash experiments/gpu/run_pending.sh s26c       # its GPU tests as the default: the WS backward's suite, dualkv verify
#   bash experiments/gpu/run_pending.sh s26d       # the split in the mma.sync ordered dQ mode: its GPU tests, the ordered
#                                                  # suite, bwd A/B off / auto at short prompts, against the FA2 cascade
#   bash experiments/gpu/run_pending.sh s26e       # the CTA-order tests with the split off in their helper, the ordered suite
#   bash experiments/gpu/run_pending.sh s26f       # the split's A/B off / auto at more one-group shapes and at 28 / 4 heads
#   bash experiments/gpu/run_pending.sh s27rl      # realistic RL micro-batches (groups, ragged responses): both families,
#                                                  # both cascades, and the split off
#   bash experiments/gpu/run_pending.sh s27fix     # the mma.sync dQ adds past a step's last query in place: suites,
#                                                  # verify (mma), ragged micro-batches, Table 1 against FA2
#   bash experiments/gpu/run_pending.sh s28next    # what session 28 ran only in part: the mma.sync family's backward and
#                                                  # tree suites (atomic included) and verify under DUALKV_KERNELS=mma,
#                                                  # ragged micro-batches and Table 1 against the FA2 cascade, per-kernel
#                                                  # times against fb9d77d (needs _hd: git archive fb9d77d dualkv)
#   bash experiments/gpu/run_pending.sh s29addr32  # the mma.sync dK/dV kernel's 32-bit ldmatrix address builds
#                                                  # (DKV_DKDV_ADDR32 = 1, 2) against the default 0, per kernel
#   bash experiments/gpu/run_pending.sh s29addr32t # their GPU tests and verify (ADDR32=1|2, default 2)
#   bash experiments/gpu/run_pending.sh s29addr32b # Table 1's shapes against the FA2 cascade, 0 and $ADDR32
#   bash experiments/gpu/run_pending.sh s30nvrtc   # the dK/dV addressing modes under NVRTC 13.5, then both releases' defaults
#   bash experiments/gpu/run_pending.sh s30mode1   # the dK/dV addressing mode 1 through the GPU tests (NVRTC 13.0), atomic builds' modes timed
#   bash experiments/gpu/run_pending.sh s30final   # the default (spill-free addressing mode per dK/dV build): tests, verify, Table 1 vs FA2 cascade
#   bash experiments/gpu/run_pending.sh s31next    # #13 at the per-build default: (16, 64K), FA2 N-copy, ragged RL rows (ran:
#                                                  # the t1 step, (16, 32K) and (16, 64K) with FA2 N-copy, hit its 250 s limit)
#   bash experiments/gpu/run_pending.sh s31ncu     # #13: ncu of the ordered dK/dV kernel (kept mode) against FA2's at (8, 8K)
#   bash experiments/gpu/run_pending.sh s31fwd     # #13: the forward's tile in smem (DKV_FWD_TILE_SMEM): tests, verify, NVRTC 13.0 / 13.5 A/B
#   bash experiments/gpu/run_pending.sh s31swz     # #13: swizzled Q / dO tiles in the dK/dV kernel: tests, A/B; (16, 64K)
#   bash experiments/gpu/run_pending.sh s31final   # #13: swizzled forward (since removed): tests, verify, A/B; 2do1 tests; Table 1
#   bash experiments/gpu/run_pending.sh s31check   # #13: the default backward against padded Q / dO tiles, fwd+bwd processes
#   bash experiments/gpu/run_pending.sh s32next    # #13: Table 1 rows of the mma.sync family vs FA2 cascade; ncu (not yet run)
#   bash experiments/gpu/run_pending.sh s32mid     # #13: DKV_DQ_MID / DKV_DQ_QSTART_AGAIN A/B, 13.0 and 13.5 (ran; dropped)
#   bash experiments/gpu/run_pending.sh s32t135    # #13: Table 1 rows of the mma family under NVRTC 13.5; fwd ncu vs FA2; tests
#   bash experiments/gpu/run_pending.sh s32final   # #13: verify (mma, 13.0); fwd tests and ragged RL rows under 13.5
#   bash experiments/gpu/run_pending.sh s32geom    # #13: DKV_FWD_GEOM_EARLY A/B (13.0, 13.5), forward tests with it (ran)
#   bash experiments/gpu/run_pending.sh s33seg     # #13: DKV_STEP_SEG_SMEM A/B (13.0, 13.5) (ran; the macro is gone)
#   bash experiments/gpu/run_pending.sh s33table   # #13: Table 1 rows of the mma family at s32's defaults, 13.0 and 13.5 (ran;
#                                                  # its 13.0 rows and the 13.5 forward ran non-preferred builds: s33cache)
#   bash experiments/gpu/run_pending.sh s33fix     # #13: the rows again with -v compilations bypassing NVRTC's cache, and
#                                                  # a precompile after a lazy compile checked to keep the same builds (ran)
#   bash experiments/gpu/run_pending.sh s33cache   # #13: which cubins a timing ran (DUALKV_BUILD_LOG), lazily compiled or
#                                                  # precompiled, NVRTC 13.0 and 13.5 (ran at fe05ae9)
#   bash experiments/gpu/run_pending.sh s33final   # #13: dualkv verify and the family's backward tests at the end of s33
#                                                  # (ran at 19397e5)
#   bash experiments/gpu/run_pending.sh s33rl      # #13: the ragged RL micro-batches of s32final under the machine's
#                                                  # NVRTC 13.0 (ran at 4b5d741)
#   bash experiments/gpu/run_pending.sh s33hopper  # #12: the default family against the cuDNN cascade at three of Table 1's
#                                                  # shapes, a check after s27-s33's mma.sync work (ran at a090de0)
#   bash experiments/gpu/run_pending.sh s33atomic  # #13: the atomic-dQ dK/dV build's addressing modes under NVRTC 13.0
#                                                  # (ran at 53f72d3)
#   bash experiments/gpu/run_pending.sh s34mc      # #12: the WS backward's Q / dO multicast to CTA pairs: bitwise check
#                                                  # against the plain build, backward A/B (ran at 111df8e; removed)
#   bash experiments/gpu/run_pending.sh s34mc2     # #12: why the multicast is slower: each build with and without the dQ
#                                                  # order's waits (ran at f095d4d; removed)
#   bash experiments/gpu/run_pending.sh s34red     # #12: dQ_step added from the consumers' registers (DKV_DBG_DIRECTRED,
#                                                  # unordered) against the smem hand-off (ran at fc03c05; removed)
#   bash experiments/gpu/run_pending.sh s34final   # #12: the default (Hopper) family's verify and GPU tests at the end of s34
#   bash experiments/gpu/run_pending.sh s34ncu     # #12: ncu of every backward kernel of dualkv and of the cuDNN cascade at
#                                                  # (16, 32K): speed of light, compute and memory workload sections
#   bash experiments/gpu/run_pending.sh s34table   # #12: Table 1's six shapes, the default family against the cuDNN cascade,
#                                                  # one process (the README's headline at the end of s34)
#   bash experiments/gpu/run_pending.sh s34split   # #12: forced shared-tile splits (DUALKV_WS_SPLIT=2, 3) where auto does
#                                                  # not split: Table 1's three smaller shapes, backward (ran: slower)
#   bash experiments/gpu/run_pending.sh s35fwd     # #12/#13: the forwards' lazy rescale (DKV_SOFTMAX_LAZY) and the WS
#                                                  # forward's softmax overlapping its own P V (DKV_FWD_WAIT1): A/B, ncu
#   bash experiments/gpu/run_pending.sh s35final   # #12/#13: the new forward defaults (lazy rescale; d = 128 WS forward on
#                                                  # 128-key blocks with its overlap): verify and forward GPU tests, both families
#   bash experiments/gpu/run_pending.sh s35table   # #12/#13: Table 1 rows at the new forward defaults (both families, both cascades)
#   bash experiments/gpu/run_pending.sh s37check   # s36's review fixes: verify, GPU tests (both families), 2-GPU tests
#                                                  # (kind nvidia-h200-x2)
#   bash experiments/gpu/run_pending.sh s37rest    # s37check's two timed-out test steps, on the 1-GPU machine
#   bash experiments/gpu/run_pending.sh s37def     # s37rest's stopped step alone, long limit, durations, build log
#   bash experiments/gpu/run_pending.sh s37pair    # two copies of that step at once on one GPU, faulthandler timeout
#   bash experiments/gpu/run_pending.sh s38a       # s37's CPU-side fixes: default-family tests, verify (both), mma fwd tests
#   bash experiments/gpu/run_pending.sh s38b       # the rest of the GPU test files, two processes (after s38a)
#   bash experiments/gpu/run_pending.sh s38mg      # 2 GPUs: the default-family tests on both at once, cores split; 2-GPU tests
#   bash experiments/gpu/run_pending.sh s38mg2     # its control: the same without the split (torch's default threads)
#   bash experiments/gpu/run_pending.sh s38bench   # the bench CLI after s38's fixes, on a GPU (tiny layer/model, ragged kernel)
#   bash experiments/gpu/run_pending.sh s39final   # #13: DKV_DKDV_SMEM32=7 the default under NVRTC 13.0: verify (mma), tests
#   bash experiments/gpu/run_pending.sh s39table   # #13: its Table 1 rows against the FA2 cascade, ordered-dQ tests
#   bash experiments/gpu/run_pending.sh s39def     # #13: the same default in the default family: verify, its GPU tests
#   bash experiments/gpu/run_pending.sh s39rest    # #13: the rest of the GPU test files at that default (after s39def)
#   bash experiments/gpu/run_pending.sh s39rl      # #13: ragged RL micro-batches of the mma.sync family at that default
#   bash experiments/gpu/run_pending.sh s39n135    # #13: the same macro under NVRTC 13.5 (A/B; needs build/nvrtc135.tar.xz)
#   bash experiments/gpu/run_pending.sh s40a       # 2 GPUs: TRL's end-to-end GRPO (GPU 1) beside #13's ordered-dQ orders at
#                                                  # (16, 32K) / (16, 64K) (GPU 0)
#   bash experiments/gpu/run_pending.sh s40b       # 2 GPUs: veRL 2-GPU parity and tests; the row gathers' GPU tests; TRL
#                                                  # curves run twice at once, compared bit for bit
#   bash experiments/gpu/run_pending.sh s40c       # 2 GPUs: GPU tests of the paths the row gathers changed; TRL curves at
#                                                  # four more seeds (stock, stock_eager, dualkv)
#   bash experiments/gpu/run_pending.sh s40d       # dualkv verify with the run-to-run repeat rows; their GPU test, both families
#   bash experiments/gpu/run_pending.sh s40e       # TRL end-to-end GRPO (three settings) alone on one H200
#   bash experiments/gpu/run_pending.sh s42layer   # #12 item 1 at the layer level: the bench systems' GPU tests (cuDNN N-copy
#                                                  # and cascade fwd+bwd against the fp64 layer), then bench layer with
#                                                  # dualkv, the cuDNN cascade, cuDNN and FA2 N-copy, 10 timed runs
#   bash experiments/gpu/run_pending.sh s43model   # the whole qwen3-1.7b model, dualkv vs the cuDNN cascade / cuDNN N-copy /
#                                                  # FA2 N-copy, 10 timed runs per row; the layer systems' GPU tests
#   bash experiments/gpu/run_pending.sh s43trl     # TRL's GRPO, long setting, 11 steps per system (the TRL row's spread)
#   bash experiments/gpu/run_pending.sh s43peers   # Table 1's FA2 N-copy and FlexAttention columns with spread, dualkv beside each
#   bash experiments/gpu/run_pending.sh s42verl    # veRL's policy update, stock vs dualkv at N = $VERL_N (default 8), $VERL_REPS
#                                                  # (default 10) timed runs per phase, every run recorded (the README's
#                                                  # veRL rows' spread); N = 32 fits one call with VERL_REPS=5
#   bash experiments/gpu/run_pending.sh s39addr    # #13: the dK/dV kernel's 32-bit shared addresses (DKV_DKDV_SMEM32=7) under
#                                                  # NVRTC 13.0: bwd A/B (default / the macro / the macro in mode 0), tests
#   bash experiments/gpu/run_pending.sh s35d96     # #12/#13: old / new forward defaults alternating (d = 128, both families);
#                                                  # the d = 96 WS forward on 128-key blocks with its overlap: A/B and tests
#   bash experiments/gpu/run_pending.sh s35hd      # #12: the WS forward's overlap at head dims 64 (128-key blocks), 192, 256
#   bash experiments/gpu/run_pending.sh s35t1      # #12: Table 1's six shapes, dualkv against the cuDNN cascade, at the end of s35
#   bash experiments/gpu/run_pending.sh s36rest    # #12/#13: the GPU test files s35final does not run (trees, ordered dQ, hybrid, ...)
#   bash experiments/gpu/run_pending.sh s36t135    # #13: the mma.sync family against the FA2 cascade under NVRTC 13.5, four shapes
#   bash experiments/gpu/run_pending.sh s36fwd144  # #12: the WS forward (overlap) on 144- / 160-key blocks at d = 96 / 128 (no gain)
#   bash experiments/gpu/run_pending.sh s32nvrtc   # #12/#13: NVRTC 13.5 vs 13.0 at the s31 defaults (ran in s36)
#   bash experiments/gpu/run_pending.sh s28nvrtc   # the kernels compiled by NVRTC 13.5 (DUALKV_NVRTC_LIB) against the
#                                                  # machine's 13.0: both families and both cascades, alternating; needs
#                                                  # build/nvrtc135.tar.xz carried (see the part)
#   bash experiments/gpu/run_pending.sh s26next    # what the last commits of session 26 had not run on a GPU: the WS suite,
#                                                  # the split tests, the wgmma_v1 pair (DKV_DKDV_PARAMS' new arguments),
#                                                  # head dim 96, dualkv verify
# Everything lands in $OUT (JSON + logs); each step has its own time limit so one hang does not take the rest.
set -u
source "$(dirname "$0")/device_env.sh"
tail -2 "$OUT/compile.log"
# Test steps run side by side (two pytest processes) need the cores split between them (OMP_NUM_THREADS = cores /
# processes): the GPU tests compute their float64 oracle on the CPU, and with torch's default threads two processes
# oversubscribe the CPUs and each runs 2-3x slower (s38mg / s38mg2: 385 tests in 73 s each, split, against 138 in 150 s).
step() {  # step NAME SECONDS CMD...: run with a limit, keep the log, print its tail
    local name=$1 limit=$2; shift 2
    timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "== $name: exit $? ($(date -u +%H:%M:%S))"; tail -${TAIL:-6} "$OUT/$name.log"
}
rest_tests() {  # rest_tests SECONDS: the GPU test files beside the default family's forward / paper-API / backward
    # ones, in two processes at once on one GPU (steps pytest_a, pytest_b): trees, ordered dQ, dQ layout, input errors,
    # tree reference; the hybrid, head dim 96, the cascade, WS trees and splits, the HF backend, log-probs. Each process
    # gets half the cores for torch's CPU threads (the tests' float64 oracle runs there; s38mg: a process with every
    # core beside another ran 138 of 385 tests in 150 s, with half of them 385 in 73 s)
    local threads=${OMP_NUM_THREADS:-$(( $(nproc) / 2 ))}
    ( OMP_NUM_THREADS=$threads TAIL=3 step pytest_a $1 python3 -m pytest -q -m gpu -p no:cacheprovider \
        proofs_tests/test_tree_cuda.py \
        proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_dq_layout.py proofs_tests/test_input_errors.py \
        proofs_tests/test_tree_reference.py &
      OMP_NUM_THREADS=$threads TAIL=3 step pytest_b $1 python3 -m pytest -q -m gpu -p no:cacheprovider \
        proofs_tests/test_hybrid_path.py \
        proofs_tests/test_cuda_hd96.py proofs_tests/test_cascade.py proofs_tests/test_tree_cuda_ws.py \
        proofs_tests/test_cuda_ws_split.py proofs_tests/test_hf_gpu.py proofs_tests/test_cuda_logprobs.py &
      wait )
}
default_tests_both_gpus() {  # default_tests_both_gpus SECONDS: the default family's forward / paper-API / backward
    # GPU tests on GPU 0 and GPU 1 at once (steps pytest_gpu0, pytest_gpu1; the caller's OMP_NUM_THREADS, else half
    # the cores each, as rest_tests)
    local threads=${OMP_NUM_THREADS:-$(( $(nproc) / 2 ))}
    for g in 0 1; do
        OMP_NUM_THREADS=$threads CUDA_VISIBLE_DEVICES=$g TAIL=3 step pytest_gpu$g $1 python3 -m pytest -q -m gpu \
            -p no:cacheprovider proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_paper_api.py \
            proofs_tests/test_cuda_backward.py &
    done
    wait
}
table1_bench() {  # table1_bench PREFIX SYSTEMS TAIL_A TAIL_B: the seed's Table 1 in two processes (steps PREFIXa,
    # PREFIXb), so the first half's JSON survives a time limit
    mkdir -p "$OUT/bench"
    TAIL=$3 step ${1}a 230 python3 -m dualkv bench kernel --shapes 28:4096,8:8192,28:16384,16:32768 \
        --systems $2 --mode fwd,bwd,fwdbwd --out "$OUT/bench"
    TAIL=$4 step ${1}b 230 python3 -m dualkv bench kernel --shapes 16:65536,4:131072 \
        --systems $2 --mode fwd,bwd,fwdbwd --out "$OUT/bench"
}
nvrtc135_unpack() {  # nvrtc135_unpack PART: NVRTC 13.5 from the carried build/nvrtc135.tar.xz into /tmp/nv135 (see
    # s28nvrtc for making it), and its version (step nvrtc_version); exits naming PART when it was not carried
    [ -f build/nvrtc135.tar.xz ] || { echo "$1 needs build/nvrtc135.tar.xz (carried)"; exit 2; }
    mkdir -p /tmp/nv135 && tar xJf build/nvrtc135.tar.xz -C /tmp/nv135
    DUALKV_NVRTC_LIB=/tmp/nv135 step nvrtc_version 60 python3 -c "from dualkv.cuda.build import nvrtc_version; \
print('NVRTC', nvrtc_version())"
}
mma_bwd_ab() {  # mma_bwd_ab PART "VARIANTS" SECONDS: the mma.sync backward (dualkv_mma, dualkv_mma_atomic) at (8, 8K) /
    # (16, 32K) for each variant (variants_warm / variants_ab entries), two rounds of alternating processes of SECONDS
    # each; the table as $OUT/PART-table.json, logs and rows in $OUT/PART.tgz
    variants_warm "$2" --systems dualkv_mma,dualkv_mma_atomic --shapes 8:8192 --mode bwd --reps 1
    variants_ab "$2" 2 "$3" --systems dualkv_mma,dualkv_mma_atomic --shapes 8:8192,16:32768 --mode bwd --reps 10
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/$1-table.json"
    (cd "$OUT" && tar czf "$1.tgz" *.log bench && rm -rf ab[12]_*.log warm_*.log bench)
}
nowait_ab() {  # nowait_ab VALUE SUFFIX SHAPES: two rounds, alternating processes, of the mma.sync backward (bwd, 5 reps,
    # into $OUT/bench): the default and the atomic dQ (steps ab<round>_d), then the ordered mode built with
    # DKV_DBG_NOWAIT=VALUE, its commit labelled +SUFFIX (steps ab<round>_n)
    mkdir -p "$OUT/bench"
    for round in 1 2; do
        TAIL=1 step ab${round}_d 150 python3 -m dualkv bench kernel --systems dualkv_mma,dualkv_mma_atomic \
            --shapes $3 --mode bwd --reps 5 --out "$OUT/bench/ab${round}_d"
        DUALKV_EXTRA_DEFINES=DKV_DBG_NOWAIT=$1 DUALKV_COMMIT="${DUALKV_COMMIT:-}$2" TAIL=1 step ab${round}_n 150 \
            python3 -m dualkv bench kernel --systems dualkv_mma --shapes $3 --mode bwd --reps 5 \
            --out "$OUT/bench/ab${round}_n"
    done
}
fixed_probes() {  # fixed_probes PROBE...: bwd at (28, 4K) and (16, 32K), 5 reps, into $OUT/bench: the ordered and atomic
    # modes (step ref), then the fixed-point build (branch s41-fixed-dq) under DKV_FIXED_PROBE=PROBE each (steps pPROBE)
    mkdir -p "$OUT/bench"
    TAIL=1 step ref 200 python3 -m dualkv bench kernel --systems dualkv_mma,dualkv_mma_atomic \
        --shapes 28:4096,16:32768 --mode bwd --reps 5 --out "$OUT/bench/ref"
    local p
    for p in "$@"; do
        DUALKV_EXTRA_DEFINES=DKV_FIXED_PROBE=$p DUALKV_COMMIT="${DUALKV_COMMIT:-}+probe$p" TAIL=1 step p$p 100 \
            python3 -m dualkv bench kernel --systems dualkv_mma_fixed --shapes 28:4096,16:32768 --mode bwd --reps 5 \
            --out "$OUT/bench/p$p"
    done
}
mma_warm() {  # mma_warm NAME SECONDS: the mma.sync family's kernels for sm_90 precompiled (step NAME), under the caller's
    # DUALKV_NVRTC_LIB / DUALKV_EXTRA_DEFINES
    step "$1" "$2" python3 -m dualkv kernels --compile-only --arch sm_90 --kernel fwd --kernel bwd_dkdv \
        --kernel bwd_prep --kernel bwd_dq_frag_cast --kernel bwd_dq --jobs 16 --no-progress
}
mma_table135() {  # mma_table135 PART: NVRTC 13.5 (nvrtc135_unpack PART; exported for the rest of the part), then
    # mma_table warm135 150
    nvrtc135_unpack $1
    export DUALKV_NVRTC_LIB=/tmp/nv135
    mma_table warm135 150
}
mma_table() {  # mma_table NAME SECONDS: the mma.sync kernels compiled (mma_warm NAME SECONDS), then Table 1's rows of the
    # family against the FA2 cascade into $OUT/bench: t1, three shapes in one process (10 reps); t64, (16, 64K) in
    # another (5 reps)
    mma_warm "$1" "$2"
    mkdir -p "$OUT/bench"
    TAIL=1 step t1 200 python3 -m dualkv bench kernel --systems dualkv_mma,cascade --shapes 28:4096,8:8192,16:32768 \
        --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/t1"
    TAIL=1 step t64 120 python3 -m dualkv bench kernel --systems dualkv_mma,cascade --shapes 16:65536 \
        --mode fwd,bwd,fwdbwd --reps 5 --out "$OUT/bench/t64"
}
nvrtc_release_bench() {  # nvrtc_release_bench SECONDS: both families and both cascades at (8, 8K) and (16, 32K) in three
    # processes (steps b1_130, b1_135, b2_130): the machine's NVRTC, /tmp/nv135's, the machine's again; into $OUT/bench
    mkdir -p "$OUT/bench"
    for run in 1_130 1_135 2_130; do
        lib=$([ "${run#*_}" = 135 ] && echo /tmp/nv135 || echo "")
        DUALKV_NVRTC_LIB=$lib DUALKV_COMMIT="${DUALKV_COMMIT:-}+nvrtc${run#*_}" TAIL=1 step b$run $1 \
            python3 -m dualkv bench kernel --systems dualkv,dualkv_mma,cudnn_cascade,cascade \
            --shapes 8:8192,16:32768 --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/b$run"
    done
}
ncu_export() {  # ncu_export NAME: $OUT/NAME.ncu-rep (if ncu wrote it) to $OUT/NAME.txt (details) and NAME.csv.gz
    # (SASS source page), then removed
    [ -f "$OUT/$1.ncu-rep" ] || return 0
    ncu --import "$OUT/$1.ncu-rep" --page details > "$OUT/$1.txt" 2>&1
    ncu --import "$OUT/$1.ncu-rep" --page source --print-source sass --csv | gzip > "$OUT/$1.csv.gz"
    rm -f "$OUT/$1.ncu-rep"
}
mma_bwd_ncu() {  # mma_bwd_ncu WHO...: ncu (source counters, warp stalls, memory and compute workload) of one launch at
    # (8, 8K) per WHO: ordered (dualkv's bwd_dkdv, deterministic), atomic (deterministic=False), fa2 (FA2's dq_dk_dv);
    # $OUT/ncu_WHO.txt (details) and .csv.gz (SASS source page)
    local who k sys det
    for who in "$@"; do
        k="regex:bwd_dkdv$"; sys=dualkv; det=1; [ $who = fa2 ] && { k="regex:flash_bwd_dq_dk_dv"; sys=fa2; }
        [ $who = atomic ] && det=0
        DUALKV_DETERMINISTIC=$det DUALKV_PATH=fused DUALKV_MMA_BWD=auto TAIL=2 step ncu_$who 200 ncu --clock-control none \
            --profile-from-start off -k "$k" --section SourceCounters --section WarpStateStats \
            --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis -c 1 -f -o "$OUT/ncu_$who" \
            python3 experiments/gpu/profile_bwd.py --family mma --shape 8:8192 --systems $sys
        ncu_export ncu_$who
    done
}
mma_fwd_ncu() {  # mma_fwd_ncu SHAPE WHO...: ncu (source counters, warp stalls, memory and compute workload) of the
    # forward at SHAPE per WHO: dualkv (the mma.sync dualkv_fwd, one launch) or fa2 (FA2's three flash_fwd launches of the
    # FA2 cascade); $OUT/ncu_fwd_WHO.txt (details) and .csv.gz (SASS source page)
    local shape=$1 who k sys c; shift
    for who in "$@"; do
        k="regex:dualkv_fwd$"; sys=dualkv; c=1; [ $who = fa2 ] && { k="regex:flash_fwd"; sys=fa2; c=3; }
        TAIL=2 step ncu_fwd_$who 200 ncu --clock-control none --profile-from-start off -k "$k" --section SourceCounters \
            --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis -c $c -f \
            -o "$OUT/ncu_fwd_$who" python3 experiments/gpu/profile_bwd.py --pass fwd --family mma --shape $shape \
            --systems $sys
        ncu_export ncu_fwd_$who
    done
}
rl() {  # rl NAME SYSTEMS GROUPS SHAPES RANGE: one `dualkv bench kernel` process (step NAME) on micro-batches of GROUPS
    # groups with ragged responses (--R-range RANGE), fwd / bwd / fwd+bwd, into $OUT/bench/NAME
    mkdir -p "$OUT/bench"
    TAIL=1 step $1 170 python3 -m dualkv bench kernel --systems $2 --groups $3 --shapes $4 --R-range $5 \
        --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/$1"
}
head_dim_bench() {  # head_dim_bench PREFIX SECONDS SYSTEMS MODES DIM...: $SHAPES (default (16, 4K), (8, 8K),
    # (16, 32K)) at each head dim, one process (step PREFIX<dim>) each
    local prefix=$1 limit=$2 systems=$3 modes=$4; shift 4
    mkdir -p "$OUT/bench"
    for d in "$@"; do
        step $prefix$d $limit python3 -m dualkv bench kernel --head-dim $d --shapes ${SHAPES:-16:4096,8:8192,16:32768} \
            --systems $systems --mode $modes --out "$OUT/bench"
    done
}
mma_backward_tests() {  # mma_backward_tests NAME [SECONDS]: the backward and tree GPU tests under the mma.sync family
    # (step NAME, 300 s unless given; the warp-specialised, prep, opcheck and torch.compile tests left out)
    DUALKV_KERNELS=mma step "$1" "${2:-300}" python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_backward.py proofs_tests/test_tree_cuda.py \
        -k "not ws_backward and not prep_kernel and not opcheck and not compile"
}
ordered_tests() {  # ordered_tests NAME: the mma.sync ordered dQ mode's GPU tests (steps NAME: two-level and paper API;
    # NAME_tree: trees, whose atomic-dQ test expects the mode "ordered" overrides), under the caller's
    # DUALKV_EXTRA_DEFINES
    DUALKV_KERNELS=mma DUALKV_MMA_BWD=ordered TAIL=3 step "$1" 200 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_cuda_paper_api.py
    DUALKV_KERNELS=mma DUALKV_MMA_BWD=ordered TAIL=3 step "$1_tree" 200 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_tree_cuda.py -k "not atomic"
}
ws_backward_tests() {  # ws_backward_tests NAME SECONDS: the warp-specialised backward's GPU tests (two-level at every
    # head dim, the bf16 sweep, trees; step NAME), under the caller's DUALKV_EXTRA_DEFINES
    TAIL=3 step "$1" "$2" python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py \
        proofs_tests/test_tree_cuda_ws.py -k "ws_backward or (shared_prefix_gradients and bf16) or tree"
}
variants_warm() {  # variants_warm "NAME:DEFINES:NVRTC_LIB ..." BENCH_ARGS...: one short `dualkv bench kernel BENCH_ARGS`
    # per variant, all at once, so that each compiles its kernels (DUALKV_EXTRA_DEFINES=DEFINES, DUALKV_NVRTC_LIB=NVRTC_LIB,
    # empty for the machine's); logs $OUT/warm_NAME.log
    local list=$1 v name defs lib; shift
    for v in $list; do
        IFS=: read -r name defs lib <<< "$v"
        DUALKV_EXTRA_DEFINES=$defs DUALKV_NVRTC_LIB=$lib timeout 200 python3 -m dualkv bench kernel "$@" \
            --out /tmp/warm_$name > "$OUT/warm_$name.log" 2>&1 &
    done
    wait
    echo "== warm-up done ($(date -u +%H:%M:%S))"
}
variants_ab() {  # variants_ab "NAME:DEFINES:NVRTC_LIB[:TILES] ..." ROUNDS SECONDS BENCH_ARGS...: ROUNDS rounds of one
    # `dualkv bench kernel BENCH_ARGS` process per variant in order (steps and $OUT/bench folders ab<round>_NAME);
    # TILES (the rest of the entry, e.g. SM90_WS_FWD_TILES:128:block_n=144) runs it under experiments/gpu/with_tiles.py
    local list=$1 rounds=$2 limit=$3 round v name defs lib tiles run; shift 3
    mkdir -p "$OUT/bench"
    for round in $(seq "$rounds"); do
        for v in $list; do
            IFS=: read -r name defs lib tiles <<< "$v"
            run=(-m dualkv bench kernel); [ -n "$tiles" ] && run=(experiments/gpu/with_tiles.py "$tiles" -- "${run[@]}")
            DUALKV_EXTRA_DEFINES=$defs DUALKV_NVRTC_LIB=$lib DUALKV_COMMIT="${DUALKV_COMMIT:-}+$name" TAIL=1 \
                step "ab${round}_$name" "$limit" python3 "${run[@]}" "$@" --out "$OUT/bench/ab${round}_$name"
        done
    done
}
define_ab() {  # define_ab MACRO "V1 V2 ..." PREFIX SECONDS BENCH_ARGS...: one `dualkv bench kernel BENCH_ARGS` process
    # per value, in order, built with DUALKV_EXTRA_DEFINES=MACRO=value (step and $OUT/bench folder PREFIX<run>_<value>)
    local macro=$1 values=$2 prefix=$3 limit=$4 i=0 v
    shift 4
    mkdir -p "$OUT/bench"
    for v in $values; do
        i=$((i + 1))
        DUALKV_EXTRA_DEFINES=$macro=$v step "$prefix${i}_$v" "$limit" python3 -m dualkv bench kernel "$@" \
            --out "$OUT/bench/$prefix${i}_$v"
    done
}
ws_ncu_profile() {  # ws_ncu_profile SECONDS NAME: ncu of the default WS backward at (16, 32K) (step ncu_ws): source
    # counters with the SASS (CSV), warp states, speed of light; the exports in NAME.tgz
    TAIL=3 step ncu_ws "$1" ncu --clock-control none --profile-from-start off -k regex:bwd_sm90_ws \
        --section SourceCounters --section WarpStateStats --section SpeedOfLight -c 1 -f -o "$OUT/ncu_ws" \
        python3 experiments/gpu/profile_bwd.py --systems dualkv --shape 16:32768
    if [ -f "$OUT/ncu_ws.ncu-rep" ]; then
        ncu --import "$OUT/ncu_ws.ncu-rep" --page source --print-source sass --csv | gzip > "$OUT/ncu_ws_src.csv.gz"
        ncu --import "$OUT/ncu_ws.ncu-rep" --page details > "$OUT/ncu_ws.txt" 2>&1
        rm -f "$OUT/ncu_ws.ncu-rep"
    fi
    (cd "$OUT" && tar czf "$2.tgz" ncu_ws* && rm -f ncu_ws_src.csv.gz ncu_ws.txt ncu_ws.log)
}
case "${1:-tests}" in
tests)
    # test_cuda_ordered_dq.py exists where branch mmaord is merged (the gpu-pending checkout)
    files=$(ls proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_cuda_backward.py proofs_tests/test_cuda_paper_api.py \
        proofs_tests/test_tree_cuda.py proofs_tests/test_tree_cuda_ws.py 2>/dev/null)
    step pytest_changed 420 python3 -m pytest -q -m gpu -p no:cacheprovider $files
    if [ -f proofs_tests/test_cuda_ordered_dq.py ]; then   # the ordered mode under every mma.sync test
        DUALKV_KERNELS=mma DUALKV_MMA_BWD=ordered step pytest_mma_ordered 300 python3 -m pytest -q -m gpu \
            -p no:cacheprovider proofs_tests/test_cuda_backward.py proofs_tests/test_cuda_paper_api.py \
            proofs_tests/test_tree_cuda.py
    fi
    ;;
mma)
    step table_mma 540 python3 experiments/gpu/hopper_session.py --sections table \
        --systems dualkv_mma,dualkv_mma_ordered,cascade --shapes "${SHAPES:-16:32768,8:8192,28:4096,16:65536}" \
        --modes bwd,fwdbwd --out "$OUT" --tag mma-ordered
    ;;
trees)
    step tree_bench 540 python3 experiments/gpu/tree_bench.py --forward --systems dualkv,dualkv_bwd_v1,flex \
        --reps 10 --out "$OUT"
    ;;
hd96)
    [ -f proofs_tests/test_cuda_hd96.py ] || { echo "hd96: branch hd96 is not in this checkout"; exit 2; }
    step pytest_hd96 420 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_hd96.py \
        proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_backward.py proofs_tests/test_tree_cuda.py -k 96
    step hd96_bench 300 python3 experiments/gpu/hd96_bench.py --out "$OUT/hd96_bench.json"
    ;;
treedq)
    for v in ${VARIANTS:-none DKV_DBG_NOSEM=1 DKV_DBG_NODQ=1 DKV_DQ_INFLIGHT=0}; do
        name=tree_${v%%=*}; mkdir -p "$OUT/$name"
        DUALKV_EXTRA_DEFINES=$([ "$v" = none ] || echo "$v") TAIL=3 step "$name" 120 python3 experiments/gpu/tree_bench.py \
            --forward --systems dualkv --workloads "${WORKLOADS:-a,c}" --reps 5 --no-changing-trees --out "$OUT/$name"
    done
    # where the warps of the warp-specialised backward wait (stall sampling per instruction), and its DRAM / L2
    # reduction traffic, default vs unordered adds; the text pages come back, the reports stay in the archive
    metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_red.sum
    step ncu_default 150 ncu --clock-control none --profile-from-start off -k regex:bwd_sm90_ws --metrics $metrics \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SourceCounters \
        -f -o "$OUT/ncu_default" python3 experiments/gpu/profile_tree_dq.py --workload a
    DUALKV_EXTRA_DEFINES=DKV_DBG_NOSEM=1 step ncu_nosem 120 ncu --clock-control none --profile-from-start off \
        -k regex:bwd_sm90_ws --metrics $metrics -f -o "$OUT/ncu_nosem" \
        python3 experiments/gpu/profile_tree_dq.py --workload a
    for r in ncu_default ncu_nosem; do
        [ -f "$OUT/$r.ncu-rep" ] && ncu --import "$OUT/$r.ncu-rep" --page details > "$OUT/$r.txt" 2>&1
        grep -E "Duration|dram__bytes|lts__t_sectors_op_red|Memory Throughput|L2 Cache Throughput|Warp Cycles Per|Stall" \
            "$OUT/$r.txt" 2>/dev/null | head -30
    done
    # the device returns at most 8 files: one archive of everything, plus the two text pages
    (cd "$OUT" && tar czf treedq.tgz tree_* ncu_*.ncu-rep ./*.log 2>/dev/null && rm -rf tree_* ncu_*.ncu-rep ncu_*.log)
    ;;
orders)
    # the opt-in orders under the GPU tests (a wrong order would hang, then trap on DKV_WAIT_LIMIT): root-first tree
    # dQ (WS and mma.sync ordered dQ), node-major key tiles (default family and mma.sync ordered dQ)
    DUALKV_TREE_DQ_ORDER=root TAIL=4 step pytest_root 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
        proofs_tests/test_tree_cuda_ws.py proofs_tests/test_tree_cuda.py
    DUALKV_TREE_DQ_ORDER=root DUALKV_KERNELS=mma DUALKV_MMA_BWD=ordered TAIL=4 step pytest_root_mma 120 \
        python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_tree_cuda.py
    DUALKV_KEY_TILE_ORDER=node TAIL=4 step pytest_node 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_backward.py proofs_tests/test_tree_cuda_ws.py
    DUALKV_KEY_TILE_ORDER=node DUALKV_KERNELS=mma DUALKV_MMA_BWD=ordered TAIL=4 step pytest_node_mma 120 \
        python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py \
        proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_tree_cuda.py
    ;;
orderbench)
    # every order setting in its own process, same layouts; gradients compared bitwise across settings
    TAIL=12 step order_bench 420 python3 experiments/gpu/order_bench.py --reps 10 --out "$OUT"
    ;;
treebench)
    # tree_bench (with Flex) under the orders in the environment, e.g.
    #   DUALKV_KEY_TILE_ORDER=node DUALKV_TREE_DQ_ORDER=root bash experiments/gpu/run_pending.sh treebench
    TAIL=16 step tree_bench 500 python3 experiments/gpu/tree_bench.py --forward --systems dualkv,dualkv_bwd_v1,flex \
        --reps 10 --no-changing-trees --out "$OUT"
    ;;
defaults)
    # the node-major / root-first defaults: the tree GPU tests, the tree kernels on depth-1 forests against the
    # two-level kernels (single group), and a 4-group micro-batch against every exact peer
    TAIL=3 step pytest_trees 150 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_tree_cuda.py \
        proofs_tests/test_tree_cuda_ws.py
    mkdir -p "$OUT/bench"
    TAIL=10 step depth1 120 python3 -m dualkv bench kernel --shapes 16:32768,8:8192 --systems dualkv,dualkv_tree \
        --mode fwd,fwdbwd --out "$OUT/bench"
    TAIL=16 step groups4 200 python3 -m dualkv bench kernel --groups 4 --shapes 8:8192 \
        --systems dualkv,dualkv_tree,cudnn_cascade,cascade,flex --mode fwd,bwd,fwdbwd --out "$OUT/bench"
    ;;
groups8)
    TAIL=16 step groups8 240 python3 -m dualkv bench kernel --groups 8 --shapes 8:4096 \
        --systems dualkv,dualkv_tree,cudnn_cascade,cascade,flex --mode fwd,bwd,fwdbwd --out "$OUT/bench"
    ;;
hybrid)
    # DUALKV_PATH=hybrid (fused forward + the cuDNN cascade's backward) for deterministic=False: its GPU tests, then
    # against the cascade it would replace and the deterministic default, one group and four
    TAIL=3 step pytest_hybrid 150 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_hybrid_path.py \
        proofs_tests/test_cascade.py
    mkdir -p "$OUT/bench"
    systems=dualkv,dualkv_atomic,dualkv_hybrid,cudnn_cascade
    TAIL=14 step hybrid1 200 python3 -m dualkv bench kernel --shapes 16:32768,8:8192,28:4096 --systems $systems \
        --mode fwd,bwd,fwdbwd --out "$OUT/bench"
    TAIL=14 step hybrid4 150 python3 -m dualkv bench kernel --groups 4 --shapes 8:8192 --systems $systems \
        --mode fwd,bwd,fwdbwd --out "$OUT/bench"
    ;;
table1)
    # the seed's Table 1 at the current defaults: dualkv (deterministic), dualkv_atomic (deterministic=False), the cuDNN
    # and FA2 cascades, one process per half so the first half's JSON survives a time limit
    table1_bench table1 "${SYSTEMS:-dualkv,dualkv_atomic,cudnn_cascade,cascade}" 20 12
    ;;
shared)
    # the opt-in two-level shared-first dQ order: GPU tests (warp-specialised backward; mma.sync ordered dQ), then
    # order_bench against the defaults (gradients compared bitwise: only two-level dQ may differ)
    DUALKV_TWO_LEVEL_DQ_ORDER=shared TAIL=3 step pytest_shared 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_backward.py proofs_tests/test_tree_cuda_ws.py proofs_tests/test_hybrid_path.py
    DUALKV_TWO_LEVEL_DQ_ORDER=shared DUALKV_KERNELS=mma DUALKV_MMA_BWD=ordered TAIL=3 step pytest_shared_mma 120 \
        python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py
    TAIL=12 step order_bench 240 python3 experiments/gpu/order_bench.py --settings node+root,node+root+shared \
        --reps 10 --out "$OUT"
    ;;
headmajor)
    # the warp-specialised backward's CTA orders (DUALKV_WS_CTA_ORDER: head, the two-level default since 2c4891d, or
    # tile; a launch order: the bits must not change): GPU tests under tile, then order_bench tile against head
    DUALKV_WS_CTA_ORDER=tile TAIL=3 step pytest_tile 200 python3 -m pytest -q -m gpu \
        -p no:cacheprovider proofs_tests/test_cuda_backward.py proofs_tests/test_tree_cuda_ws.py
    TAIL=12 step order_bench 300 python3 experiments/gpu/order_bench.py --settings node+root,node+root+headmajor \
        --reps 10 --out "$OUT"
    ;;
hd96cudnn)
    # #12: head dim 96 against the cuDNN and FA2 cascades (deterministic and deterministic=False), same process
    mkdir -p "$OUT/bench"
    TAIL=14 step hd96cudnn 300 python3 -m dualkv bench kernel --head-dim 96 --shapes 16:4096,8:8192,16:32768 \
        --systems dualkv,dualkv_atomic,cudnn_cascade,cascade --mode fwd,bwd,fwdbwd --out "$OUT/bench"
    ;;
wsprofile)
    # #12: where the two-level warp-specialised backward loses to cuDNN's: ncu source counters (local-memory spill
    # traffic per instruction, warp stalls) of one backward at (16, 32K), text page back, report in the archive
    step ncu_ws 240 ncu --clock-control none --profile-from-start off -k regex:bwd_sm90_ws --section SourceCounters \
        --section WarpStateStats --section MemoryWorkloadAnalysis --section SpeedOfLight -f -o "$OUT/ncu_ws" \
        python3 experiments/gpu/profile_bwd.py --systems dualkv
    [ -f "$OUT/ncu_ws.ncu-rep" ] && ncu --import "$OUT/ncu_ws.ncu-rep" --page source --csv > "$OUT/ncu_ws_source.csv" 2>&1
    [ -f "$OUT/ncu_ws.ncu-rep" ] && ncu --import "$OUT/ncu_ws.ncu-rep" --page details > "$OUT/ncu_ws.txt" 2>&1
    grep -E "Local|Spill|Stall|Warp Cycles|Duration|Throughput" "$OUT/ncu_ws.txt" 2>/dev/null | head -30
    (cd "$OUT" && tar czf wsprofile.tgz ncu_ws.ncu-rep ./*.log 2>/dev/null && rm -f ncu_ws.ncu-rep)
    ;;
wsdefaults)
    # the head-major CTA order as the two-level default (spec field): the GPU tests of the warp-specialised backward and
    # the paths beside it; order_bench: tile-major (the old default) vs head-major (bits compared); head dims 64 and 96
    # against the cuDNN cascade for the dispatch floor (deterministic=False). (Run at 9f66fdd+ with a DKV_LSE_EARLY
    # switch too, LSE / D loaded before the GEMM waits: no faster, removed; checks/order-bench-wsdefaults-*.json.)
    TAIL=3 step pytest_wsdefaults 150 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py \
        proofs_tests/test_tree_cuda_ws.py proofs_tests/test_hybrid_path.py
    TAIL=12 step order_bench 220 python3 experiments/gpu/order_bench.py --reps 8 --out "$OUT" \
        --settings node+root,node+root+headmajor
    mkdir -p "$OUT/bench"
    TAIL=22 step hdfloor 170 python3 -m dualkv bench kernel --head-dim 64 --shapes 16:4096,16:32768 \
        --systems dualkv,dualkv_atomic,dualkv_hybrid,cudnn_cascade,cascade --mode bwd,fwdbwd --out "$OUT/bench"
    TAIL=10 step hd96floor 100 python3 -m dualkv bench kernel --head-dim 96 --shapes 8:8192,16:32768 \
        --systems dualkv_hybrid,cudnn_cascade --mode fwdbwd --out "$OUT/bench"
    ;;
ws64)
    # the warp-specialised backward at head dim 64 (dQ's B from a transposed copy of K): the GPU tests of the WS
    # backward (two-level and trees, both head dims), then head dim 64 against the cuDNN cascade
    TAIL=4 step pytest_ws64 220 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py \
        proofs_tests/test_tree_cuda_ws.py
    mkdir -p "$OUT/bench"
    TAIL=12 step ws64bench 100 python3 -m dualkv bench kernel --head-dim 64 --shapes 16:4096,16:32768 \
        --systems dualkv,cudnn_cascade --mode fwd,bwd,fwdbwd --out "$OUT/bench"
    ;;
dqfirst)
    # the WS backward with dQ_step before dK (the default since; run at 3499eee+dqfirst with a variant "dqlast", the
    # old order, since removed): bwd timing against the lockstep / dQ bisection switches (own processes), then the WS
    # backward's GPU tests (every head dim, trees)
    TAIL=7 step dqfirst_timing 200 python3 experiments/gpu/debug_ws_bwd.py --timing 16:32768,8:8192 \
        --variants base,nobar,nodq,base --out "$OUT"
    TAIL=4 step pytest_dqfirst 300 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py \
        proofs_tests/test_tree_cuda_ws.py proofs_tests/test_cuda_hd96.py
    ;;
dqpath)
    # where the WS backward's dQ hand-off costs (#12): the dQ warp's counters (nosem), its reduce-adds (nored), two
    # dQ buffers (dq2); own processes. (checks/ws-bwd-dqpath-*T0840Z.json also timed a since-removed variant.)
    TAIL=9 step dqpath_timing 300 python3 experiments/gpu/debug_ws_bwd.py --timing 16:32768,8:8192 \
        --variants base,nosem,nored,dq2,base --out "$OUT"
    ;;
ws96)
    # the warp-specialised backward at head dim 96 (128-column tiles, TMA zero fill past column 96): its GPU tests
    # (two-level, trees, the head-dim-96 file), head dim 96 against the cuDNN cascade, dualkv verify
    TAIL=4 step pytest_ws96 220 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_hd96.py \
        proofs_tests/test_cuda_backward.py proofs_tests/test_tree_cuda_ws.py -k "ws_backward or other_head_dims or 96"
    TAIL=16 head_dim_bench ws96bench 130 dualkv,cudnn_cascade fwd,bwd,fwdbwd 96
    TAIL=2 step verify 80 python3 -m dualkv verify --no-progress --json "$OUT/verify-h100.json"
    ;;
wsfwd96)
    # the warp-specialised forward at head dim 96 (128-column tiles, TMA zero fill past column 96): the head-dim-96
    # GPU tests and every test naming 96, then head dim 96 against the first wgmma kernels and the cuDNN cascade (one
    # process), dualkv verify
    TAIL=4 step pytest_wsfwd96 240 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_hd96.py \
        proofs_tests/test_cuda_backward.py proofs_tests/test_cuda_paper_api.py proofs_tests/test_cuda_forward.py \
        proofs_tests/test_tree_cuda.py proofs_tests/test_tree_cuda_ws.py -k "96 or other_head_dims"
    TAIL=20 head_dim_bench wsfwd96bench 200 dualkv,dualkv_v1,cudnn_cascade fwd,bwd,fwdbwd 96
    TAIL=2 step verify 80 python3 -m dualkv verify --no-progress --json "$OUT/verify-h100.json"
    ;;
table1dq)
    # Table 1 with dQ_step before dK, after the head-dim-96 GPU tests (the windowed cases' kernel-set check)
    TAIL=3 step pytest_hd96 120 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_hd96.py
    table1_bench table1 "${SYSTEMS:-dualkv,dualkv_atomic,cudnn_cascade}" 14 8
    ;;
floor6496)
    # deterministic=False at head dims 64 and 96 (the dispatch floor): the fused kernels, the path in force
    # (dualkv_atomic), the hybrid (fused forward + cuDNN backward) and the whole cuDNN cascade, one process per head dim
    TAIL=14 head_dim_bench floor 200 dualkv,dualkv_atomic,dualkv_hybrid,cudnn_cascade fwd,fwdbwd 96 64
    ;;
hybrid6496)
    # the hybrid path's GPU tests (head dims 64, 96, 128) and the cascade's, after the dispatch floor moved to it
    TAIL=3 step pytest_hybrid 200 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_hybrid_path.py \
        proofs_tests/test_cascade.py
    ;;
wsfinal)
    # the WS backward after its dead paths were removed (dK-first order, DKV_PIPELINE; the cubin changed): its GPU
    # tests at every head dim and trees, and its bwd time (own processes)
    TAIL=4 step pytest_wsfinal 300 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py \
        proofs_tests/test_tree_cuda_ws.py proofs_tests/test_cuda_hd96.py
    TAIL=3 step wsfinal_timing 120 python3 experiments/gpu/debug_ws_bwd.py --timing 16:32768,8:8192 \
        --variants base,base --out "$OUT"
    ;;
dq96)
    # head dim 96's dQ rows of 96 fp32 columns (were 128): the head-dim-96 GPU tests, then d = 96 against the cuDNN
    # cascade (one process)
    TAIL=3 step pytest_dq96 240 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_hd96.py \
        proofs_tests/test_cuda_backward.py proofs_tests/test_tree_cuda_ws.py -k "96 or other_head_dims or ws_backward"
    TAIL=12 head_dim_bench dq96bench 200 dualkv,cudnn_cascade fwd,bwd,fwdbwd 96
    ;;
final)
    # the session's last commit: Table 1 and head dims 96 and 64 against the cuDNN cascade (deterministic default and
    # deterministic=False), one process per part
    table1_bench final1 dualkv,dualkv_atomic,cudnn_cascade 6 6
    TAIL=4 head_dim_bench final 120 dualkv,dualkv_atomic,cudnn_cascade fwd,bwd,fwdbwd 96 64
    ;;
floortests)
    # after the floor change at head dim 96 (deterministic=False stays fused): the non-deterministic-mode, cascade and
    # hybrid GPU tests, and the head-dim-96 file
    TAIL=3 step pytest_floor 240 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py \
        proofs_tests/test_cascade.py proofs_tests/test_hybrid_path.py proofs_tests/test_cuda_hd96.py \
        -k "atomic or cascade or hybrid or floor or 96"
    ;;
floorjson)
    # head dims 96 and 64, deterministic default against deterministic=False (the path in force), the hybrid and the
    # cuDNN cascade, one process per head dim (a call returns at most 8 files: keep this part's output small)
    TAIL=4 head_dim_bench floorjson 150 dualkv,dualkv_atomic,dualkv_hybrid,cudnn_cascade fwd,bwd,fwdbwd 96 64
    ;;
dqorder)
    # #13: the mma.sync dQ kernel with dP first (each block's K / V loads issued a product ahead): its GPU tests under
    # the mma.sync family, a timing against the FA2 cascade and the kernel's per-instruction stalls. (At 4315cc5 this
    # part also timed the previous order, DKV_DQ_K_FIRST=1, since removed: checks/mma-dqorder-h100-*.json.)
    TAIL=4 mma_backward_tests pytest_dqorder
    mkdir -p "$OUT/bench"
    TAIL=8 step bench_dq 150 python3 -m dualkv bench kernel --systems dualkv_mma,cascade \
        --shapes 8:8192,28:4096,16:32768 --mode bwd,fwdbwd --out "$OUT/bench"
    TAIL=2 step ncusrc_dq 120 ncu --clock-control none --profile-from-start off -k "regex:bwd_dq$" \
        --section SourceCounters --section WarpStateStats -f -o "$OUT/ncusrc_dq" \
        python3 experiments/gpu/profile_bwd.py --family mma --shape 8:8192 --systems dualkv
    [ -f "$OUT/ncusrc_dq.ncu-rep" ] && ncu --import "$OUT/ncusrc_dq.ncu-rep" --page source --print-source sass --csv \
        | gzip > "$OUT/ncusrc_dq.csv.gz"
    rm -f "$OUT/ncusrc_dq.ncu-rep"
    ;;
lsecp)
    # #13: the dK/dV kernels stage LSE / D by cp.async: the mma.sync tests (every head dim, windows, trees), the first
    # wgmma pair's (kernel_family("wgmma_v1")) and Hopper's default path, then the mma.sync backward against the FA2
    # cascade. (At ec9b987 it also timed the plain loads, DKV_LSE_PLAIN=1, since removed: checks/mma-lsecp-*.json.)
    TAIL=3 mma_backward_tests pytest_lse_mma
    TAIL=3 step pytest_lse_hopper 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_backward.py -k "ws_backward_family or atomic_dq or five_gradients or windows"
    mkdir -p "$OUT/bench"
    TAIL=7 step bench_lse 120 python3 -m dualkv bench kernel --systems dualkv_mma,cascade \
        --shapes 8:8192,28:4096,16:32768 --mode bwd --out "$OUT/bench"
    ;;
mmatable)
    # #13: the mma.sync family's forward + backward against the FA2 cascade at the issue's four shapes, one process
    mkdir -p "$OUT/bench"
    TAIL=18 step mmatable 300 python3 -m dualkv bench kernel --systems dualkv_mma,cascade \
        --shapes 28:4096,8:8192,16:32768,16:65536 --mode bwd,fwdbwd --out "$OUT/bench"
    ;;
final13)
    # after the mma.sync dK/dV kernel's new load order became the default: the ordered-dQ mode's GPU tests (its
    # kernel changed too), the two-level/tree routing tests of this session, the mma.sync family against the FA2
    # cascade at #13's four shapes (one process), dualkv verify
    DUALKV_KERNELS=mma DUALKV_MMA_BWD=ordered TAIL=3 step pytest_ordered 240 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_tree_cuda.py
    mkdir -p "$OUT/bench"
    TAIL=18 step mmatable 300 python3 -m dualkv bench kernel --systems dualkv_mma,cascade \
        --shapes 28:4096,8:8192,16:32768,16:65536 --mode bwd,fwdbwd --out "$OUT/bench"
    TAIL=2 step verify 120 python3 -m dualkv verify --no-progress --json "$OUT/verify-h100.json"
    ;;
widefloor)
    # #12 dispatch floor at head dims 192 / 256 on Hopper: the cascade / hybrid GPU tests there and the routing test,
    # then deterministic=False (routed: the hybrid) against the deterministic default, the hybrid forced and the
    # cuDNN cascade, one process per head dim
    TAIL=3 step pytest_wide 240 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cascade.py \
        proofs_tests/test_hybrid_path.py -k "d192 or d256 or wide_heads"
    SHAPES=8:8192,16:16384 TAIL=14 head_dim_bench widefloor 200 dualkv,dualkv_atomic,dualkv_hybrid,cudnn_cascade \
        fwd,bwd,fwdbwd 256 192
    ;;
wide)
    # #12 item 4 / dispatch floor: head dims 192 and 256 on Hopper (forward warp-specialised, backward mma.sync)
    # against the cuDNN and FA2 cascades, deterministic default and deterministic=False, one process per head dim
    SHAPES=8:8192,16:16384 TAIL=14 head_dim_bench wide 280 dualkv,dualkv_atomic,cudnn_cascade,cascade fwd,bwd,fwdbwd \
        256 192
    ;;
wswide)
    # #12 item 4: the warp-specialised backward at head dims 192 / 256 (64-key CTAs, bwd_sm90_ws_wide.cuh): its GPU
    # tests at every head dim (bitwise determinism too), then the deterministic default (now that kernel) against
    # deterministic=False (the hybrid) and the cuDNN cascade, one process per head dim
    TAIL=4 step pytest_wswide 300 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py \
        -k "ws_backward"
    SHAPES=8:8192,16:16384 TAIL=14 head_dim_bench wswide 150 dualkv,dualkv_hybrid,cudnn_cascade fwd,bwd,fwdbwd 256 192
    ;;
wsfinal2)
    # #12 item 4, after the wide WS backward landed: its routing test, dualkv verify, then head dims 256 and 192 at
    # three shapes: the deterministic default (fused), deterministic=False forced to the hybrid, the cuDNN cascade
    TAIL=3 step pytest_wide 200 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_hybrid_path.py \
        -k "wide_heads"
    TAIL=2 step verify 150 python3 -m dualkv verify --no-progress --json "$OUT/verify-h100.json"
    SHAPES=8:8192,16:16384,16:32768 TAIL=12 head_dim_bench wsfinal 200 dualkv,dualkv_hybrid,cudnn_cascade \
        fwd,bwd,fwdbwd 256 192
    ;;
wide256)
    # #12: head dim 256 after the forward's split K / V release: the deterministic default, deterministic=False forced
    # to the hybrid and the cuDNN cascade, three shapes, one process
    SHAPES=8:8192,16:16384,16:32768 TAIL=12 head_dim_bench wide256_ 200 dualkv,dualkv_hybrid,cudnn_cascade \
        fwd,bwd,fwdbwd 256
    ;;
wsreview)
    # after review: the wide WS backward without its first consumer barrier in the in-stage mode, and
    # deterministic=False silent there: the wide GPU tests, then bwd at 256 / 192 beside the cuDNN cascade
    TAIL=3 step pytest_wsreview 300 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py \
        proofs_tests/test_hybrid_path.py -k "(ws_backward and (192 or 256)) or wide_heads"
    SHAPES=8:8192,16:16384 TAIL=6 head_dim_bench wsreview 120 dualkv,cudnn_cascade bwd,fwdbwd 256 192
    ;;
widetrees)
    # the wide WS backward (192 / 256) on prefix trees (ranks in 64-key blocks): the tree WS GPU tests at every head
    # dim, then the wide ones under the root-first tree dQ order
    TAIL=3 step pytest_widetrees 300 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_tree_cuda_ws.py
    DUALKV_TREE_DQ_ORDER=root TAIL=3 step pytest_widetrees_root 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_tree_cuda_ws.py -k "other_head_dims or deterministic"
    ;;
widetreebench)
    # the #14 tree workloads at head dim 256: the warp-specialised tree backward against the two-kernel one it
    # replaces there (dualkv_bwd_v1) and the cuDNN tree cascade, one process
    TAIL=14 step widetreebench 400 python3 experiments/gpu/tree_bench.py --head-dim 256 --workloads a,b,c \
        --systems dualkv,dualkv_bwd_v1,cudnn_cascade --no-changing-trees --out "$OUT"
    ;;
tiles16)
    # #12 A/B (own processes): the d = 128 forward on 192-key blocks in two stages (split release) against 128-key
    # blocks in three; the d = 128 backward with 0 / 2 / 4 of K's k-steps in registers (DKV_K_REGS); the d = 192
    # forward in two stages against three. Correctness first for each non-default variant.
    W="python3 experiments/gpu/with_tiles.py"
    F192="SM90_WS_FWD_TILES:128:block_n=192,stages=2"
    TAIL=3 step pytest_fwd192 200 $W $F192 -- -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_paper_api.py -k "not mma"
    DUALKV_EXTRA_DEFINES=DKV_K_REGS=4 TAIL=3 step pytest_kregs4 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_backward.py -k "ws_backward and not 192 and not 256"
    S4="--shapes 28:4096,8:8192,16:32768,16:65536"
    TAIL=12 step fwd_base 150 python3 -m dualkv bench kernel $S4 --systems dualkv,cudnn_cascade --mode fwd --out "$OUT/bench"
    TAIL=6 step fwd_bn192 150 $W $F192 -- -m dualkv bench kernel $S4 --systems dualkv --mode fwd --out "$OUT/bench"
    for kr in 0 2 4 0; do
        DUALKV_EXTRA_DEFINES=DKV_K_REGS=$kr TAIL=4 step bwd_kregs$kr 150 python3 -m dualkv bench kernel \
            --shapes 16:32768,8:8192 --systems dualkv --mode bwd --out "$OUT/bench"
    done
    SHAPES=8:8192,16:16384,16:32768 TAIL=8 head_dim_bench fwd192_base 150 dualkv,cudnn_cascade fwd 192
    TAIL=5 step fwd192_st2 150 $W SM90_WS_FWD_TILES:192:stages=2 -- -m dualkv bench kernel --head-dim 192 \
        --shapes 8:8192,16:16384,16:32768 --systems dualkv --mode fwd --out "$OUT/bench"
    ;;
fwd16b)
    # #12: the 192-key forward at head dim 128 as the default: the forward-path GPU tests (with head dims 96 and 64
    # also on 192-key blocks through with_tiles), then forward A/B at 96 and 64 (own processes)
    W="python3 experiments/gpu/with_tiles.py"
    T96="SM90_WS_FWD_TILES:96:block_n=192,stages=2" T64="SM90_WS_FWD_TILES:64:block_n=192,stages=3"
    TAIL=3 step pytest_fwd16b 330 $W $T96 $T64 -- -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_paper_api.py proofs_tests/test_cuda_hd96.py \
        proofs_tests/test_tree_cuda_ws.py proofs_tests/test_hybrid_path.py -k "not mma"
    S2="--shapes 8:8192,16:32768 --systems dualkv --mode fwd --out $OUT/bench"
    TAIL=4 step fwd96_base 100 python3 -m dualkv bench kernel --head-dim 96 $S2
    TAIL=4 step fwd96_bn192 100 $W $T96 -- -m dualkv bench kernel --head-dim 96 $S2
    TAIL=4 step fwd64_base 100 python3 -m dualkv bench kernel --head-dim 64 $S2
    TAIL=4 step fwd64_bn192 100 $W $T64 -- -m dualkv bench kernel --head-dim 64 $S2
    TAIL=4 step fwd64_bn192s4 100 $W SM90_WS_FWD_TILES:64:block_n=192,stages=4 -- -m dualkv bench kernel --head-dim 64 $S2
    ;;
final16a)
    # #12: the forward at head dim 192 on 96-key blocks in two stages (with_tiles; 64-key blocks in three are the
    # default): its forward GPU tests, then forward A/B beside the cuDNN cascade; the tree GPU tests and dualkv verify
    # on the 192-key blocks now the default at 64 / 96 / 128
    W="python3 experiments/gpu/with_tiles.py" T192="SM90_WS_FWD_TILES:192:block_n=96,stages=2"
    TAIL=3 step pytest_fwd192bn96 150 $W $T192 -- -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_paper_api.py proofs_tests/test_tree_cuda_ws.py \
        -k "192 and not mma"
    S3="--head-dim 192 --shapes 28:4096,8:8192,16:32768 --mode fwd --out $OUT/bench"
    TAIL=8 step fwd192_base 120 python3 -m dualkv bench kernel $S3 --systems dualkv,cudnn_cascade
    TAIL=5 step fwd192_bn96 120 $W $T192 -- -m dualkv bench kernel $S3 --systems dualkv
    TAIL=3 step pytest_trees 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_tree_cuda.py \
        -k "not mma"
    TAIL=2 step verify 100 python3 -m dualkv verify --no-progress --json "$OUT/verify-h100.json"
    ;;
final16c)
    # #12: the wide forwards on larger key blocks (with_tiles): head dim 256 on 80-key blocks (64 the default), 192 on
    # 112 (96 the default), both two stages: their forward GPU tests, then forward A/B (own processes)
    W="python3 experiments/gpu/with_tiles.py"
    T256="SM90_WS_FWD_TILES:256:block_n=80,stages=2" T192="SM90_WS_FWD_TILES:192:block_n=112,stages=2"
    TAIL=3 step pytest_wide_fwd 200 $W $T256 $T192 -- -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_paper_api.py proofs_tests/test_tree_cuda_ws.py \
        -k "(192 or 256) and not mma"
    S2="--shapes 8:8192,16:32768 --mode fwd --out $OUT/bench"
    TAIL=6 step fwd256_base 120 python3 -m dualkv bench kernel --head-dim 256 $S2 --systems dualkv,cudnn_cascade
    TAIL=4 step fwd256_bn80 120 $W $T256 -- -m dualkv bench kernel --head-dim 256 $S2 --systems dualkv
    TAIL=4 step fwd192_bn96 120 python3 -m dualkv bench kernel --head-dim 192 $S2 --systems dualkv
    TAIL=4 step fwd192_bn112 120 $W $T192 -- -m dualkv bench kernel --head-dim 192 $S2 --systems dualkv
    ;;
final16d)
    # #12: dualkv verify with the forward tiles of this session as defaults (192-key blocks at 64 to 128, 112 at 192,
    # 80 at 256), and head dim 256 fwd+bwd beside the cuDNN cascade
    TAIL=2 step verify 100 python3 -m dualkv verify --no-progress --json "$OUT/verify-h100.json"
    SHAPES=8:8192,16:32768 TAIL=6 head_dim_bench hd 100 dualkv,cudnn_cascade fwdbwd 256
    ;;
final16e)
    # the tree GPU tests (two-level families too) and the hybrid-path tests on this session's shipped forward tiles
    TAIL=3 step pytest_trees_final 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_tree_cuda.py \
        proofs_tests/test_hybrid_path.py -k "not mma"
    ;;
atomicprof)
    # #13 (run this session: checks/ncu-mma-atomic-*): where the mma.sync dK/dV kernel's fused atomic dQ loses to FlashAttention-2's fused backward
    # at (8, 8K): ncu source counters, warp stalls and L2 / atomic traffic of bwd_dkdv (DUALKV_MMA_BWD=atomic) and of
    # FA2's dq_dk_dv kernel, one archive each
    for who in dualkv fa2; do
        k="regex:bwd_dkdv$"; [ $who = fa2 ] && k="regex:flash_bwd_dq_dk_dv"
        DUALKV_DETERMINISTIC=0 DUALKV_PATH=fused DUALKV_MMA_BWD=atomic TAIL=2 step ncu_atomic_$who 200 ncu --clock-control none --profile-from-start off -k "$k" \
            --section SourceCounters --section WarpStateStats --section MemoryWorkloadAnalysis -c 1 \
            -f -o "$OUT/ncu_atomic_$who" python3 experiments/gpu/profile_bwd.py --family mma --shape 8:8192 --systems $who
        ncu_export ncu_atomic_$who
    done
    ;;
stage17)
    # #13: the mma.sync dK/dV kernel's dQ adds in row runs (staged through the step's Q/dO buffer): the atomic and
    # ordered modes' GPU tests under the mma.sync family, then their backward against the previous kernel
    # (experiments/gpu/_old_bwd_dkdv.cu, when present), the split default and the FA2 cascade, one process each
    DUALKV_KERNELS=mma DUALKV_MMA_BWD=atomic TAIL=3 step pytest_atomic 150 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_cuda_backward.py -k atomic_dq_mode
    DUALKV_KERNELS=mma DUALKV_MMA_BWD=ordered TAIL=3 step pytest_ordered 240 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_tree_cuda.py
    mkdir -p "$OUT/bench"
    TAIL=12 step bench_rows 150 python3 -m dualkv bench kernel --systems dualkv_mma,dualkv_mma_ordered,dualkv_mma_atomic,cascade \
        --shapes ${SHAPES:-8:8192,16:32768} --mode bwd --out "$OUT/bench"
    if [ -f experiments/gpu/_old_bwd_dkdv.cu ]; then
        cp experiments/gpu/_old_bwd_dkdv.cu dualkv/cuda/csrc/bwd_dkdv.cu
        TAIL=8 step bench_old 120 python3 -m dualkv bench kernel --systems dualkv_mma_ordered,dualkv_mma_atomic \
            --shapes ${SHAPES:-8:8192,16:32768} --mode bwd --out "$OUT/bench"
    fi
    ;;
table17)
    # #13 after the row-run dQ adds: the mma.sync family (split default; atomic dQ, deterministic=False) against the FA2
    # cascade at the issue's four shapes (one process), then head dims 32 / 64 / 96, split against atomic
    mkdir -p "$OUT/bench"
    TAIL=26 step mmatable 330 python3 -m dualkv bench kernel --systems dualkv_mma,dualkv_mma_atomic,cascade \
        --shapes 28:4096,8:8192,16:32768,16:65536 --mode bwd,fwdbwd --out "$OUT/bench"
    SHAPES=8:8192,16:32768 TAIL=6 head_dim_bench hd 90 dualkv_mma,dualkv_mma_atomic,cascade bwd 32 64 96
    # and the split backward's two kernels under ncu (source counters, stalls) at (8, 8K), for the next step
    for k in bwd_dkdv bwd_dq; do
        TAIL=2 step ncu_split_$k 120 ncu --clock-control none --profile-from-start off -k "regex:${k}$" \
            --section SourceCounters --section WarpStateStats --section SpeedOfLight -c 1 -f -o "$OUT/ncu_split_$k" \
            python3 experiments/gpu/profile_bwd.py --family mma --shape 8:8192 --systems dualkv
        [ -f "$OUT/ncu_split_$k.ncu-rep" ] && ncu --import "$OUT/ncu_split_$k.ncu-rep" --page source \
            --print-source sass --csv | gzip > "$OUT/ncu_split_$k.csv.gz"
        rm -f "$OUT/ncu_split_$k.ncu-rep"
    done
    (cd "$OUT" && tar czf table17.tgz *.log *.csv.gz bench && rm -rf *.csv.gz bench hd*.log ncu_*.log)  # <= 8 files back
    ;;
final17)
    # #13: "auto" (the default) sends deterministic=False calls to the atomic dQ at head dims 64-128 where the mma.sync
    # dK/dV kernel serves: the deterministic=False GPU tests under the mma.sync family and the default family
    DUALKV_KERNELS=mma TAIL=3 step pytest_auto_mma 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_backward.py -k atomic_dq_mode
    TAIL=3 step pytest_auto 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_backward.py proofs_tests/test_cuda_paper_api.py -k "atomic_dq or bitwise"
    ;;
verify17)
    # dualkv verify with its deterministic=False rows, the default family (Hopper: hybrid / warp-specialised) and the
    # mma.sync family (the atomic dQ at head dims 64-128)
    TAIL=2 step verify 110 python3 -m dualkv verify --no-progress --json "$OUT/verify-h100.json"
    DUALKV_KERNELS=mma TAIL=2 step verify_mma 110 python3 -m dualkv verify --no-progress --json "$OUT/verify-h100-mma.json"
    ;;
ordprof)
    # #13: where the mma.sync ordered dQ mode (deterministic, five products) loses 60% against the atomic mode (399
    # against 248 ms at (16, 32K), checks/stage17-rows-*): ncu warp stalls per instruction (the counter wait, the
    # barriers around it, the fence) of the ordered dK/dV kernel at (8, 8K); the one-thread fence (DKV_DQ_FENCE,
    # bwd_dkdv.cu): the ordered-mode GPU tests under it, then the ordered backward without and with it (the tree GPU
    # tests of the atomic dQ, once here, ran in part frag)
    DUALKV_MMA_BWD=ordered TAIL=2 step ncu_ordered 150 ncu --clock-control none --profile-from-start off \
        -k "regex:bwd_dkdv$" --section SourceCounters --section WarpStateStats --section SpeedOfLight -c 1 \
        -f -o "$OUT/ncu_ordered" python3 experiments/gpu/profile_bwd.py --family mma --shape 8:8192 --systems dualkv
    [ -f "$OUT/ncu_ordered.ncu-rep" ] && ncu --import "$OUT/ncu_ordered.ncu-rep" --page source --print-source sass \
        --csv | gzip > "$OUT/ncu_ordered.csv.gz"
    rm -f "$OUT/ncu_ordered.ncu-rep"
    DUALKV_EXTRA_DEFINES=DKV_DQ_FENCE=1 DUALKV_KERNELS=mma DUALKV_MMA_BWD=ordered TAIL=3 step pytest_fence_one 150 \
        python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py
    mkdir -p "$OUT/bench"
    for v in 0 1; do
        DUALKV_EXTRA_DEFINES=DKV_DQ_FENCE=$v TAIL=3 step bench_fence$v 100 python3 -m dualkv bench kernel \
            --systems dualkv_mma_ordered --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/fence$v"
    done
    (cd "$OUT" && tar czf ordprof.tgz *.log *.csv.gz bench && rm -rf bench *.csv.gz)
    ;;
final16b)
    # #12: the seed's Table 1 (head dim 128) with the 192-key forward, beside the cuDNN cascade
    table1_bench table1 "${SYSTEMS:-dualkv,cudnn_cascade}" 14 8
    # and head dim 192 with its forward on 96-key blocks (now the default) beside the cuDNN cascade
    SHAPES=28:4096,8:8192,16:32768 TAIL=12 head_dim_bench hd 150 dualkv,cudnn_cascade fwd,bwd,fwdbwd 192
    ;;
frag)
    # #13: the atomic dQ mode adds its fragments straight from registers into a fragment-order accumulator
    # (dq_layout.py, bwd_dq_frag_cast.cu): the cast kernel's test, the deterministic=False tests under both families,
    # the tree and paper-API atomic tests; then the backward against the previous commit's package, own processes
    TAIL=2 step pytest_cast 120 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_dq_layout.py
    DUALKV_KERNELS=mma TAIL=2 step pytest_atomic_mma 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_backward.py -k atomic_dq_mode
    DUALKV_KERNELS=mma TAIL=2 step pytest_tree_atomic 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_tree_cuda.py proofs_tests/test_cuda_paper_api.py -k atomic
    TAIL=2 step pytest_atomic_default 150 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_backward.py -k atomic_dq_mode
    mkdir -p "$OUT/bench"
    TAIL=6 step bench_new 120 python3 -m dualkv bench kernel --systems dualkv_mma,dualkv_mma_atomic,cascade \
        --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/new"
    if [ -d experiments/gpu/_old/dualkv ]; then
        (cd experiments/gpu/_old && PYTHONPATH=$PWD TAIL=4 step bench_old 120 python3 -m dualkv bench kernel \
            --systems dualkv_mma_atomic --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/old")
    fi
    (cd "$OUT" && tar czf frag.tgz *.log bench && rm -rf bench)
    ;;
fragtable)
    # #13 after the fragment-order atomic dQ: the mma.sync family (split default; atomic dQ) against the FA2 cascade
    # at the issue's four shapes, bwd and fwd+bwd, one process; then dualkv verify under the mma.sync family
    mkdir -p "$OUT/bench"
    TAIL=26 step mmatable 330 python3 -m dualkv bench kernel --systems dualkv_mma,dualkv_mma_atomic,cascade \
        --shapes 28:4096,8:8192,16:32768,16:65536 --mode bwd,fwdbwd --out "$OUT/bench"
    DUALKV_KERNELS=mma TAIL=2 step verify_mma 150 python3 -m dualkv verify --no-progress \
        --json "$OUT/verify-h100-mma.json"
    (cd "$OUT" && tar czf fragtable.tgz *.log bench && rm -rf bench)
    ;;
ordred)
    # #13: the ordered dQ mode's adds as fire-and-forget REDs (flags.cuh red_add; atomicAdd had compiled to a returning
    # ATOM there): its GPU tests, then its backward (the previous build: part ordprof's bench_fence0)
    DUALKV_KERNELS=mma DUALKV_MMA_BWD=ordered TAIL=3 step pytest_ordred 110 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py
    mkdir -p "$OUT/bench"
    TAIL=3 step bench_ordred 60 python3 -m dualkv bench kernel --systems dualkv_mma_ordered \
        --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench"
    DUALKV_KERNELS=mma DUALKV_MMA_BWD=ordered TAIL=3 step pytest_ordred_tree 60 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_tree_cuda.py -k "not atomic"
    ;;
ordfrag)
    # #13 (branch ordfrag, not yet run): the ordered dQ mode adds in fragment order too (no staging, no end-of-step
    # barrier; bwd_dq_frag_cast.cu casts): its GPU tests (two-level, trees, the paper API), then its backward against
    # main's package in experiments/gpu/_old (when present: git archive main dualkv | tar -x -C experiments/gpu/_old)
    # (the tree file's atomic-dQ test expects the atomic mode, which "ordered" overrides: run apart, deselected)
    ordered_tests pytest_ordfrag
    mkdir -p "$OUT/bench"
    TAIL=4 step bench_ordfrag 120 python3 -m dualkv bench kernel --systems dualkv_mma_ordered,dualkv_mma_split,dualkv_mma_atomic \
        --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/new"
    DUALKV_EXTRA_DEFINES=DKV_DQ_FENCE=1 TAIL=3 step bench_ordfrag_fence1 90 python3 -m dualkv bench kernel \
        --systems dualkv_mma_ordered --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/fence1"
    if [ -d experiments/gpu/_old/dualkv ]; then
        (cd experiments/gpu/_old && PYTHONPATH=$PWD TAIL=3 step bench_ordold 90 python3 -m dualkv bench kernel \
            --systems dualkv_mma_ordered --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/old")
    fi
    (cd "$OUT" && tar czf ordfrag.tgz *.log bench && rm -rf bench)
    ;;
ordearly)
    # #13: the ordered dQ mode's counter read early (DKV_DQ_EARLY=1: parked in smem, off the wait barrier's path) and
    # its fences (DKV_DQ_FENCE: 0 every thread, 1 thread 0 after the barrier, 2 thread 0's st.release alone):
    # the ordered GPU tests under the most aggressive build (EARLY=1, FENCE=2), then every combination's backward
    # (DKV_DQ_EARLY has since been removed: bwd_dkdv.cu refuses it by name, so this part no longer builds)
    mkdir -p "$OUT/bench"
    defs="DKV_DQ_EARLY=1,DKV_DQ_FENCE=2"
    DUALKV_EXTRA_DEFINES=$defs ordered_tests pytest_ordearly
    TAIL=4 step bench_e0f0 120 python3 -m dualkv bench kernel --systems dualkv_mma_ordered,dualkv_mma_split,dualkv_mma_atomic \
        --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/e0f0"
    for e in 0 1; do for f in 0 1 2; do
        [ "$e$f" = 00 ] && continue
        DUALKV_EXTRA_DEFINES=DKV_DQ_EARLY=$e,DKV_DQ_FENCE=$f TAIL=2 step bench_e${e}f$f 90 python3 -m dualkv bench \
            kernel --systems dualkv_mma_ordered --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/e${e}f$f"
    done; done
    (cd "$OUT" && tar czf ordearly.tgz *.log bench && rm -rf bench)
    ;;
wsprof2)
    # #12: the head-major warp-specialised backward (the d = 128 default since 9f66fdd's profile) at (16, 32K): ncu
    # SourceCounters with the SASS, warp states, speed of light; summarised on the CPU by ncu_summary.py --source
    ws_ncu_profile 200 wsprof2
    ;;
fence2ws)
    # #13: the ordered dQ mode's new default fence (DKV_DQ_FENCE=2, the release alone): its GPU tests; #12: the d <= 128
    # warp-specialised backward with the step record / LSE (DKV_WS_HOIST=1) and D (2) read before the product waits:
    # its GPU tests under 1 and 3, then bwd at (8, 8K) and (16, 32K) for 0, 1, 2, 3 (own processes, same machine)
    ordered_tests pytest_fence2
    mkdir -p "$OUT/bench"
    for v in 0 1 2 3 0; do
        DUALKV_EXTRA_DEFINES=DKV_WS_HOIST=$v TAIL=2 step bench_hoist$v 90 python3 -m dualkv bench kernel \
            --systems dualkv --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/hoist$v"
    done
    # the fastest at (16, 32K) (median over its runs), its GPU tests when it is not 0
    best=$(python3 - "$OUT/bench" <<'PY'
import glob, json, sys
ms = {}
for v in "0123":
    for f in glob.glob(f"{sys.argv[1]}/hoist{v}/*.json"):
        for r in json.load(open(f))["rows"]:
            if r["N"] == 16 and r["mode"] == "bwd":
                ms.setdefault(v, []).append(r["ms"])
print(min(ms, key=lambda v: min(ms[v])) if ms else "0")
PY
)
    echo "fastest DKV_WS_HOIST: $best"
    [ "$best" != 0 ] && DUALKV_EXTRA_DEFINES=DKV_WS_HOIST=$best TAIL=3 step pytest_hoist$best 240 python3 -m pytest -q \
        -x -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py proofs_tests/test_tree_cuda_ws.py -k "ws"
    DUALKV_KERNELS=mma TAIL=4 step bench_ordered 120 python3 -m dualkv bench kernel \
        --systems dualkv_mma_ordered,dualkv_mma_split,dualkv_mma_atomic --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/ord"
    (cd "$OUT" && tar czf fence2ws.tgz *.log bench && rm -rf bench *.log)
    ;;
prefetch2)
    # #13: the ordered dQ mode with thread 0's counter read as an acquire before the dQ product (DKV_DQ_PREFETCH=2;
    # 1 reads it relaxed and fences at the wait): bwd beside the default, then (when 2 is the fastest at (16, 32K))
    # its ordered GPU tests
    mkdir -p "$OUT/bench"
    for v in 0 2 1; do
        DUALKV_EXTRA_DEFINES=DKV_DQ_PREFETCH=$v TAIL=2 step bench_prefetch$v 90 python3 -m dualkv bench kernel \
            --systems dualkv_mma_ordered --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/prefetch$v"
    done
    (cd "$OUT" && tar czf prefetch2.tgz bench_prefetch*.log bench && rm -rf bench bench_prefetch*.log)
    best=$(python3 - <<'PY'
import glob, json, tarfile, io, os
ms = {}
with tarfile.open(os.environ["OUT"] + "/prefetch2.tgz") as t:
    for m in t.getmembers():
        if m.name.endswith(".json"):
            v = m.name.split("prefetch")[1][0]
            for r in json.load(t.extractfile(m))["rows"]:
                if r["N"] == 16:
                    ms[v] = r["ms"]
print(min(ms, key=ms.get) if ms else "0", ms)
PY
)
    echo "fastest DKV_DQ_PREFETCH: $best"
    if [ "${best%% *}" = 2 ]; then
        DUALKV_EXTRA_DEFINES=DKV_DQ_PREFETCH=2 ordered_tests pytest_prefetch2
    fi
    ;;
ordtable)
    # #13 after the ordered dQ mode's copies moved behind S^T with LSE / D by cp.async: the mma.sync family's split,
    # ordered and atomic backwards against the FA2 cascade at the issue's four shapes (bwd, fwd+bwd, one process),
    # then split against ordered at head dims 32, 64, 96 (bwd, one process each)
    mkdir -p "$OUT/bench"
    TAIL=34 step ordtable 330 python3 -m dualkv bench kernel \
        --systems dualkv_mma_split,dualkv_mma_ordered,dualkv_mma_atomic,cascade \
        --shapes 28:4096,8:8192,16:32768,16:65536 --mode bwd,fwdbwd --out "$OUT/bench"
    TAIL=5 head_dim_bench ordhd 100 dualkv_mma_split,dualkv_mma_ordered bwd 32 64 96
    (cd "$OUT" && tar czf ordtable.tgz *.log bench && rm -rf bench)
    ;;
autoord)
    # #13: "auto" runs the ordered dQ for deterministic calls at head dims 64-128 on the mma.sync dK/dV kernel: the GPU
    # tests under the mma.sync family's new default (backward and trees, the paper API and the ordered-mode file), the
    # split backward's under DUALKV_MMA_BWD=split, the prefix-tree workloads split against ordered (fwd+bwd, one
    # process each), then dualkv verify under the family
    mma_backward_tests pytest_mma_auto
    DUALKV_KERNELS=mma TAIL=3 step pytest_mma_auto_api 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_paper_api.py proofs_tests/test_cuda_ordered_dq.py
    DUALKV_KERNELS=mma DUALKV_MMA_BWD=split TAIL=3 step pytest_mma_split 120 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_cuda_backward.py -k "shared_prefix_gradients and bf16"
    for m in split ordered; do   # (as run at 94fd9b1 this timed tree_bench's "dualkv", which forces the default
        # family: Hopper's kernels both times; part mmatrees times the mma.sync family)
        mkdir -p "$OUT/trees_$m"
        DUALKV_KERNELS=mma DUALKV_MMA_BWD=$m TAIL=5 step trees_$m 100 python3 experiments/gpu/tree_bench.py \
            --systems dualkv_mma --reps 5 --no-changing-trees --out "$OUT/trees_$m"
    done
    DUALKV_KERNELS=mma TAIL=2 step verify_mma 110 python3 -m dualkv verify --no-progress --json "$OUT/verify-h100-mma.json"
    (cd "$OUT" && tar czf autoord.tgz *.log trees_* && rm -rf trees_*)
    ;;
mmatrees)
    # #13: the prefix-tree workloads on the mma.sync kernels, split against ordered dQ (fwd+bwd, one process each)
    for m in split ordered split ordered; do
        mkdir -p "$OUT/trees_$m"
        DUALKV_MMA_BWD=$m TAIL=5 step trees_$m 80 python3 experiments/gpu/tree_bench.py \
            --systems dualkv_mma --reps 5 --no-changing-trees --out "$OUT/trees_$m"
    done
    (cd "$OUT" && tar czf mmatrees.tgz trees_* && rm -rf trees_*)
    ;;
qwarps)
    # #13: the mma.sync dK/dV kernel with warps 4 (keys) x 2 (queries / columns), P^T and dS^T through smem
    # (DUALKV_MMA_BWD_QWARPS=2): its GPU tests (every dQ mode, head dims 32-128, awkward shapes), then the split,
    # ordered and atomic backwards under both layouts against the FA2 cascade (one process per layout)
    DUALKV_KERNELS=mma DUALKV_MMA_BWD_QWARPS=2 TAIL=3 step pytest_qw2 240 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_cuda_backward.py \
        -k "ordered or mma_backward_on_hopper or atomic_dq_mode or (shared_prefix_gradients and bf16)"
    mkdir -p "$OUT/bench"
    for qw in 2 1; do
        DUALKV_MMA_BWD_QWARPS=$qw TAIL=12 step bench_qw$qw 120 python3 -m dualkv bench kernel \
            --systems dualkv_mma_split,dualkv_mma_ordered,dualkv_mma_atomic,cascade \
            --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/qw$qw"
    done
    (cd "$OUT" && tar czf qwarps.tgz *.log bench && rm -rf bench)
    ;;
qwarps2)
    # #13: DUALKV_MMA_BWD_QWARPS=2do1 (the FA2-like layout with one dO buffer, what an sm_80 build runs at head dim
    # 128): its GPU tests, then d = 128 backwards under 2 and 2do1, then head dims 32 / 64 / 96 under 1 and 2
    DUALKV_KERNELS=mma DUALKV_MMA_BWD_QWARPS=2do1 TAIL=3 step pytest_qw2do1 240 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_cuda_backward.py \
        -k "ordered or atomic_dq_mode or (shared_prefix_gradients and bf16 and not window)"
    mkdir -p "$OUT/bench"
    for qw in 2do1 2; do
        DUALKV_MMA_BWD_QWARPS=$qw TAIL=9 step bench_qw$qw 100 python3 -m dualkv bench kernel \
            --systems dualkv_mma_ordered,dualkv_mma_atomic,cascade \
            --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/qw$qw"
    done
    for qw in 2 1; do
        for d in 64 96 32; do
            DUALKV_MMA_BWD_QWARPS=$qw TAIL=8 step bench_qw${qw}_d$d 80 python3 -m dualkv bench kernel --head-dim $d \
                --systems dualkv_mma_ordered,dualkv_mma_atomic --shapes 8:8192,16:32768 --mode bwd \
                --out "$OUT/bench/qw${qw}_d$d"
        done
    done
    (cd "$OUT" && tar czf qwarps2.tgz *.log bench && rm -rf bench)
    ;;
qwfinal)
    # #13: the FA2-like dK/dV layout as the default at head dims 64-128 (builds with a dQ product): the GPU tests of
    # the mma.sync family's backward (every dQ mode, trees), the ordered file under the sm_80 fit (one dO buffer),
    # then the family's auto (ordered) and atomic backwards against the FA2 cascade at the issue's four shapes
    DUALKV_KERNELS=mma TAIL=3 step pytest_qwfinal 260 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_cuda_backward.py proofs_tests/test_tree_cuda.py \
        -k "ordered or mma_backward_on_hopper or atomic_dq_mode or (shared_prefix_gradients and bf16) or tree"
    DUALKV_KERNELS=mma DUALKV_MMA_BWD_QWARPS=2do1 TAIL=3 step pytest_qw2do1 120 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_cuda_backward.py \
        -k "test_shared_prefix_gradients or atomic_dq_mode"
    mkdir -p "$OUT/bench"
    TAIL=26 step qwtable 300 python3 -m dualkv bench kernel --systems dualkv_mma,dualkv_mma_atomic,cascade \
        --shapes 28:4096,8:8192,16:32768,16:65536 --mode bwd,fwdbwd --out "$OUT/bench"
    (cd "$OUT" && tar czf qwfinal.tgz *.log bench && rm -rf bench)
    ;;
qwtests)
    # #13, after qwfinal: the mma.sync family's backward GPU tests qwfinal left out (fp16 sweeps, the paper API,
    # windows, determinism, training), then the prefix-tree workloads split against ordered dQ (fwd+bwd)
    DUALKV_KERNELS=mma TAIL=3 step pytest_qwrest 300 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_backward.py proofs_tests/test_cuda_paper_api.py \
        -k "not ws_backward and not prep_kernel and not opcheck and not compile and not atomic_dq_mode and not \
mma_backward_on_hopper and not (shared_prefix_gradients and bf16)"
    for m in split ordered; do
        mkdir -p "$OUT/trees_$m"
        DUALKV_MMA_BWD=$m TAIL=5 step trees_$m 80 python3 experiments/gpu/tree_bench.py \
            --systems dualkv_mma --reps 5 --no-changing-trees --out "$OUT/trees_$m"
    done
    (cd "$OUT" && tar czf qwtests.tgz *.log trees_* && rm -rf trees_*)
    ;;
release)
    # #13: thread 0 releases the previous step's dQ counter after the S^T product, before the next step's copies
    # (DKV_DQ_RELEASE=1; its st.release is a MEMBAR.GPU that waits for thread 0's copies in flight): the ordered GPU
    # tests (two-level, paper API, trees) under it, then the ordered backward under 0 / 1 / 0 / 1, own processes
    DUALKV_EXTRA_DEFINES=DKV_DQ_RELEASE=1 ordered_tests pytest_release
    mkdir -p "$OUT/bench"
    for v in 0 1 0 1; do
        DUALKV_EXTRA_DEFINES=DKV_DQ_RELEASE=$v TAIL=4 step bench_rel$v 90 python3 -m dualkv bench kernel \
            --systems dualkv_mma_ordered --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/rel$v"
    done
    # the sm_80 fit (one dO buffer) timed again after 2819485's dO-pointer fix, beside the default
    for qw in 2do1 default; do
        DUALKV_MMA_BWD_QWARPS=$qw TAIL=6 step bench_$qw 90 python3 -m dualkv bench kernel \
            --systems dualkv_mma_ordered,dualkv_mma_atomic --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/$qw"
    done
    (cd "$OUT" && tar czf release.tgz *.log bench && rm -rf bench)
    ;;
mmaprof)
    # #13 (next): where the mma.sync dK/dV kernel's backward still loses to FlashAttention-2's at (8, 8K), at the current
    # defaults: ncu source counters, warp stalls and memory workload of bwd_dkdv in the ordered mode (the
    # deterministic default), in the atomic mode (deterministic=False) and of FA2's dq_dk_dv kernel, one archive each
    mma_bwd_ncu ordered atomic fa2
    (cd "$OUT" && tar czf mmaprof.tgz ncu_* *.log && rm -f ncu_* *.log)
    ;;
fwdmask)
    # #13 (and #12's WS forward, whose softmax shares the mask code): the mma.sync forward with the blocks that need a
    # mask visited first and the rest in a loop without mask code (visit_order), masks against a per-row limit: the
    # forward GPU tests under both families, then fwd A/B at the issue's shapes against the previous commit's package
    # (experiments/gpu/_old, when carried), the DKV_FWD_K_EARLY=1 and DKV_FWD_MASK_SPLIT=0 variants, one process
    # each, the FA2 cascade beside
    DUALKV_KERNELS=mma TAIL=3 step pytest_fwd_mma 200 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_paper_api.py proofs_tests/test_cuda_hd96.py \
        proofs_tests/test_tree_cuda.py -k "not backward and not grad and not dq and not dkdv"
    TAIL=3 step pytest_fwd_default 150 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_paper_api.py -k "not backward and not grad"
    mkdir -p "$OUT/bench"
    shapes=28:4096,8:8192,16:32768,16:65536
    for v in new old early nosplit new; do
        dir=$PWD; defs=; [ $v = early ] && defs=DKV_FWD_K_EARLY=1; [ $v = nosplit ] && defs=DKV_FWD_MASK_SPLIT=0
        [ $v = old ] && { [ -d experiments/gpu/_old/dualkv ] || continue; dir=$PWD/experiments/gpu/_old; }
        (cd "$dir" && PYTHONPATH=$dir DUALKV_EXTRA_DEFINES=$defs TAIL=6 step fwd_$v 100 python3 -m dualkv bench kernel \
            --systems dualkv_mma,dualkv,cascade --shapes $shapes --mode fwd --out "$OUT/bench/$v")
    done
    (cd "$OUT" && tar czf fwdmask.tgz *.log bench && rm -rf bench)
    ;;
defer)
    # #13: the ordered dQ's adds deferred past the next step's S^T product (DKV_DQ_DEFER=1): the ordered backward under
    # 0 / 1 / 0 / 1 (own processes) and the sm_80 fit (DUALKV_MMA_BWD_QWARPS=2do1) under 0 / 1, then the ordered GPU
    # tests (two-level, paper API, trees) under it
    mkdir -p "$OUT/bench"
    for v in 0 1 0 1; do
        DUALKV_EXTRA_DEFINES=DKV_DQ_DEFER=$v TAIL=5 step bench_defer$v 100 python3 -m dualkv bench kernel \
            --systems dualkv_mma_ordered --shapes 28:4096,8:8192,16:32768 --mode bwd --out "$OUT/bench/defer$v"
    done
    for v in 0 1; do
        DUALKV_EXTRA_DEFINES=DKV_DQ_DEFER=$v DUALKV_MMA_BWD_QWARPS=2do1 TAIL=4 step bench_2do1_defer$v 90 \
            python3 -m dualkv bench kernel --systems dualkv_mma_ordered --shapes 8:8192,16:32768 --mode bwd \
            --out "$OUT/bench/2do1_defer$v"
    done
    DUALKV_EXTRA_DEFINES=DKV_DQ_DEFER=1 ordered_tests pytest_defer
    (cd "$OUT" && tar czf defer.tgz *.log bench && rm -rf bench)
    ;;
lsestage)
    # #13: each step's LSE / D staged one row per thread (load_walk_step; its strided loop had unrolled into ~150
    # instructions of 64-bit index math on warps 0-1's path): bwd A/B against the previous commit's package
    # (experiments/gpu/_old, when carried), new / old / new / old, own processes; then the mma.sync family's
    # backward GPU tests of every dQ mode and the tree tests (qwfinal's set)
    mkdir -p "$OUT/bench"
    for v in new old new old; do
        dir=$PWD; [ $v = old ] && { [ -d experiments/gpu/_old/dualkv ] || continue; dir=$PWD/experiments/gpu/_old; }
        (cd "$dir" && PYTHONPATH=$dir TAIL=8 step bwd_$v 100 python3 -m dualkv bench kernel \
            --systems dualkv_mma_ordered,dualkv_mma_atomic --shapes 28:4096,8:8192,16:32768 --mode bwd \
            --out "$OUT/bench/$v")
    done
    DUALKV_KERNELS=mma TAIL=3 step pytest_lse 260 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_cuda_backward.py proofs_tests/test_tree_cuda.py \
        -k "ordered or mma_backward_on_hopper or atomic_dq_mode or (shared_prefix_gradients and bf16) or tree"
    (cd "$OUT" && tar czf lsestage.tgz *.log bench && rm -rf bench)
    ;;
final22)
    # the session's closing tables on one GPU: #13, the mma.sync family (default: ordered dQ) and its atomic mode
    # against the FA2 cascade at the issue's four shapes; #12, the default family against the cuDNN cascade at the
    # three Table 1 shapes below target (fwd, bwd, fwd+bwd)
    mkdir -p "$OUT/bench"
    TAIL=12 step table13 220 python3 -m dualkv bench kernel --systems dualkv_mma,dualkv_mma_atomic,cascade \
        --shapes 28:4096,8:8192,16:32768,16:65536 --mode bwd,fwdbwd --out "$OUT/bench"
    TAIL=20 step table12 200 python3 -m dualkv bench kernel --systems dualkv,cudnn_cascade \
        --shapes 16:32768,16:65536,4:131072 --mode fwd,bwd,fwdbwd --out "$OUT/bench"
    (cd "$OUT" && tar czf final22.tgz *.log bench)
    # #12 probe: the head-dim-128 warp-specialised backward with three Q/dO stages (232056 of 232448 bytes) against
    # two, own processes, 2 / 3 / 2 / 3 (timing only: not a default, no GPU tests)
    for v in 2 3 2 3; do
        TAIL=4 step ws_stages$v 50 python3 experiments/gpu/with_tiles.py SM90_WS_BWD_TILES:128:stages=$v -- \
            -m dualkv bench kernel --systems dualkv --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/stages$v"
    done
    (cd "$OUT" && tar czf final22.tgz *.log bench && rm -rf bench)
    ;;
wsstages3)
    # #12: the head-dim-128 warp-specialised backward on three Q/dO stages (final22's probe, now the tile): its GPU
    # tests (two-level at every head dim, the bf16 sweep, trees)
    ws_backward_tests pytest_ws3 230
    ;;
s23stages)
    # #12: dualkv verify on the three-stage d = 128 warp-specialised backward (not run with it yet), then three
    # against two stages at the Table 1 shapes an H100 probe of an earlier variant found slower with three ((28, 4K),
    # (8, 8K)) and (28, 16K): bwd, own processes 3 / 2 / 3 / 2
    TAIL=3 step verify 200 python3 -m dualkv verify --no-progress --json "$OUT/verify.json"
    mkdir -p "$OUT/bench"
    i=0
    for v in 3 2 3 2; do
        i=$((i + 1))
        TAIL=5 step ws${i}_stages$v 90 python3 experiments/gpu/with_tiles.py SM90_WS_BWD_TILES:128:stages=$v -- \
            -m dualkv bench kernel --systems dualkv --shapes 28:4096,8:8192,28:16384 --mode bwd \
            --out "$OUT/bench/run${i}_stages$v"
    done
    (cd "$OUT" && tar czf s23stages.tgz *.log bench && rm -rf bench)
    ;;
s23mask)
    # #12 / #13: P^T's causal / partial-block mask only on the steps that need it (DKV_MASK_SPLIT=1: a branch to an
    # unmasked copy of the exp2 loop, which skips 32 compares and selects a thread per step): bwd A/B, own processes
    # new / old / new / old, the warp-specialised backward (default family) and the mma.sync ordered / atomic modes
    mkdir -p "$OUT/bench"
    i=0
    for v in 1 0 1 0; do
        i=$((i + 1))
        DUALKV_EXTRA_DEFINES=DKV_MASK_SPLIT=$v TAIL=5 step ws${i}_split$v 120 python3 -m dualkv bench kernel \
            --systems dualkv --shapes 28:4096,8:8192,16:32768 --mode bwd --out "$OUT/bench/ws${i}_split$v"
        DUALKV_EXTRA_DEFINES=DKV_MASK_SPLIT=$v TAIL=8 step mma${i}_split$v 150 python3 -m dualkv bench kernel \
            --systems dualkv_mma_ordered,dualkv_mma_atomic --shapes 28:4096,8:8192,16:32768 --mode bwd \
            --out "$OUT/bench/mma${i}_split$v"
    done
    (cd "$OUT" && tar czf s23mask.tgz *.log bench && rm -rf bench ws*.log mma*.log)
    ;;
s23tests)
    # #12 / #13: the unmasked P^T path as the default (the warp-specialised backward's two-level and tree builds, the
    # mma.sync ordered dQ mode's): the WS backward's GPU tests (wsstages3's set), the ordered mode's (two-level, paper
    # API, trees), then dualkv verify
    ws_backward_tests pytest_ws 260
    ordered_tests pytest_ordered
    TAIL=3 step verify 150 python3 -m dualkv verify --no-progress --json "$OUT/verify.json"
    ;;
s23tables)
    # the session's closing tables, one GPU: #12, the default family against the cuDNN cascade at the six Table 1
    # shapes; #13, the mma.sync family (ordered dQ) against the FA2 cascade at the issue's four shapes
    mkdir -p "$OUT/bench"
    TAIL=22 step table12 330 python3 -m dualkv bench kernel --systems dualkv,cudnn_cascade \
        --shapes 28:4096,8:8192,28:16384,16:32768,16:65536,4:131072 --mode fwd,bwd,fwdbwd --out "$OUT/bench"
    TAIL=12 step table13 200 python3 -m dualkv bench kernel --systems dualkv_mma,cascade \
        --shapes 28:4096,8:8192,16:32768,16:65536 --mode bwd,fwdbwd --out "$OUT/bench"
    (cd "$OUT" && tar czf s23tables.tgz *.log bench)
    ;;
s23put)
    # #12: the WS backward's dQ_step put with four chunk offsets a step (DKV_DQ_PUT2=1; nvdisasm: d = 128 2352 against
    # 2440 instructions, d = 256 spills 24 / 24 bytes against 68 / 72) at d = 128; at d = 192 / 256 with the wide
    # builds' unmasked P^T path too (DKV_WIDE_MASK_SPLIT=1): bwd A/B, own processes new / old / new / old
    mkdir -p "$OUT/bench"
    i=0
    for v in new old new old; do
        i=$((i + 1))
        defs=; [ $v = new ] && defs=DKV_DQ_PUT2=1
        DUALKV_EXTRA_DEFINES=$defs TAIL=5 step put${i}_$v 90 python3 -m dualkv bench kernel --systems dualkv \
            --shapes 28:4096,8:8192,16:32768 --mode bwd --out "$OUT/bench/put${i}_$v"
        [ $v = new ] && defs=DKV_DQ_PUT2=1,DKV_WIDE_MASK_SPLIT=1
        for d in 256 192; do
            DUALKV_EXTRA_DEFINES=$defs TAIL=4 step wide${d}_${i}_$v 90 python3 -m dualkv bench kernel --systems dualkv \
                --head-dim $d --shapes 8:8192,16:16384 --mode bwd --out "$OUT/bench/wide${d}_${i}_$v"
        done
    done
    (cd "$OUT" && tar czf s23put.tgz *.log bench && rm -rf bench put*.log wide*.log)
    ;;
s23wide)
    # #12: the d = 256 WS backward's four-offset dQ_step put and unmasked P^T path (s23put's "new" at 256 only): the WS
    # backward's GPU tests (wsstages3's set: two-level at every head dim, the bf16 sweep, trees), then dualkv verify
    ws_backward_tests pytest_ws 260
    TAIL=3 step verify 150 python3 -m dualkv verify --no-progress --json "$OUT/verify.json"
    ;;
s23prof)
    # #12: wsprof2 again on the d = 128 WS backward with the unmasked P^T path (cae14dc), H200, one step of 170 s
    ws_ncu_profile 170 s23prof
    ;;
s24lse)
    # #12: LSE / D by 8-byte loads (DKV_LSE_VEC, keywalk.cuh's query_value at 9708e35; nvdisasm: WS d = 128 2586
    # against 2602 instructions, d = 256 3026 against 3034; the mma.sync builds already load the pairs by LDS.64, same
    # SASS) at d = 128 and 256, own processes new / old / new / old; then d = 256 fwd / bwd / fwd+bwd beside the cuDNN cascade
    # since the four-offset dQ_step put (0bc08b6), one process
    mkdir -p "$OUT/bench"
    i=0
    for v in 1 0 1 0; do
        i=$((i + 1))
        DUALKV_EXTRA_DEFINES=DKV_LSE_VEC=$v TAIL=4 step lse${i}_$v 80 python3 -m dualkv bench kernel --systems dualkv \
            --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/lse${i}_$v"
        DUALKV_EXTRA_DEFINES=DKV_LSE_VEC=$v TAIL=4 step lse256_${i}_$v 80 python3 -m dualkv bench kernel --systems dualkv \
            --head-dim 256 --shapes 8:8192,16:16384 --mode bwd --out "$OUT/bench/lse256_${i}_$v"
    done
    SHAPES=8:8192,16:16384,16:32768 TAIL=12 head_dim_bench w256_ 200 dualkv,cudnn_cascade fwd,bwd,fwdbwd 256
    (cd "$OUT" && tar czf s24lse.tgz *.log bench && rm -rf bench lse*.log w256_*.log)
    ;;
s24searly)
    # #12: the WS backward with the next step's S^T issued behind this step's dK (DKV_WS_S_EARLY=1; nvdisasm at
    # d = 128: 2734 against 2602 instructions, same spills, no serialized wgmma): bwd A/B at d = 128 (new / old / new /
    # old) and d = 64 / 96 (new / old), own processes; then under it the WS backward's GPU tests (s23tests' set) and
    # dualkv verify. Run at b35eeb2, where each step waited for its S^T before issuing dP^T, and as s24searly2 at
    # 3f4136e, dP^T queued at once (the d = 128 A/B, tests and verify only); the switch is gone since.
    TAIL=5 define_ab DKV_WS_S_EARLY "1 0 1 0" searly 80 --systems dualkv --shapes 28:4096,8:8192,16:32768 --mode bwd
    for d in 64 96; do
        for v in 1 0; do
            DUALKV_EXTRA_DEFINES=DKV_WS_S_EARLY=$v TAIL=4 step searly${d}_$v 80 python3 -m dualkv bench kernel \
                --systems dualkv --head-dim $d --shapes 8:8192,16:32768 --mode bwd --out "$OUT/bench/searly${d}_$v"
        done
    done
    export DUALKV_EXTRA_DEFINES=DKV_WS_S_EARLY=1
    ws_backward_tests pytest_ws 260
    TAIL=3 step verify 150 python3 -m dualkv verify --no-progress --json "$OUT/verify.json"
    (cd "$OUT" && tar czf s24searly.tgz *.log bench verify.json && rm -rf bench searly*.log)
    ;;
s24poly)
    # #12: part of the WS backward's P^T exponentials on the FMA pipe (DKV_EXP_POLY=k: the last k of 8 column groups by
    # exp2_fma, a degree-3 fit; nvdisasm at d = 128: k = 2 49 MUFU against 65, k = 3 41): bwd A/B at d = 128 for
    # k = 2 / 3 / 0, twice, own processes; then under the k with the lowest (16, 32K) median (when below k = 0's) the WS
    # backward's GPU tests and dualkv verify
    TAIL=5 define_ab DKV_EXP_POLY "2 3 0 2 3 0" poly 80 --systems dualkv --shapes 28:4096,8:8192,16:32768 --mode bwd
    best=$(python3 - "$OUT/bench" <<'PY'
import glob, json, statistics, sys
ms = {}
for path in glob.glob(sys.argv[1] + "/poly*_*/*.json"):
    k = path.split("/")[-2].split("_")[1]
    ms.setdefault(k, []).extend(r["ms"] for r in json.load(open(path))["rows"] if r["P"] == 32768)
mean = {k: statistics.mean(v) for k, v in ms.items()}
best = min(mean, key=mean.get)
print(best if best != "0" else "", file=sys.stdout)
print(mean, file=sys.stderr)
PY
)
    echo "fastest k: ${best:-0 (the default)}"
    if [ -n "$best" ]; then
        export DUALKV_EXTRA_DEFINES=DKV_EXP_POLY=$best
        ws_backward_tests pytest_ws 260
        TAIL=3 step verify 150 python3 -m dualkv verify --no-progress --json "$OUT/verify.json"
    fi
    (cd "$OUT" && tar czf s24poly.tgz *.log bench $(ls verify.json 2>/dev/null) && rm -rf bench poly*.log)
    ;;
s24diag)
    # #12: where the d = 128 WS backward's time goes now (wrong-dQ diagnostics, timing only, own processes): the
    # reduce-adds at half size (halfred: what a CTA pair summing its dQ_step before one add could save), none (nored),
    # no dQ counters (nosem), no consumer barrier (nobar), beside the default twice
    TAIL=8 step diag 300 python3 experiments/gpu/debug_ws_bwd.py --timing 16:32768,8:8192 \
        --variants base,halfred,nored,nosem,nobar,base --out "$OUT"
    (cd "$OUT" && tar czf s24diag.tgz diag.log debug_ws_bwd_timing.json)
    ;;
s24qdo)
    # #12: the bound on a Q / dO multicast to CTA pairs (wrong gradients, timing only, own processes): each step loads
    # half of Q's and dO's atoms (halfqdo), beside halfred and the default twice
    TAIL=6 step diag2 200 python3 experiments/gpu/debug_ws_bwd.py --timing 16:32768,8:8192 \
        --variants base,halfqdo,halfred,base --out "$OUT"
    (cd "$OUT" && tar czf s24qdo.tgz diag2.log debug_ws_bwd_timing.json)
    ;;
s24qdo2)
    # #12: s24qdo's bound with only the steps whose queries see the key block fully halved (halfqdo_shared: the steps a
    # pair of adjacent key blocks shares), beside halfqdo and the default twice
    TAIL=6 step diag3 200 python3 experiments/gpu/debug_ws_bwd.py --timing 16:32768,8:8192 \
        --variants base,halfqdo_shared,halfqdo,base --out "$OUT"
    (cd "$OUT" && tar czf s24qdo2.tgz diag3.log debug_ws_bwd_timing.json)
    ;;
s25split)
    # #12 / #13: DUALKV_TWO_LEVEL_DQ_ORDER=shared now also splits the WS backward's head-major CTA order (every KV
    # head's shared-key tiles, then every head's own-response tiles: the light tiles fill the last wave; CPU model
    # experiments/ws_order_model.py). The split's GPU test (bits equal for every split, both dQ orders), then bwd A/B
    # own / shared / own / shared (own processes) for the WS backward, one group and four, and the mma.sync family
    TAIL=3 step splittest 240 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py \
        -k "cta_split or ws_backward_is_bitwise"
    mkdir -p "$OUT/bench"
    i=0
    for order in own shared own shared; do
        i=$((i + 1))
        DUALKV_TWO_LEVEL_DQ_ORDER=$order TAIL=7 step ws${i}_$order 150 python3 -m dualkv bench kernel --systems dualkv \
            --shapes 28:4096,8:8192,16:32768,8:2048,16:1024 --mode bwd --out "$OUT/bench/ws${i}_$order"
    done
    for order in own shared; do
        DUALKV_TWO_LEVEL_DQ_ORDER=$order TAIL=4 step g4_$order 80 python3 -m dualkv bench kernel --systems dualkv \
            --groups 4 --shapes 8:8192,8:2048 --mode bwd --out "$OUT/bench/g4_$order"
        DUALKV_TWO_LEVEL_DQ_ORDER=$order TAIL=6 step mma_$order 200 python3 -m dualkv bench kernel --systems dualkv_mma \
            --shapes 28:4096,8:8192,16:32768,16:1024 --mode bwd --out "$OUT/bench/mma_$order"
    done
    (cd "$OUT" && tar czf s25split.tgz *.log bench && rm -rf bench ws*.log g4_*.log mma_*.log)
    ;;
s25tests)
    # #12 / #13: the shared-first dQ order (and the WS backward's split CTA order) as the default: the WS backward's
    # GPU tests, the mma.sync ordered mode's, the depth-1 tree against the two-level call (both families), verify
    ws_backward_tests pytest_ws 260
    ordered_tests pytest_ordered
    TAIL=3 step pytest_depth1 120 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_tree_cuda.py \
        -k "depth_one or cta_split"
    TAIL=3 step verify 150 python3 -m dualkv verify --no-progress --json "$OUT/verify.json"
    ;;
s25mma)
    # #13: the ordered mma.sync backward's CTA order (DUALKV_MMA_CTA_ORDER=head: the WS backward's split head-major
    # order) and its shared-first builds staging LSE / D one row per thread (DKV_SHARED_FIRST_ROW_STATS=1, as the
    # own-first builds did: sm_90 spills 56 / 96 bytes against 28 / 40). The CTA-order GPU tests (bits equal for every
    # order, both backwards), then bwd A/B in own processes: default, head, rowstats, both, default
    TAIL=3 step ctatests 240 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py \
        proofs_tests/test_cuda_backward.py -k "cta_orders or cta_split"
    mkdir -p "$OUT/bench"
    i=0
    for v in tile:0 head:0 tile:1 head:1 tile:0; do
        i=$((i + 1))
        DUALKV_MMA_CTA_ORDER=${v%:*} DUALKV_EXTRA_DEFINES=DKV_SHARED_FIRST_ROW_STATS=${v#*:} TAIL=6 \
            step mma${i}_${v%:*}${v#*:} 200 python3 -m dualkv bench kernel --systems dualkv_mma \
            --shapes 28:4096,8:8192,16:32768,16:1024 --mode bwd --out "$OUT/bench/mma${i}_${v%:*}${v#*:}"
    done
    (cd "$OUT" && tar czf s25mma.tgz *.log bench && rm -rf bench mma*.log)
    ;;
s25final)
    # #13: the ordered mma.sync mode's GPU tests now that its sm_90 shared-first builds stage LSE / D one row per thread,
    # the CTA-order tests, then the mma.sync family against the FA2 cascade at the issue's four shapes
    ordered_tests pytest_ordered
    TAIL=3 step ctatests 240 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py \
        proofs_tests/test_cuda_backward.py -k "cta_orders or cta_split"
    mkdir -p "$OUT/bench"
    TAIL=12 step table13 200 python3 -m dualkv bench kernel --systems dualkv_mma,cascade \
        --shapes 28:4096,8:8192,16:32768,16:65536 --mode bwd,fwdbwd --out "$OUT/bench"
    (cd "$OUT" && tar czf s25final.tgz *.log bench)
    ;;
s25floor)
    # #12: the dispatch floor (CASCADE_FASTER) at the shared-first default: the fused kernels (deterministic), the hybrid
    # (what deterministic=False runs at 64 / 128 on Hopper) and the cuDNN cascade, bwd and fwd+bwd, one process per
    # head dim at (16, 4K), (8, 8K), (16, 32K)
    TAIL=14 head_dim_bench floor 110 dualkv,dualkv_hybrid,cudnn_cascade bwd,fwdbwd 128 64 96
    (cd "$OUT" && tar czf s25floor.tgz *.log bench)
    ;;
s26a)
    # Session 25's CPU-only test fixes on the GPU (opcheck's arguments, the CTA-split spy, the WS depth-1 tree demanding
    # equal dQ bits), then short prompts / long responses, where the CPU model puts the WS backward 1.45-1.66x off ideal:
    # both families against both cascades, bwd and fwd+bwd, one group and four
    TAIL=3 step pending 300 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py \
        proofs_tests/test_tree_cuda_ws.py -k "opcheck or cta_split or depth_one"
    mkdir -p "$OUT/bench"
    TAIL=14 step short2k 200 python3 -m dualkv bench kernel --systems dualkv,cudnn_cascade,dualkv_mma,cascade \
        --shapes 16:1024,16:512 --R 2048 --mode bwd,fwdbwd --out "$OUT/bench/short2k"
    TAIL=14 step short4k 200 python3 -m dualkv bench kernel --systems dualkv,cudnn_cascade,dualkv_mma,cascade \
        --shapes 16:512,8:256 --R 4096 --mode bwd,fwdbwd --out "$OUT/bench/short4k"
    TAIL=10 step short4g 150 python3 -m dualkv bench kernel --systems dualkv,cudnn_cascade \
        --shapes 8:512 --R 4096 --groups 4 --mode bwd,fwdbwd --out "$OUT/bench/short4g"
    (cd "$OUT" && tar czf s26a.tgz *.log bench)
    ;;
s26b)
    # #12: the WS backward's split shared-key tiles (DUALKV_WS_SPLIT, ws_split.py; short prompts, long responses): its GPU
    # tests (criterion at every WS head dim, dQ bits, reproducible dK / dV, the paper API, opcheck through the split
    # table), bwd A/B off / auto / off / auto in own processes, then auto against the cuDNN cascade and the big shapes
    TAIL=3 step splittests 300 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_ws_split.py \
        proofs_tests/test_cuda_backward.py -k "split or opcheck"
    mkdir -p "$OUT/bench"
    i=0
    for s in off auto off auto; do
        i=$((i + 1))
        DUALKV_WS_SPLIT=$s TAIL=5 step sa${i}_$s 120 python3 -m dualkv bench kernel --systems dualkv \
            --shapes 16:1024,16:512 --R 2048 --mode bwd --out "$OUT/bench/sa${i}_$s"
        DUALKV_WS_SPLIT=$s TAIL=5 step sb${i}_$s 120 python3 -m dualkv bench kernel --systems dualkv \
            --shapes 16:512,8:256 --R 4096 --mode bwd --out "$OUT/bench/sb${i}_$s"
    done
    TAIL=10 step cmp2k 150 python3 -m dualkv bench kernel --systems dualkv,cudnn_cascade --shapes 16:1024,16:512 \
        --R 2048 --mode bwd,fwdbwd --out "$OUT/bench/cmp2k"
    TAIL=10 step cmp4k 150 python3 -m dualkv bench kernel --systems dualkv,cudnn_cascade --shapes 16:512,8:256 \
        --R 4096 --mode bwd,fwdbwd --out "$OUT/bench/cmp4k"
    TAIL=6 step big 200 python3 -m dualkv bench kernel --systems dualkv --shapes 28:4096,8:8192,16:32768 \
        --mode bwd --out "$OUT/bench/big"
    (cd "$OUT" && tar czf s26b.tgz *.log bench)
    ;;
s26c)
    # #12: the split as the default: the WS backward's GPU suite, the mma.sync ordered mode's (its table is unsplit),
    # dualkv verify
    ws_backward_tests pytest_ws 260
    TAIL=3 step splittests 200 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_ws_split.py \
        proofs_tests/test_cuda_backward.py -k "split or opcheck or deterministic"
    TAIL=3 step verify 150 python3 -m dualkv verify --no-progress --json "$OUT/verify.json"
    (cd "$OUT" && tar czf s26c.tgz *.log)
    ;;
s26d)
    # #13: the split shared-key tiles in the mma.sync ordered dQ mode (bwd_dkdv.cu, split_parts.cuh): its GPU tests and
    # the WS ones (the refactor into split_parts.cuh), the ordered mode's suite, bwd A/B off / auto / off / auto in own
    # processes, then auto against the FA2 cascade
    TAIL=3 step splittests 240 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_ws_split.py
    ordered_tests pytest_ordered
    mkdir -p "$OUT/bench"
    i=0
    for s in off auto off auto; do
        i=$((i + 1))
        DUALKV_WS_SPLIT=$s TAIL=5 step ma${i}_$s 120 python3 -m dualkv bench kernel --systems dualkv_mma \
            --shapes 16:1024,16:512 --R 2048 --mode bwd --out "$OUT/bench/ma${i}_$s"
    done
    TAIL=10 step mcmp 150 python3 -m dualkv bench kernel --systems dualkv_mma,cascade --shapes 16:1024,16:512 \
        --R 2048 --mode bwd,fwdbwd --out "$OUT/bench/mcmp"
    TAIL=10 step mcmp4k 150 python3 -m dualkv bench kernel --systems dualkv_mma,cascade --shapes 16:512,8:256 \
        --R 4096 --mode bwd,fwdbwd --out "$OUT/bench/mcmp4k"
    (cd "$OUT" && tar czf s26d.tgz *.log bench)
    ;;
s26e)
    # #13: the ordered mma.sync suite after s26d's failure (test_cta_orders_keep_the_bits compared CTA-split picks that now
    # also split the shared tiles; cta_split_runs turns that split off), the CTA-split tests of both backwards. Few
    # files come back: the logs go into one tarball
    ordered_tests pytest_ordered
    TAIL=3 step ctatests 240 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py \
        proofs_tests/test_cuda_backward.py -k "cta_orders or cta_split"
    (cd "$OUT" && tar czf s26e.tgz *.log && rm -f pytest_*.log ctatests.log)
    ;;
s26f)
    # #12: DUALKV_WS_SPLIT off / auto / off / auto (own processes, WS backward) at more one-group shapes (2 to 8 parts) and
    # with 28 query / 4 KV heads (Qwen2.5-7B): the split must never be slower. Few files come back: one tarball
    mkdir -p "$OUT/bench"
    i=0
    for s in off auto off auto; do
        i=$((i + 1))
        DUALKV_WS_SPLIT=$s TAIL=6 step fa${i}_$s 100 python3 -m dualkv bench kernel --systems dualkv \
            --shapes 8:1024,4:1024,8:512,32:512 --R 2048 --mode bwd --reps 10 --out "$OUT/bench/fa${i}_$s"
        DUALKV_WS_SPLIT=$s TAIL=4 step fb${i}_$s 100 python3 -m dualkv bench kernel --systems dualkv --heads 28 \
            --kv-heads 4 --shapes 16:1024,8:512 --R 2048 --mode bwd --reps 10 --out "$OUT/bench/fb${i}_$s"
    done
    (cd "$OUT" && tar czf s26f.tgz *.log bench && rm -rf fa*.log fb*.log bench)
    ;;
s26next)
    # Session 26 ran out of device time before these ran at its last commit: the WS backward's suite and dualkv verify
    # (last at 566e871, before the sum moved into split_parts.cuh), the split tests (last at f08f3f2), and the wgmma_v1
    # dK/dV kernel (bwd_dkdv_sm90), whose DKV_DKDV_PARAMS gained the four split arguments in f08f3f2
    ws_backward_tests pytest_ws 260
    TAIL=3 step wgmmav1 200 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_ws_split.py \
        proofs_tests/test_cuda_hd96.py proofs_tests/test_cuda_backward.py proofs_tests/test_tree_cuda_ws.py \
        -k "split or wgmma or hd96 or head_dim_96 or atomic_dq_mode"
    TAIL=3 step verify 150 python3 -m dualkv verify --no-progress --json "$OUT/verify.json"
    (cd "$OUT" && tar czf s26next.tgz *.log && rm -f pytest_*.log wgmmav1.log)
    ;;
s27rl)
    # #12 / #13: realistic RL micro-batches (several groups, short prompts, ragged responses: --R-range), both families
    # against both cascades, fwd / bwd / fwd+bwd; then both families again with the shared-tile split off (their own
    # processes): the split must not lose on ragged multi-group batches. Few files come back: one tarball + the table
    mkdir -p "$OUT/bench"
    peers=dualkv,cudnn_cascade,cascade,dualkv_mma
    rl g4 $peers 4 8:512,8:1024 256:4096
    rl g2 $peers 2 16:1024,16:2048 256:4096
    rl g8 $peers 8 8:256 128:2048
    rl g1 $peers 1 16:2048,16:4096 512:8192
    for b in "g4 4 8:512,8:1024 256:4096" "g2 2 16:1024,16:2048 256:4096" "g8 8 8:256 128:2048" \
             "g1 1 16:2048,16:4096 512:8192"; do
        set -- $b
        DUALKV_WS_SPLIT=off rl ${1}off dualkv,dualkv_mma $2 $3 $4
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/rl-table.json"
    (cd "$OUT" && tar czf s27rl.tgz *.log bench && rm -rf g*.log bench)
    ;;
s27fix)
    # #13: the mma.sync dK/dV kernel's rows past a step's last query add their zeros in place (no shared scratch block,
    # whose one-address adds serialized on ragged micro-batches): the family's GPU suites (ordered, ordered trees, its
    # backward and tree tests with the atomic mode, the dQ layout's cast, the split), dualkv verify under
    # DUALKV_KERNELS=mma, then ragged micro-batches and three Table 1 shapes against the FA2 cascade
    ordered_tests pytest_ordered
    mma_backward_tests pytest_mma
    TAIL=3 step pytest_layout 150 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_dq_layout.py \
        proofs_tests/test_cuda_ws_split.py
    DUALKV_KERNELS=mma TAIL=3 step verify_mma 200 python3 -m dualkv verify --no-progress --json "$OUT/verify-mma.json"
    rl g4 dualkv_mma,dualkv_mma_atomic,cascade,dualkv 4 8:512,8:1024 256:4096
    rl g1 dualkv_mma,dualkv_mma_atomic,cascade,dualkv 1 16:2048,16:4096 512:8192
    TAIL=1 step t1 240 python3 -m dualkv bench kernel --systems dualkv_mma,cascade --shapes 28:4096,8:8192,16:32768 \
        --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/t1"
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/fix-table.json"
    (cd "$OUT" && tar czf s27fix.tgz *.log bench && rm -rf pytest_*.log g*.log t1.log bench)
    ;;
s27ab)
    # #13: where the mma.sync dK/dV kernel adds a step's rows past its last query (DKV_DQ_PAST_ROWS, an A/B switch of
    # that call's tree: 0 in place, 0f1939c's; 1 a scratch slab per query head, each lane at its own address; 2 one
    # scratch block, every lane at one address, as before 0f1939c), own processes: bwd at two Table 1 shapes (twice,
    # alternating), then fwd / bwd / fwd+bwd on a ragged 4-group micro-batch (checks/s27ab-h200-20261129T0816Z.log).
    # The switch is not in the committed kernel: rerunning this part would time the same code three times
    if ! grep -q DKV_DQ_PAST_ROWS dualkv/cuda/csrc/bwd_dkdv.cu; then
        echo "s27ab needs the DKV_DQ_PAST_ROWS switch, which lived only in that call's tree"; exit 2
    fi
    mkdir -p "$OUT/bench"
    i=0
    for v in 0 1 2 0 1 2; do
        i=$((i + 1))
        DUALKV_EXTRA_DEFINES=DKV_DQ_PAST_ROWS=$v TAIL=1 step ab${i}_$v 150 python3 -m dualkv bench kernel \
            --systems dualkv_mma --shapes 8:8192,16:32768 --mode bwd --reps 10 --out "$OUT/bench/ab${i}_$v"
    done
    for v in 0 1 2; do
        DUALKV_EXTRA_DEFINES=DKV_DQ_PAST_ROWS=$v rl rg_$v dualkv_mma 4 8:512,8:1024 256:4096
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/ab-table.json"
    (cd "$OUT" && tar czf s27ab.tgz *.log bench && rm -rf ab*.log rg*.log bench)
    ;;
s27sweep)
    # #12 / #13: ragged 4-group micro-batches at other attention shapes (Qwen2.5-7B's 28 / 4 heads; head dims 64 and 256),
    # both families against both cascades: any pathology like the one s27rl found
    mkdir -p "$OUT/bench"
    peers=dualkv,cudnn_cascade,dualkv_mma,cascade
    TAIL=1 step q28 100 python3 -m dualkv bench kernel --systems $peers --heads 28 --kv-heads 4 --groups 4 \
        --shapes 8:512 --R-range 256:4096 --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/q28"
    TAIL=1 step d64 100 python3 -m dualkv bench kernel --systems $peers --head-dim 64 --groups 4 \
        --shapes 8:512 --R-range 256:4096 --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/d64"
    TAIL=1 step d256 100 python3 -m dualkv bench kernel --systems $peers --heads 16 --kv-heads 8 --head-dim 256 \
        --groups 4 --shapes 8:512 --R-range 256:4096 --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/d256"
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/sweep-table.json"
    (cd "$OUT" && tar czf s27sweep.tgz *.log bench && rm -rf q28.log d64.log d256.log bench)
    ;;
s28next)
    # #13: the split sum in the ordered mode's own build (DKV_SPLIT_TILES) and the copies' thread-index re-read
    # (DKV_ROWS_TID_AGAIN): session 28's call ran the ordered, ordered-tree, layout and split suites only
    # (checks/s28variants-h200-20261129T1051Z.log); here the family's other suites, verify, and the speed tables
    mma_backward_tests pytest_mma
    DUALKV_KERNELS=mma TAIL=3 step verify_mma 200 python3 -m dualkv verify --no-progress --json "$OUT/verify-mma.json"
    rl g4 dualkv_mma,dualkv_mma_atomic,cascade 4 8:512,8:1024 256:4096
    rl g1 dualkv_mma,dualkv_mma_atomic,cascade 1 16:2048,16:4096 512:8192
    TAIL=1 step t1 240 python3 -m dualkv bench kernel --systems dualkv_mma,cascade --shapes 28:4096,8:8192,16:32768 \
        --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/t1"
    if [ -d _hd ]; then
        TOOL=kernel_times OTHER=_hd OTHER_NAME=fb9d77d TAIL=6 bash experiments/gpu/ab_trees.sh --system dualkv_mma \
            --shapes 8:8192,16:32768 > "$OUT/kt.log" 2>&1; grep -E "^==|dkdv" "$OUT/kt.log"
    fi
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s28next-table.json"
    (cd "$OUT" && tar czf s28next.tgz *.log bench && rm -rf pytest_*.log g*.log t1.log kt.log bench)
    ;;
s28nvrtc)
    # #12 / #13: does another ptxas make the kernels faster? The GPU machine compiles with NVRTC 13.0, which spills the
    # mma.sync ordered sm_90 d = 128 build 60 / 104 bytes where 13.5 spills 20 / 28, and the mma.sync forward 8 / 8 where
    # 13.5 spills 152 / 168 (checks/s28spills-cpu-20261129.log). Before the call, here (43 MB; build/ is ignored, so name
    # it in the call's carry):
    #   mkdir -p build && tar cJf build/nvrtc135.tar.xz -C .venv/lib/python3.11/site-packages/nvidia/cu13/lib \
    #       libnvrtc.so.13 libnvrtc-builtins.so.13.5
    # One bench process per NVRTC (the 13.5 one compiles its kernels cold), then the 13.0 one again. The FA2 cascade is
    # the fixed control; the cuDNN cascade may not be one: cuDNN's runtime-compiled engines would also bind the 13.5
    # library that the 13.5 processes load first. The GPU tests under 13.5 are left to a later call.
    nvrtc135_unpack s28nvrtc
    nvrtc_release_bench 170
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s28nvrtc-table.json"
    (cd "$OUT" && tar czf s28nvrtc.tgz *.log bench && rm -rf b*.log bench)
    ;;
s29addr32)
    # #13: the mma.sync dK/dV kernel with 32-bit ldmatrix addresses (DKV_DKDV_ADDR32 = 1, or 2 with the lane re-read;
    # common.cuh DKV_LDSM_ADDR32). This machine's NVRTC 13.0 spills the d = 128 sm_90 causal shared-first ordered build
    # 60 / 104 bytes with a main loop of 1504 SASS instructions; 1: 36 / 56 and 1319; 2: 4 / 4 and 1315
    # (checks/s29addr32-cpu-20261129.log); untimed. Per-kernel times of the three builds, alternating, each in its own
    # process. The define is in every kernel's cache key: the first run of modes 1 and 2 compiles all it launches
    mkdir -p "$OUT/bench"
    for run in 1 2; do
        for v in 0 1 2; do
            DUALKV_EXTRA_DEFINES=DKV_DKDV_ADDR32=$v TAIL=14 step kt${run}_$v $((run == 1 ? 130 : 70)) \
                python3 experiments/gpu/kernel_times.py \
                --system dualkv_mma --shapes 8:8192,16:32768 --out "$OUT/bench/kt${run}_$v.json"
        done
    done
    (cd "$OUT" && tar czf s29addr32.tgz *.log bench && rm -rf kt*.log bench)
    ;;
s29addr32t)
    # #13: the GPU tests of the dK/dV kernel's builds with DKV_DKDV_ADDR32=$ADDR32 (default 2): ordered, ordered trees,
    # the mma.sync backward and tree suites (atomic mode included), and dualkv verify under DUALKV_KERNELS=mma
    export DUALKV_EXTRA_DEFINES=DKV_DKDV_ADDR32=${ADDR32:-2}
    ordered_tests pytest_ord
    mma_backward_tests pytest_mma
    DUALKV_KERNELS=mma TAIL=3 step verify_mma 150 python3 -m dualkv verify --no-progress --json "$OUT/verify-mma.json"
    ;;
s29addr32b)
    # #13: Table 1's shapes, fwd / bwd / fwd+bwd, the mma.sync family with DKV_DKDV_ADDR32=$ADDR32 (default 2) and
    # without, each beside the FA2 cascade in its own process
    mkdir -p "$OUT/bench"
    for v in 0 ${ADDR32:-2}; do
        DUALKV_EXTRA_DEFINES=DKV_DKDV_ADDR32=$v TAIL=1 step t1_$v 200 python3 -m dualkv bench kernel \
            --systems dualkv_mma,cascade --shapes 28:4096,8:8192,16:32768 --mode fwd,bwd,fwdbwd --reps 10 \
            --out "$OUT/bench/t1_$v"
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s29addr32b-table.json"
    (cd "$OUT" && tar czf s29addr32b.tgz *.log bench && rm -rf t1_*.log bench)
    ;;
s30nvrtc)
    # #13 / #12: the dK/dV kernel's ldmatrix addressing now follows the NVRTC release (967baf2's build.py: 2
    # before 13.5, 1 from 13.5; under 13.0 mode 2 measured 226.4 against 239.3 ms at (16, 32K), s29addr32). Here: the
    # three modes under NVRTC 13.5 (carried: build/nvrtc135.tar.xz, see s28nvrtc), alternating, each in its own
    # process; then s28nvrtc's comparison of the two releases' default builds (13.0, 13.5, 13.0 again; the FA2 cascade
    # is the fixed control)
    nvrtc135_unpack s30nvrtc
    mkdir -p "$OUT/bench"
    for run in 1 2; do
        for v in 0 1 2; do
            DUALKV_NVRTC_LIB=/tmp/nv135 DUALKV_EXTRA_DEFINES=DKV_DKDV_ADDR32=$v TAIL=14 step kt135_${run}_$v \
                $((run == 1 ? 150 : 70)) python3 experiments/gpu/kernel_times.py \
                --system dualkv_mma --shapes 8:8192,16:32768 --out "$OUT/bench/kt135_${run}_$v.json"
        done
    done
    nvrtc_release_bench 200
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s30nvrtc-table.json"
    (cd "$OUT" && tar czf s30nvrtc.tgz *.log bench && rm -rf kt*.log b*.log bench)
    ;;
s30mode1)
    # #13: mode 1 of the dK/dV kernel's ldmatrix addressing (the default from NVRTC 13.1 on) through the GPU tests,
    # here under NVRTC 13.0 (the same source path; its ptxas output differs), and the atomic dQ mode's dK/dV build
    # under 13.0 with modes 1 and 2 (static counts, d = 128 sm_90 causal: 1344 instructions and no spills against
    # 1400 and 4 / 4 bytes), alternating, each in its own process
    mkdir -p "$OUT/bench"
    for run in 1 2; do
        for v in 1 2; do
            DUALKV_EXTRA_DEFINES=DKV_DKDV_ADDR32=$v TAIL=6 step kta${run}_$v $((run == 1 ? 130 : 70)) \
                python3 experiments/gpu/kernel_times.py \
                --system dualkv_mma_atomic --shapes 8:8192,16:32768 --out "$OUT/bench/kta${run}_$v.json"
        done
    done
    export DUALKV_EXTRA_DEFINES=DKV_DKDV_ADDR32=1
    ordered_tests pytest_ord
    mma_backward_tests pytest_mma
    DUALKV_KERNELS=mma TAIL=3 step verify_mma 150 python3 -m dualkv verify --no-progress --json "$OUT/verify-mma.json"
    (cd "$OUT" && tar czf s30mode1.tgz *.log bench && rm -rf kta*.log bench)
    ;;
s30final)
    # #13: the default build now (each mma.sync dK/dV build compiled in the first ldmatrix addressing mode that spills
    # nothing, build.compiler_chosen_macros): the family's backward and tree tests, verify, and Table 1's first three shapes
    # against the FA2 cascade in one process
    TAIL=3 mma_backward_tests pytest_mma
    DUALKV_KERNELS=mma TAIL=3 step verify_mma 150 python3 -m dualkv verify --no-progress --json "$OUT/verify-mma.json"
    mkdir -p "$OUT/bench"
    TAIL=1 step t1 200 python3 -m dualkv bench kernel --systems dualkv_mma,cascade \
        --shapes 28:4096,8:8192,16:32768 --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/t1"
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s30final-table.json"
    (cd "$OUT" && tar czf s30final.tgz *.log bench && rm -rf t1.log bench)
    ;;
s31next)
    # #13 at the per-build addressing default (bdc6033; not yet run): (16, 64K) and FA2 N-copy beside the FA2 cascade;
    # the ragged RL micro-batches of s27rl / s28next
    mkdir -p "$OUT/bench"
    TAIL=1 step t1 250 python3 -m dualkv bench kernel --systems dualkv_mma,cascade,fa2_ncopy \
        --shapes 16:32768,16:65536 --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/t1"
    rl g4 dualkv_mma,dualkv_mma_atomic,cascade 4 8:512,8:1024 256:4096
    rl g1 dualkv_mma,dualkv_mma_atomic,cascade 1 16:2048,16:4096 512:8192
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s31next-table.json"
    (cd "$OUT" && tar czf s31next.tgz *.log bench && rm -rf t1.log g*.log bench)
    ;;
s31ncu)
    # #13 (not yet run): ncu of the ordered dK/dV kernel in its kept addressing mode against FA2's dq_dk_dv kernel at
    # (8, 8K), as mmaprof
    mma_bwd_ncu ordered fa2
    (cd "$OUT" && tar czf s31ncu.tgz *.log ncu_* && rm -rf ncu_*)
    ;;
s31fwd)
    # #13: the mma.sync forward's tile description in smem (DKV_FWD_TILE_SMEM, chosen per build, 0 unless 0 spills and 1
    # spills less): the forward GPU tests and verify with 1 forced (NVRTC 13.0); the forward at (8, 8K) and (16, 32K)
    # in alternating processes: 13.0 default (keeps 0 for this build: both spill 8 / 8 B), 13.5 default (keeps 1: 0 B
    # against 152 / 168), 13.0 forced 1, 13.5 forced 0, then both defaults again; the FA2 cascade in the first
    nvrtc135_unpack s31fwd
    DUALKV_EXTRA_DEFINES=DKV_FWD_TILE_SMEM=1 DUALKV_KERNELS=mma TAIL=3 step pytest_fwd_smem 150 python3 -m pytest -q -x \
        -m gpu -p no:cacheprovider proofs_tests/test_cuda_forward.py
    DUALKV_EXTRA_DEFINES=DKV_FWD_TILE_SMEM=1 DUALKV_KERNELS=mma TAIL=3 step verify_fwd_smem 150 python3 -m dualkv verify \
        --no-progress --json "$OUT/verify-mma-fwdsmem.json"
    mkdir -p "$OUT/bench"
    for run in 1_130_def 1_135_def 1_130_1 1_135_0 2_130_def 2_135_def; do
        rel=${run#*_}; rel=${rel%_*}; v=${run##*_}
        lib=$([ $rel = 135 ] && echo /tmp/nv135 || echo "")
        def=$([ $v = def ] && echo "" || echo DKV_FWD_TILE_SMEM=$v)
        sys=$([ $run = 1_130_def ] && echo dualkv_mma,cascade || echo dualkv_mma)
        DUALKV_NVRTC_LIB=$lib DUALKV_EXTRA_DEFINES=$def DUALKV_COMMIT="${DUALKV_COMMIT:-}+nvrtc$rel+tile$v" TAIL=1 \
            step f$run 100 python3 -m dualkv bench kernel --systems $sys --shapes 8:8192,16:32768 --mode fwd \
            --reps 10 --out "$OUT/bench/f$run"
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s31fwd-table.json"
    (cd "$OUT" && tar czf s31fwd.tgz *.log bench && rm -rf f*.log bench)
    ;;
s31swz)
    # #13: the mma.sync dK/dV kernel's Q / dO tiles swizzled (DKV_QDO_SWIZZLE=1; ncu at s31ncu: the padded tiles'
    # cp.async copies take 2.6x the ideal shared wavefronts and 1.5x the ideal L2 sectors): the family's backward and tree tests
    # with it, then the backward at (8, 8K) and (16, 32K), ordered and atomic, swizzle 0 / 1 alternating (two rounds);
    # last the (16, 64K) row s31next's t1 step had no time for (defaults, with the FA2 cascade)
    DUALKV_EXTRA_DEFINES=DKV_QDO_SWIZZLE=1 TAIL=3 mma_backward_tests pytest_swz
    define_ab DKV_QDO_SWIZZLE "0 1 0 1" swz 100 --systems dualkv_mma,dualkv_mma_atomic --shapes 8:8192,16:32768 \
        --mode bwd --reps 10
    mkdir -p "$OUT/bench"
    TAIL=1 step t64 150 python3 -m dualkv bench kernel --systems dualkv_mma,cascade --shapes 16:65536 \
        --mode fwd,bwd,fwdbwd --reps 5 --out "$OUT/bench/t64"
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s31swz-table.json"
    (cd "$OUT" && tar czf s31swz.tgz *.log bench && rm -rf swz*.log t64.log bench)
    ;;
s31final)
    # #13 (ran at c06de09; DKV_FWD_SWIZZLE was removed after it, so this part no longer builds what it names): the
    # swizzled forward (DKV_FWD_SWIZZLE=1): the forward GPU tests and verify
    # with it; the backward's default swizzled Q / dO tiles on the one-dO-buffer layout (DUALKV_MMA_BWD_QWARPS=2do1,
    # the sm_80 d = 128 builds' layout, run here on sm_90): the d = 128 backward tests; then the forward at (8, 8K) /
    # (16, 32K) (below); last Table 1's rows against the FA2 cascade with the fastest
    DUALKV_EXTRA_DEFINES=DKV_FWD_SWIZZLE=1 DUALKV_KERNELS=mma TAIL=3 step pytest_fwdswz 120 python3 -m pytest -q -x \
        -m gpu -p no:cacheprovider proofs_tests/test_cuda_forward.py
    DUALKV_EXTRA_DEFINES=DKV_FWD_SWIZZLE=1 DUALKV_KERNELS=mma TAIL=3 step verify_fwdswz 100 python3 -m dualkv verify \
        --no-progress --json "$OUT/verify-mma-fwdswz.json"
    DUALKV_MMA_BWD_QWARPS=2do1 DUALKV_KERNELS=mma TAIL=3 step pytest_do1 80 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_cuda_backward.py -k "128 and not ws_backward and not prep_kernel \
        and not opcheck and not compile"
    # forward A/B: (swizzle 0, the tile choice: registers) / (1, the choice: smem, as 1 spills 28 / 28 B with registers
    # under 13.0) / (1, registers forced) / the first again
    mkdir -p "$OUT/bench"
    local_i=0
    for def in none DKV_FWD_SWIZZLE=1 DKV_FWD_SWIZZLE=1,DKV_FWD_TILE_SMEM=0 none; do
        local_i=$((local_i + 1)); d=$([ $def = none ] && echo "" || echo $def)
        DUALKV_EXTRA_DEFINES=$d TAIL=1 step fswz$local_i 50 python3 -m dualkv bench kernel --systems dualkv_mma \
            --shapes 8:8192,16:32768 --mode fwd --reps 10 --out "$OUT/bench/fswz$local_i"
    done
    # the fastest forward (mean over its processes of the summed medians of both shapes) for the table
    best=$(python3 -c "
import collections, glob, json
ms = collections.defaultdict(list)
for f in glob.glob('$OUT/bench/fswz*/kernel-*.json'):
    d = json.load(open(f))
    ms[d['environment'].get('extra_defines') or ''].append(sum(r['ms'] for r in d['rows']))
print(min(ms, key=lambda k: sum(ms[k]) / len(ms[k])))")
    echo "forward defines for the table: '$best'"
    mkdir -p "$OUT/bench"
    DUALKV_EXTRA_DEFINES=$best TAIL=1 step t1 150 python3 -m dualkv bench kernel \
        --systems dualkv_mma,cascade --shapes 28:4096,8:8192,16:32768 --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/t1"
    DUALKV_EXTRA_DEFINES=$best TAIL=1 step t64 100 python3 -m dualkv bench kernel \
        --systems dualkv_mma,cascade --shapes 16:65536 --mode fwd,bwd,fwdbwd --reps 5 --out "$OUT/bench/t64"
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s31final-table.json"
    (cd "$OUT" && tar czf s31final.tgz *.log bench && rm -rf fswz*.log t1.log t64.log bench)
    ;;
s31check)
    # #13: s31final's table measured the default backward (swizzled Q / dO) 240.2 ms at (16, 32K) where s31swz measured
    # that build 224.7-224.8 (bwd-only processes, default forward); here the backward and fwd+bwd of the default
    # (no extra defines) and of the padded tiles (DKV_QDO_SWIZZLE=0), one process each, with the default forward.
    # Run with COMPILE_S=1: the processes compile what they use.
    mkdir -p "$OUT/bench"
    for run in c1_def c2_0; do
        d=$([ $run = c2_0 ] && echo DKV_QDO_SWIZZLE=0 || echo "")
        DUALKV_EXTRA_DEFINES=$d TAIL=1 step $run 100 python3 -m dualkv bench kernel --systems dualkv_mma \
            --shapes 8:8192,16:32768 --mode bwd,fwdbwd --reps 10 --out "$OUT/bench/$run"
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s31check-table.json"
    (cd "$OUT" && tar czf s31check.tgz *.log bench && rm -rf c1_def.log c2_0.log bench)
    ;;
s32next)
    # #13 (not yet run): the mma.sync family at the s31 defaults (swizzled Q / dO tiles; the forward's tile choice)
    # against the FA2 cascade at Table 1's four shapes (t1: three shapes in one process; t64: (16, 64K)); then ncu of the
    # ordered dK/dV kernel at (8, 8K), to set beside s31ncu's FA2 profile (checks/s31ncu-*)
    mkdir -p "$OUT/bench"
    TAIL=1 step t1 200 python3 -m dualkv bench kernel --systems dualkv_mma,cascade --shapes 28:4096,8:8192,16:32768 \
        --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/t1"
    TAIL=1 step t64 120 python3 -m dualkv bench kernel --systems dualkv_mma,cascade --shapes 16:65536 \
        --mode fwd,bwd,fwdbwd --reps 5 --out "$OUT/bench/t64"
    mma_bwd_ncu ordered
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s32next-table.json"
    (cd "$OUT" && tar czf s32next.tgz *.log ncu_* bench && rm -rf t1.log t64.log ncu_* bench)
    ;;
s32mid)
    # #13 (ran at an uncommitted tree on d25c20d; both macros were dropped after it, so this part no longer builds what
    # it names; bwd_dkdv.cu records the result): the mma.sync dK/dV kernel's dQ product and adds between the dV and dK
    # products (DKV_DQ_MID) and q_start read anew for the adds (DKV_DQ_QSTART_AGAIN), both 1 by default then; s32next's
    # ncu put 7% of the ordered kernel's stall samples on LG throttle at the adds and 6.5% on two spill instructions
    # (NVRTC 13.0), which the pair removes from its loop. Backward (and forward) of both dQ modes at (8, 8K) / (16, 32K), one process per variant, two
    # rounds: 13.0 with (1, 1), (0, 0), (1, 0); NVRTC 13.5 (carried) with (1, 1), (0, 0). Then ncu of the default.
    nvrtc135_unpack s32mid
    mkdir -p "$OUT/bench"
    local_variants="v11:DKV_DQ_MID=1,DKV_DQ_QSTART_AGAIN=1: v00:DKV_DQ_MID=0,DKV_DQ_QSTART_AGAIN=0: \
v10:DKV_DQ_MID=1,DKV_DQ_QSTART_AGAIN=0: w11:DKV_DQ_MID=1,DKV_DQ_QSTART_AGAIN=1:/tmp/nv135 \
w00:DKV_DQ_MID=0,DKV_DQ_QSTART_AGAIN=0:/tmp/nv135"
    variants_warm "$local_variants" --systems dualkv_mma,dualkv_mma_atomic --shapes 8:8192 --mode bwd --reps 1
    variants_ab "$local_variants" 2 90 --systems dualkv_mma,dualkv_mma_atomic --shapes 8:8192,16:32768 --mode fwd,bwd \
        --reps 10
    mma_bwd_ncu ordered
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s32mid-table.json"
    (cd "$OUT" && tar czf s32mid.tgz *.log ncu_* bench && rm -rf ab[12]_*.log warm_*.log ncu_* bench)
    ;;
s32t135)
    # #13: Table 1's rows of the mma.sync family against the FA2 cascade (t1: three shapes in one process; t64: (16, 64K)),
    # the family compiled by NVRTC 13.5 (carried; what a fresh `pip install dualkv[cu13]` installs, and on sm_90 the build
    # whose ordered dK/dV kernel does not spill: s32mid measured its backward 4.5% faster than 13.0's); then ncu of the
    # forward at (16, 32K), dualkv's one launch against FA2's three; last the family's backward and tree GPU tests under
    # 13.5 (run with COMPILE_S=1: everything here compiles with 13.5, in step warm135)
    mma_table135 s32t135
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s32t135-table.json"
    mma_fwd_ncu 16:32768 dualkv fa2
    TAIL=3 mma_backward_tests pytest135 170
    (cd "$OUT" && tar czf s32t135.tgz *.log ncu_* bench && rm -rf t1.log t64.log ncu_* bench)
    ;;
s32final)
    # #13: correctness at the defaults (2044a70's kernels): dualkv verify under DUALKV_KERNELS=mma with the machine's
    # NVRTC 13.0 (not run since the swizzled Q / dO tiles became the default); then, with NVRTC 13.5 (carried), the
    # family's forward GPU tests (its backward and tree tests passed under 13.5 in s32t135) and the ragged RL
    # micro-batches of s31next (4 groups, 1 group) against the FA2 cascade
    DUALKV_KERNELS=mma TAIL=2 step verify130 150 python3 -m dualkv verify --no-progress --json "$OUT/verify-mma-130.json"
    nvrtc135_unpack s32final
    export DUALKV_NVRTC_LIB=/tmp/nv135
    step warm135 150 python3 -m dualkv kernels --compile-only --arch sm_90 --kernel fwd --kernel bwd_dkdv \
        --kernel bwd_prep --kernel bwd_dq_frag_cast --kernel bwd_dq --jobs 16 --no-progress
    DUALKV_KERNELS=mma TAIL=3 step pytest_fwd135 150 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_forward.py
    rl g4 dualkv_mma,dualkv_mma_atomic,cascade 4 8:512,8:1024 256:4096
    rl g1 dualkv_mma,dualkv_mma_atomic,cascade 1 16:2048,16:4096 512:8192
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s32final-table.json"
    (cd "$OUT" && tar czf s32final.tgz *.log bench && rm -rf g*.log bench)
    ;;
s32geom)
    # #13 (ran at c258674, where the default was 0; 1 was the default after it, and the macro was then removed with the
    # old form, so this part no longer builds what it names; fwd.cu records the result): the mma.sync forward working
    # out each key block before the barrier that opens it (DKV_FWD_GEOM_EARLY; s32t135's ncu put 3.9% of its stall
    # samples on the tile reads and ISETPs right after the barriers): forward ms at (8, 8K), (16, 32K), (16, 64K), 0 and
    # 1 under NVRTC 13.0 (e) and 13.5 (f, carried), one process each, two rounds; then with 1 under 13.5 the forward GPU
    # tests and the tree tests' rule check (run with COMPILE_S=1)
    nvrtc135_unpack s32geom
    mkdir -p "$OUT/bench"
    local_variants="e0:DKV_FWD_GEOM_EARLY=0: e1:DKV_FWD_GEOM_EARLY=1: f0:DKV_FWD_GEOM_EARLY=0:/tmp/nv135 \
f1:DKV_FWD_GEOM_EARLY=1:/tmp/nv135"
    variants_warm "$local_variants" --systems dualkv_mma --shapes 8:8192 --mode fwd --reps 1
    variants_ab "$local_variants" 2 60 --systems dualkv_mma --shapes 8:8192,16:32768,16:65536 --mode fwd --reps 10
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s32geom-table.json"
    export DUALKV_EXTRA_DEFINES=DKV_FWD_GEOM_EARLY=1 DUALKV_NVRTC_LIB=/tmp/nv135 DUALKV_KERNELS=mma
    TAIL=3 step pytest_geom 100 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_cuda_forward.py
    TAIL=3 step pytest_geom_tree 100 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_tree_cuda.py \
        -k meet_the_rule
    (cd "$OUT" && tar czf s32geom.tgz *.log bench && rm -rf ab[12]_*.log warm_*.log bench)
    ;;
s33seg)
    # #13 (ran at e1aad6c; the macro was then removed, so this part no longer builds what it names; bwd_dkdv.cu keeps the
    # numbers): the mma.sync dK/dV kernel's segment row staged in smem with the step's copies (DKV_STEP_SEG_SMEM).
    # Backward of both dQ modes at (8, 8K) / (16, 32K), 0 / 1 under 13.0 (s) and 13.5 (t, carried), one process each,
    # two rounds
    nvrtc135_unpack s33seg
    local_variants="s0:DKV_STEP_SEG_SMEM=0: s1:DKV_STEP_SEG_SMEM=1: t0:DKV_STEP_SEG_SMEM=0:/tmp/nv135 \
t1:DKV_STEP_SEG_SMEM=1:/tmp/nv135"
    mma_bwd_ab s33seg "$local_variants" 60
    ;;
s33table)
    # #13 (ran at e1aad6c, but its rows do not stand: the precompile after s33seg's compilations on the same machine
    # was served from NVRTC's own cache without ptxas reports, and kept spilling builds; s33cache found it and s33fix
    # replaces it. Run with COMPILE_S=150, carry build/nvrtc135.tar.xz): Table 1's rows of the mma.sync family
    # against the FA2 cascade at the defaults since s32 (DKV_FWD_GEOM_EARLY=1), one process per row set under the
    # machine's NVRTC 13.0 (t1, t64), then under 13.5 (u1, u64)
    nvrtc135_unpack s33table
    mkdir -p "$OUT/bench"
    for lib in "" /tmp/nv135; do
        p=$([ -z "$lib" ] && echo t || echo u)
        DUALKV_NVRTC_LIB=$lib TAIL=1 step ${p}1 200 python3 -m dualkv bench kernel --systems dualkv_mma,cascade \
            --shapes 28:4096,8:8192,16:32768 --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/${p}1"
        DUALKV_NVRTC_LIB=$lib TAIL=1 step ${p}64 120 python3 -m dualkv bench kernel --systems dualkv_mma,cascade \
            --shapes 16:65536 --mode fwd,bwd,fwdbwd --reps 5 --out "$OUT/bench/${p}64"
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s33table-table.json"
    (cd "$OUT" && tar czf s33table.tgz *.log bench && rm -rf [tu]1.log [tu]64.log bench)
    ;;
s33cache)
    # #13 (ran at fe05ae9: the precompile p0 kept NVRTC 13.0's preferred, spilling dK/dV mode 2 for the two ordered
    # builds the bench runs, and mode 0 for the forward, with no ptxas report in their logs, where the lazy l1 had kept
    # mode 1; p1's backward 240.8 against l1's 226.4 ms. Run with COMPILE_S=1, carry build/nvrtc135.tar.xz): s33table measured the family 6-7% slower at
    # (16, 32K) than s32 did at the same kernels (13.0 backward 242.0 against s33seg's 228.3 in the same machine an hour
    # before; 13.5 forward 86.7 against s32geom's 79.1, which is what s31fwd measured for the spilling DKV_FWD_TILE_SMEM=0
    # build). Each process here logs the cubins it ran (DUALKV_BUILD_LOG) in its own cache: 13.0 compiled lazily (l1),
    # the same cache again (l2), 13.0 precompiled by `dualkv kernels` first (p1), 13.5 lazily (u1) and again (u2)
    nvrtc135_unpack s33cache
    mkdir -p "$OUT/bench"
    bench_logged() {  # bench_logged NAME CACHE NVRTC_LIB SECONDS
        DUALKV_CACHE_DIR=$2 DUALKV_NVRTC_LIB=$3 DUALKV_BUILD_LOG="$OUT/build_$1.jsonl" TAIL=1 step "$1" "$4" \
            python3 -m dualkv bench kernel --systems dualkv_mma,cascade --shapes 8:8192,16:32768 \
            --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/$1"
    }
    bench_logged l1 /tmp/cache_a "" 200
    bench_logged l2 /tmp/cache_a "" 100
    DUALKV_CACHE_DIR=/tmp/cache_b DUALKV_BUILD_LOG="$OUT/build_p0.jsonl" step p0 150 python3 -m dualkv kernels \
        --compile-only --arch sm_90 --jobs 16 --no-progress
    bench_logged p1 /tmp/cache_b "" 100
    bench_logged u1 /tmp/cache_c /tmp/nv135 200
    bench_logged u2 /tmp/cache_c /tmp/nv135 100
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s33cache-table.json"
    (cd "$OUT" && tar czf s33cache.tgz *.log build_*.jsonl bench && rm -rf [lpu][012].log build_*.jsonl bench)
    ;;
s33fix)
    # #13 (ran at cfdcafa; run with COMPILE_S=1, carry build/nvrtc135.tar.xz): with -v compilations bypassing NVRTC's own
    # cache (build.nvrtc_caches), Table 1's rows of the mma.sync family against the FA2 cascade, 13.0 lazily compiled
    # (t1, t64), then a precompile into a second cache after it (p0: every compiler-chosen build must carry its spill
    # report and keep what t1 kept), then 13.5 (u1, u64); each process logs its cubins (DUALKV_BUILD_LOG)
    nvrtc135_unpack s33fix
    mkdir -p "$OUT/bench"
    for lib in "" /tmp/nv135; do
        p=$([ -z "$lib" ] && echo t || echo u)
        export DUALKV_CACHE_DIR=/tmp/cache_$p DUALKV_NVRTC_LIB=$lib
        DUALKV_BUILD_LOG="$OUT/build_${p}1.jsonl" TAIL=1 step ${p}1 240 python3 -m dualkv bench kernel \
            --systems dualkv_mma,cascade --shapes 28:4096,8:8192,16:32768 --mode fwd,bwd,fwdbwd --reps 10 \
            --out "$OUT/bench/${p}1"
        DUALKV_BUILD_LOG="$OUT/build_${p}64.jsonl" TAIL=1 step ${p}64 120 python3 -m dualkv bench kernel \
            --systems dualkv_mma,cascade --shapes 16:65536 --mode fwd,bwd,fwdbwd --reps 5 --out "$OUT/bench/${p}64"
        if [ $p = t ]; then
            DUALKV_CACHE_DIR=/tmp/cache_p DUALKV_BUILD_LOG="$OUT/build_p0.jsonl" step p0 150 python3 -m dualkv kernels \
                --compile-only --arch sm_90 --jobs 16 --no-progress
        fi
    done
    unset DUALKV_CACHE_DIR DUALKV_NVRTC_LIB
    TAIL=20 step buildcheck 30 python3 experiments/gpu/build_log_check.py "$OUT"/build_t1.jsonl "$OUT"/build_p0.jsonl
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s33fix-table.json"
    (cd "$OUT" && tar czf s33fix.tgz *.log build_*.jsonl bench && rm -rf [tup]1.log [tu]64.log p0.log build_*.jsonl bench)
    ;;
s33final)
    # #13 (ran at 19397e5: 624/624, 223 passed; run with COMPILE_S=150): correctness at the end of s33 (the segment-row switch gone, -v
    # compilations bypassing NVRTC's cache) under the machine's NVRTC 13.0: dualkv verify under DUALKV_KERNELS=mma, the
    # family's backward and tree GPU tests; the precompile's builds logged and checked for spill reports
    DUALKV_KERNELS=mma TAIL=2 step verify130 200 python3 -m dualkv verify --no-progress --json "$OUT/verify-mma-130.json"
    TAIL=3 mma_backward_tests pytest_bwd 300
    if [ -n "${DUALKV_BUILD_LOG:-}" ]; then  # (set it in the call to log the precompile too)
        TAIL=4 step buildcheck 30 python3 experiments/gpu/build_log_check.py "$DUALKV_BUILD_LOG"
    fi
    ;;
s33rl)
    # #13 (ran at 4b5d741; run with COMPILE_S=1): s32final's ragged RL micro-batches (4 groups x (8, 512) / (8, 1024), R in
    # 256-4096; 1 group (16, 2048) / (16, 4096), R in 512-8192) under torch's NVRTC 13.0, which is what a user without
    # DUALKV_NVRTC_LIB compiles with (s32final ran them under 13.5)
    rl g4 dualkv_mma,dualkv_mma_atomic,cascade 4 8:512,8:1024 256:4096
    rl g1 dualkv_mma,dualkv_mma_atomic,cascade 1 16:2048,16:4096 512:8192
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s33rl-table.json"
    (cd "$OUT" && tar czf s33rl.tgz *.log bench && rm -rf g*.log bench)
    ;;
s33hopper)
    # #12 (ran at a090de0: 1.17 / 1.07 / 1.02x; run with COMPILE_S=1): the default (Hopper) family against the cuDNN and FA2 cascades at (28, 4K),
    # (8, 8K), (16, 32K), one process, fwd / bwd / fwd+bwd, builds logged: a check that the shared headers changed for
    # the mma.sync family since the README's headline (7227113) left the default's speed where it was
    mkdir -p "$OUT/bench"
    DUALKV_BUILD_LOG="$OUT/build_h1.jsonl" TAIL=1 step h1 250 python3 -m dualkv bench kernel \
        --systems dualkv,cudnn_cascade,cascade --shapes 28:4096,8:8192,16:32768 --mode fwd,bwd,fwdbwd --reps 10 \
        --out "$OUT/bench/h1"
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s33hopper-table.json"
    (cd "$OUT" && tar czf s33hopper.tgz *.log build_*.jsonl bench && rm -rf h1.log build_*.jsonl bench)
    ;;
s33atomic)
    # #13 (ran at 53f72d3: the kept mode 0 is fastest; run with COMPILE_S=1): under NVRTC 13.0 the sm_90 d = 128
    # atomic-dQ dK/dV builds keep DKV_DKDV_ADDR32 mode 0 (the first of 1, 2, 0 that spills nothing on the CPU); s30
    # measured mode 1 faster than 2 for them but never 0. Backward of dualkv_mma_atomic at (16, 32K) and on s33rl's
    # 1-group ragged micro-batch (where it is 13% slower than the ordered default), modes 0 / 1 / 2 fixed, one process each
    mkdir -p "$OUT/bench"
    for v in 0 1 2; do
        DUALKV_EXTRA_DEFINES=DKV_DKDV_ADDR32=$v TAIL=1 step m$v 80 python3 -m dualkv bench kernel \
            --systems dualkv_mma_atomic --shapes 16:32768 --mode bwd --reps 10 --out "$OUT/bench/m$v"
        DUALKV_EXTRA_DEFINES=DKV_DKDV_ADDR32=$v TAIL=1 step r$v 60 python3 -m dualkv bench kernel \
            --systems dualkv_mma_atomic --groups 1 --shapes 16:2048 --R-range 512:8192 --mode bwd --reps 10 \
            --out "$OUT/bench/r$v"
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s33atomic-table.json"
    (cd "$OUT" && tar czf s33atomic.tgz *.log bench && rm -rf [mr][012]*.log bench)
    ;;
s32nvrtc)
    # #12 / #13 (ran in s36, checks/s32nvrtc-*): NVRTC 13.5 (carry build/nvrtc135.tar.xz) against the machine's 13.0 at the s31 defaults:
    # both families and both cascades at (8, 8K) and (16, 32K), three processes (13.0, 13.5, 13.0); under 13.5 the
    # mma.sync forward now keeps its tile in smem (s31fwd: 9.26 / 80.30 against 10.33 / 86.39 ms)
    nvrtc135_unpack s32nvrtc
    nvrtc_release_bench 200
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s32nvrtc-table.json"
    (cd "$OUT" && tar czf s32nvrtc.tgz *.log bench && rm -rf b[12]_*.log bench)
    ;;
s34mc)
    # #12 (ran at 111df8e: bitwise equal, 29-35% slower; the build was then removed, so this part no longer builds what
    # it names; bwd_sm90_ws.cu keeps the numbers. Run with COMPILE_S=1): the WS backward's Q / dO multicast to CTA pairs
    # (DUALKV_WS_MULTICAST, DKV_QDO_MC).
    # Both builds of the WS backward and the forwards precompiled in parallel; multicast_check.py (bitwise against the
    # plain build, a known-wrong multicast caught); then backward-only A/B at (8, 8K) / (16, 32K), off / on alternating,
    # one process each, two rounds; builds logged
    ( DUALKV_WS_MULTICAST=on timeout 200 python3 -m dualkv kernels --compile-only --arch sm_90 --kernel bwd_sm90_ws \
        --kernel fwd_sm90_ws --kernel bwd_prep --kernel bwd_dq_cast --jobs 8 --no-progress > "$OUT/compile_on.log" 2>&1 &
      DUALKV_WS_MULTICAST=off timeout 200 python3 -m dualkv kernels --compile-only --arch sm_90 --kernel bwd_sm90_ws \
        --jobs 8 --no-progress > "$OUT/compile_off.log" 2>&1 & wait )
    echo "== compiled ($(date -u +%H:%M:%S))"; tail -n 1 "$OUT/compile_on.log" "$OUT/compile_off.log"
    TAIL=16 step mccheck 200 python3 experiments/gpu/multicast_check.py --json "$OUT/s34mc-check.json"
    mkdir -p "$OUT/bench"
    for round in 1 2; do
        for mc in off on; do
            DUALKV_WS_MULTICAST=$mc DUALKV_BUILD_LOG="$OUT/build_$mc.jsonl" DUALKV_COMMIT="${DUALKV_COMMIT}+mc$mc" \
                TAIL=1 step ab${round}_$mc 80 python3 -m dualkv bench kernel --systems dualkv \
                --shapes 8:8192,16:32768 --mode bwd --reps 10 --out "$OUT/bench/ab${round}_$mc"
        done
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s34mc-table.json"
    (cd "$OUT" && tar czf s34mc.tgz *.log build_*.jsonl bench && rm -rf ab[12]_*.log compile_*.log build_*.jsonl bench)
    ;;
s34mc2)
    # #12 (ran at f095d4d; the build is removed. Run with COMPILE_S=1): s34mc measured the multicast build 29-35%
    # slower (bwd 162.3 / 162.8 against 126.3 / 126.2 ms at (16, 32K)). Whether its pair coupling fights the dQ order's
    # chain (block b waits for block b - 1 at every query tile): both builds with and without the dQ order's waits
    # (DKV_DBG_NOSEM=1: unordered adds, timing only), one process each (compiled in parallel first), then a second round
    mkdir -p "$OUT/bench"
    mc_bench() {  # mc_bench NAME MC DEFINES REPS
        DUALKV_WS_MULTICAST=$2 DUALKV_EXTRA_DEFINES=$3 DUALKV_COMMIT="${DUALKV_COMMIT}+$1" TAIL=1 step "$1" 150 \
            python3 -m dualkv bench kernel --systems dualkv --shapes 8:8192,16:32768 --mode bwd --reps "$4" \
            --out "$OUT/bench/$1"
    }
    mc_bench w_off off "" 1 & mc_bench w_on on "" 1 & mc_bench w_offns off DKV_DBG_NOSEM=1 1 &
    mc_bench w_onns on DKV_DBG_NOSEM=1 1 & wait
    rm -rf "$OUT/bench"/w_*
    for round in 1 2; do
        mc_bench r${round}_off off "" 10; mc_bench r${round}_on on "" 10
        mc_bench r${round}_offns off DKV_DBG_NOSEM=1 10; mc_bench r${round}_onns on DKV_DBG_NOSEM=1 10
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s34mc2-table.json"
    (cd "$OUT" && tar czf s34mc2.tgz *.log bench && rm -rf [wr]*_*.log bench)
    ;;
s34red)
    # #12 (ran at fc03c05: 20-25% slower; the macro was then removed. Run with COMPILE_S=1): ncu put the WS
    # backward's L1/TEX (shared memory) throughput at 78%, its highest unit
    # (checks/ncu-ws-bwd-h200-20261128T1849Z.json). The dQ hand-off moves 64 KB of smem per step (the consumers' fp32
    # dQ_step in, the bulk reduce-add's read out) of about 370 KB. DKV_DBG_DIRECTRED=1: the consumers add dQ_step from
    # registers (red.v2.f32, unordered: nondeterministic dQ, a timing diagnostic) with no smem round trip. Its d = 128
    # GPU family tests first (its dQ must still be right), then backward at (8, 8K) / (16, 32K), one process per variant
    # (base, DIRECTRED, NOSEM: the smem path unordered), two rounds
    mkdir -p "$OUT/bench"
    DUALKV_EXTRA_DEFINES=DKV_DBG_DIRECTRED=1 TAIL=3 step redtests 200 python3 -m pytest -q -x \
        proofs_tests/test_cuda_backward.py -k "test_ws_backward_family and 128 and bf16"
    red_bench() {  # red_bench NAME DEFINES REPS
        DUALKV_EXTRA_DEFINES=$2 DUALKV_COMMIT="${DUALKV_COMMIT}+$1" TAIL=1 step "$1" 150 python3 -m dualkv bench kernel \
            --systems dualkv --shapes 8:8192,16:32768 --mode bwd --reps "$3" --out "$OUT/bench/$1"
    }
    red_bench w_base "" 1 & red_bench w_ns DKV_DBG_NOSEM=1 1 & wait
    rm -rf "$OUT/bench"/w_*
    for round in 1 2; do
        red_bench r${round}_base "" 10; red_bench r${round}_red DKV_DBG_DIRECTRED=1 10
        red_bench r${round}_ns DKV_DBG_NOSEM=1 10
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s34red-table.json"
    (cd "$OUT" && tar czf s34red.tgz *.log bench && rm -rf [wr]*_*.log redtests.log bench)
    ;;
s34final)
    # #12 (run with COMPILE_S=150): correctness of the default family at the end of s34 (its kernels' code as at 775cf75;
    # the shared headers changed for the mma.sync family since its last GPU tests): dualkv verify, then the GPU tests
    # of the WS backward, the forward, the paper API, the split tiles and the tree WS backward
    TAIL=2 step verify 170 python3 -m dualkv verify --no-progress --json "$OUT/verify-default.json"
    TAIL=3 step pytest_default 280 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_backward.py \
        proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_paper_api.py proofs_tests/test_cuda_ws_split.py \
        proofs_tests/test_tree_cuda_ws.py
    ;;
s36rest)
    # #12/#13 (run with COMPILE_S=150): the GPU test files that s35final / s36final do not run, at the s35 forward
    # defaults (the lazy rescale reaches every forward, trees and the hybrid included), in two processes at once (the
    # kernels are precompiled; the GPU has room for both): trees, ordered dQ, dQ layout, input errors / the hybrid,
    # head dim 96, the cascade, WS trees and splits, the HF backend, log-probs
    rest_tests 380
    (cd "$OUT" && tar czf s36rest.tgz *.log && rm -f pytest_*.log)
    ;;
s36t135)
    # #13 (run with COMPILE_S=1, carry .commit and build/nvrtc135.tar.xz): Table 1's rows of the mma.sync family against
    # the FA2 cascade at the s35 forward defaults (the lazy rescale) with the family compiled by NVRTC 13.5 (s32nvrtc at
    # 3137631: (16, 32K) 291.54 against 291.70 ms under 13.5, 302.53 / 302.27 against 291.84 / 291.67 under 13.0); t1:
    # three shapes in one process, t64: (16, 64K); then dualkv verify under DUALKV_KERNELS=mma with 13.5
    mma_table135 s36t135
    python3 experiments/gpu/bench_table.py "$OUT/bench" > "$OUT/s36t135-table.txt" 2>&1; cat "$OUT/s36t135-table.txt"
    DUALKV_KERNELS=mma TAIL=2 step verify135 170 python3 -m dualkv verify --no-progress --json "$OUT/verify-mma-135.json"
    (cd "$OUT" && tar czf s36t135.tgz *.log bench && rm -rf t1.log t64.log warm135.log verify135.log bench)
    ;;
s36fwd144)
    # #12 (run with COMPILE_S=1, carry .commit; ran in s36, no gain: checks/s36fwd144-*): the WS forward with its
    # overlap on 144-key blocks (spill-free on the CPU, checks/s35blockn-cpu-20261130.log) and 160-key blocks (24-48
    # bytes of spills) against the default
    # 128 at head dims 128 and 96, two stages, forward at (28, 4K), (8, 8K), (16, 32K), two rounds; then the forward
    # GPU tests at d = 96 / 128 with 144-key blocks
    for d in 128 96; do
        variants_ab "d${d}_def:: d${d}_144:::SM90_WS_FWD_TILES:$d:block_n=144 d${d}_160:::SM90_WS_FWD_TILES:$d:block_n=160" \
            2 60 --head-dim $d --systems dualkv --shapes 28:4096,8:8192,16:32768 --mode fwd --reps 10
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" > "$OUT/s36fwd144-table.txt" 2>&1; cat "$OUT/s36fwd144-table.txt"
    TAIL=3 step pytest_144 200 python3 experiments/gpu/with_tiles.py SM90_WS_FWD_TILES:128:block_n=144 \
        SM90_WS_FWD_TILES:96:block_n=144 -- -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_forward.py \
        proofs_tests/test_cuda_hd96.py -k "96 or 128 or shared_prefix_forward"
    (cd "$OUT" && tar czf s36fwd144.tgz *.log bench && rm -rf ab[12]_*.log pytest_144.log bench)
    ;;
s35t1)
    # #12 (run with COMPILE_S=1, carry .commit): the README's headline at the end of s35 (the forward's lazy rescale and
    # the WS forward's overlap at head dims 96 to 256): Table 1's six shapes, dualkv against the cuDNN cascade, fwd / bwd /
    # fwd+bwd, 10 reps, one process
    mkdir -p "$OUT/bench"
    TAIL=12 step t 420 python3 -m dualkv bench kernel --systems dualkv,cudnn_cascade \
        --shapes 28:4096,8:8192,28:16384,16:32768,16:65536,4:131072 --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/t"
    (cd "$OUT" && tar czf s35t1.tgz t.log bench && rm -rf t.log bench)
    ;;
s35hd)
    # #12 (run with COMPILE_S=1, carry .commit): the WS forward's overlap (DKV_FWD_WAIT1) at the other head dims, each
    # against its default, two rounds, forward at (8, 8K), (16, 32K): 64 on 128-key blocks in two / three stages (its
    # 192-key builds spill with it), 192 (112-key blocks) and 256 (80-key blocks) on their own blocks; then the forward
    # and head-dim GPU tests with all three overlaps in one process
    mkdir -p "$OUT/bench"
    for round in 1 2; do
        for v in 64:def 64:SM90_WS_FWD_TILES:64:block_n=128,stages=2,overlap=True \
                 64:SM90_WS_FWD_TILES:64:block_n=128,stages=3,overlap=True 192:def \
                 192:SM90_WS_FWD_TILES:192:overlap=True 256:def 256:SM90_WS_FWD_TILES:256:overlap=True; do
            d=${v%%:*}; tiles=${v#*:}; name=d${d}_${round}_$(echo "$tiles" | tr -dc 'a-z0-9' | tail -c 12)
            run=(-m dualkv bench kernel); [ "$tiles" != def ] && run=(experiments/gpu/with_tiles.py "$tiles" -- -m dualkv \
                bench kernel)
            TAIL=1 step $name 60 python3 "${run[@]}" --head-dim $d --systems dualkv --shapes 8:8192,16:32768 --mode fwd \
                --reps 10 --out "$OUT/bench/$name"
        done
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" > "$OUT/s35hd-table.txt" 2>&1; cat "$OUT/s35hd-table.txt"
    TAIL=3 step pytest_hd 200 python3 experiments/gpu/with_tiles.py \
        SM90_WS_FWD_TILES:64:block_n=128,stages=2,overlap=True SM90_WS_FWD_TILES:192:overlap=True \
        SM90_WS_FWD_TILES:256:overlap=True -- -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_forward.py \
        -k "64 or 192 or 256 or shared_prefix_forward"
    (cd "$OUT" && tar czf s35hd.tgz *.log bench && rm -rf d*_[12]_*.log pytest_hd.log bench)
    ;;
s35d96)
    # #12/#13 (run with COMPILE_S=1, carry .commit): (1) the forward defaults before and after 50c821b in alternating
    # processes, two rounds: old = DKV_SOFTMAX_LAZY=0 and the d = 128 WS forward on 192-key blocks without its overlap;
    # dualkv and dualkv_mma forward at (8, 8K), (16, 32K); (2) the d = 96 WS forward on 128-key blocks in two stages with
    # its overlap against its 192-key default, two rounds, and its forward GPU tests (head dim 96 cases)
    mkdir -p "$OUT/bench"
    old128="SM90_WS_FWD_TILES:128:block_n=192,overlap=False"
    new96="SM90_WS_FWD_TILES:96:block_n=128,stages=2,overlap=True"
    for round in 1 2; do
        TAIL=1 step ab${round}_new 60 python3 -m dualkv bench kernel --systems dualkv,dualkv_mma --shapes 8:8192,16:32768 \
            --mode fwd --reps 10 --out "$OUT/bench/ab${round}_new"
        DUALKV_EXTRA_DEFINES=DKV_SOFTMAX_LAZY=0 TAIL=1 step ab${round}_old 60 python3 experiments/gpu/with_tiles.py \
            $old128 -- -m dualkv bench kernel --systems dualkv,dualkv_mma --shapes 8:8192,16:32768 --mode fwd --reps 10 \
            --out "$OUT/bench/ab${round}_old"
        TAIL=1 step d96_${round}_192 60 python3 -m dualkv bench kernel --head-dim 96 --systems dualkv \
            --shapes 8:8192,16:32768 --mode fwd --reps 10 --out "$OUT/bench/d96_${round}_192"
        TAIL=1 step d96_${round}_128 60 python3 experiments/gpu/with_tiles.py $new96 -- -m dualkv bench kernel \
            --head-dim 96 --systems dualkv --shapes 8:8192,16:32768 --mode fwd --reps 10 --out "$OUT/bench/d96_${round}_128"
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" > "$OUT/s35d96-table.txt" 2>&1; cat "$OUT/s35d96-table.txt"
    TAIL=3 step pytest_d96 150 python3 experiments/gpu/with_tiles.py $new96 -- -m pytest -q -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_hd96.py -k "96"
    (cd "$OUT" && tar czf s35d96.tgz *.log bench && rm -rf ab*.log d96_*.log pytest_d96.log bench)
    ;;
s35final)
    # #12/#13 (run with COMPILE_S=150): correctness at the new forward defaults (softmax.cuh's lazy rescale in every
    # forward; the d = 128 WS forward on 128-key blocks with its softmax overlapping its own P V): dualkv verify for both
    # families, the forward / paper-API / backward GPU tests of the default family, the forward GPU tests under
    # DUALKV_KERNELS=mma (every head dim of the mma.sync forward); output kept to a few files ($OUT's file count is limited)
    TAIL=2 step verify 170 python3 -m dualkv verify --no-progress --json "$OUT/verify-default.json"
    DUALKV_KERNELS=mma TAIL=2 step verify_mma 170 python3 -m dualkv verify --no-progress --json "$OUT/verify-mma.json"
    TAIL=3 step pytest_default 200 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_forward.py \
        proofs_tests/test_cuda_paper_api.py proofs_tests/test_cuda_backward.py
    DUALKV_KERNELS=mma TAIL=3 step pytest_mma_fwd 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_forward.py
    (cd "$OUT" && tar czf s35final.tgz *.log && rm -f verify*.log pytest*.log)
    ;;
s35table)
    # #12/#13 (run with COMPILE_S=1, carry .commit): Table 1 rows at the new forward defaults: dualkv and the cuDNN
    # cascade, the mma.sync family and the FA2 cascade, fwd / bwd / fwd+bwd, 10 reps, one process for three shapes and
    # one for (16, 64K)
    mkdir -p "$OUT/bench"
    TAIL=14 step t 300 python3 -m dualkv bench kernel --systems dualkv,cudnn_cascade,dualkv_mma,cascade \
        --shapes 28:4096,8:8192,16:32768 --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/t"
    TAIL=5 step t64 200 python3 -m dualkv bench kernel --systems dualkv,cudnn_cascade,dualkv_mma,cascade \
        --shapes 16:65536 --mode fwd,bwd,fwdbwd --reps 5 --out "$OUT/bench/t64"
    (cd "$OUT" && tar czf s35table.tgz *.log bench && rm -rf t.log t64.log bench/t bench/t64)
    ;;
s35fwd)
    # #12/#13 (run with COMPILE_S=1, carry .commit): A/B of two forward switches, both default 0: DKV_SOFTMAX_LAZY=1
    # (softmax.cuh: a row keeps its max until a block's exceeds it by 2^8, the output rescaled only when some row of the
    # warp moved; every forward) and DKV_FWD_WAIT1=1 (fwd_sm90_ws.cu: the softmax waits for S only and overlaps the
    # warpgroup's own P V). dualkv and dualkv_mma forward at (28, 4K), (8, 8K), (16, 32K), 10 reps, one process per
    # variant, two rounds; a quick float64 check of each variant's forward; then ncu of the WS forward against the
    # cuDNN cascade's forward at (16, 32K) (the base, and the WAIT1 + LAZY build)
    local_variants="base:: lazy:DKV_SOFTMAX_LAZY=1: w1:DKV_FWD_WAIT1=1: w1lazy:DKV_SOFTMAX_LAZY=1,DKV_FWD_WAIT1=1:"
    for v in $local_variants wrong:DKV_SOFTMAX_LAZY=2,DKV_FWD_WAIT1=1:; do  # wrong: never rescales (must fail)
        IFS=: read -r name defs lib <<< "$v"  # (in parallel with the warm-up, whose `wait` also waits for these)
        DUALKV_EXTRA_DEFINES=$defs timeout 300 python3 experiments/gpu/fwd_variant_check.py > "$OUT/check_$name.log" 2>&1 &
    done
    variants_warm "$local_variants" --systems dualkv,dualkv_mma --shapes 8:8192 --mode fwd --reps 1
    for v in $local_variants wrong::; do echo "== check ${v%%:*}"; tail -7 "$OUT/check_${v%%:*}.log"; done
    # and the WAIT1 + LAZY build on 128-key blocks (its 192-key causal builds spill 132-160 bytes on the CPU, these none)
    local_variants="$local_variants w1lazy128:DKV_SOFTMAX_LAZY=1,DKV_FWD_WAIT1=1::SM90_WS_FWD_TILES:128:block_n=128,stages=2"
    local_variants="$local_variants w1lazy128s3:DKV_SOFTMAX_LAZY=1,DKV_FWD_WAIT1=1::SM90_WS_FWD_TILES:128:block_n=128,stages=3"
    variants_ab "$local_variants" 2 60 --systems dualkv,dualkv_mma --shapes 28:4096,8:8192,16:32768 --mode fwd --reps 10
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s35fwd-table.json"
    for v in base w1lazy; do
        defs=; [ $v = w1lazy ] && defs=DKV_SOFTMAX_LAZY=1,DKV_FWD_WAIT1=1
        sys=dualkv; [ $v = base ] && sys=dualkv,cudnn
        DUALKV_EXTRA_DEFINES=$defs TAIL=2 step ncu_fwd_$v 150 ncu --clock-control none --profile-from-start off \
            --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
            --section WarpStateStats --section Occupancy --metrics sm__cycles_elapsed.avg.per_second -f \
            -o "$OUT/ncu_fwd_$v" python3 experiments/gpu/profile_bwd.py --pass fwd --systems $sys --shape 16:32768
        if [ -f "$OUT/ncu_fwd_$v.ncu-rep" ]; then
            ncu --import "$OUT/ncu_fwd_$v.ncu-rep" --page details > "$OUT/ncu_fwd_$v.txt" 2>&1
            python3 experiments/gpu/ncu_summary.py "$OUT/ncu_fwd_$v.txt" --out "$OUT/s35ncu-$v.json"
            rm -f "$OUT/ncu_fwd_$v.ncu-rep"
        fi
    done
    (cd "$OUT" && tar czf s35fwd.tgz *.log ncu_fwd_*.txt bench && rm -rf ab[12]_*.log warm_*.log ncu_fwd_*.txt bench)
    ;;
s34ncu)
    # #12: why the WS backward is at the cuDNN cascade's backward speed and not 10% past it (the issue asks for the
    # profile that says why): every kernel of one backward of dualkv and of the cuDNN cascade at (16, 32K), in one
    # process, sections SpeedOfLight, ComputeWorkloadAnalysis (pipe utilisation) and MemoryWorkloadAnalysis, the SM
    # clock; condensed by ncu_summary.py
    TAIL=3 step ncu_bwd 330 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --metrics sm__cycles_elapsed.avg.per_second \
        -f -o "$OUT/ncu_bwd" python3 experiments/gpu/profile_bwd.py --systems dualkv,cudnn --shape 16:32768
    if [ -f "$OUT/ncu_bwd.ncu-rep" ]; then
        ncu --import "$OUT/ncu_bwd.ncu-rep" --page details > "$OUT/ncu_bwd.txt" 2>&1
        python3 experiments/gpu/ncu_summary.py "$OUT/ncu_bwd.txt" --out "$OUT/s34ncu.json"
        rm -f "$OUT/ncu_bwd.ncu-rep"
    fi
    (cd "$OUT" && tar czf s34ncu.tgz ncu_bwd.txt ncu_bwd.log && rm -f ncu_bwd.txt ncu_bwd.log)
    ;;
s34table)
    # #12 (run with COMPILE_S=1, carry .commit): the README's headline at the end of s34 (its last was 7227113; the
    # default family's kernels have not changed in code since, the shared headers have): Table 1's six shapes, dualkv
    # against the cuDNN cascade, fwd / bwd / fwd+bwd, 10 reps, one process, builds logged
    mkdir -p "$OUT/bench"
    DUALKV_BUILD_LOG="$OUT/build_t.jsonl" TAIL=12 step t 400 python3 -m dualkv bench kernel \
        --systems dualkv,cudnn_cascade --shapes 28:4096,8:8192,28:16384,16:32768,16:65536,4:131072 \
        --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/t"
    ;;
s34split)
    # #12 (ran at 92050df: 3-28% slower; run with COMPILE_S=1, carry .commit): at (8, 8K) the WS backward is 4% slower
    # than the cuDNN cascade's (s34table); its 512 shared-key CTAs of ~1280 steps fill 3.9 waves of 132 SMs. Whether a
    # forced split of the shared-key tiles (finer CTAs, fp32 dK / dV partials summed in order) helps where "auto" does
    # not split: backward at (28, 4K), (8, 8K), (16, 32K), DUALKV_WS_SPLIT auto / 2 / 3, one process each, two rounds
    mkdir -p "$OUT/bench"
    for round in 1 2; do
        for sp in auto 2 3; do
            DUALKV_WS_SPLIT=$sp DUALKV_COMMIT="${DUALKV_COMMIT}+split$sp" TAIL=1 step r${round}_$sp 100 \
                python3 -m dualkv bench kernel --systems dualkv --shapes 28:4096,8:8192,16:32768 --mode bwd --reps 10 \
                --out "$OUT/bench/r${round}_$sp"
        done
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s34split-table.json"
    (cd "$OUT" && tar czf s34split.tgz *.log bench && rm -rf r[12]_*.log bench)
    ;;
s37check)
    # Correctness of s36's review fixes (kernel_ready's dense copy, check_window, the dispatch's tensor test, empty
    # settings) on a 2-GPU machine (run with COMPILE_S=150, kind nvidia-h200-x2): on GPU 0 dualkv verify and the
    # forward / paper-API / backward GPU tests of the default family, then the input-error, hybrid, cascade, HF and
    # log-prob GPU tests; on GPU 1 verify and the forward GPU tests under DUALKV_KERNELS=mma, then the ordered-dQ and
    # dQ-layout tests; last the two-device tests (test_cuda_multigpu.py) on both GPUs
    ( export CUDA_VISIBLE_DEVICES=0
      TAIL=2 step verify 170 python3 -m dualkv verify --no-progress --json "$OUT/verify-default.json"
      TAIL=3 step pytest_default 200 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_forward.py \
          proofs_tests/test_cuda_paper_api.py proofs_tests/test_cuda_backward.py
      TAIL=3 step pytest_rest0 150 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_input_errors.py \
          proofs_tests/test_hybrid_path.py proofs_tests/test_cascade.py proofs_tests/test_hf_gpu.py \
          proofs_tests/test_cuda_logprobs.py ) &
    ( export CUDA_VISIBLE_DEVICES=1 DUALKV_KERNELS=mma
      TAIL=2 step verify_mma 170 python3 -m dualkv verify --no-progress --json "$OUT/verify-mma.json"
      TAIL=3 step pytest_mma_fwd 150 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_forward.py
      unset DUALKV_KERNELS
      TAIL=3 step pytest_rest1 150 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py \
          proofs_tests/test_dq_layout.py ) &
    wait
    TAIL=3 step pytest_multigpu 90 python3 -m pytest -q -m multigpu -p no:cacheprovider proofs_tests/test_cuda_multigpu.py
    (cd "$OUT" && tar czf s37check.tgz *.log && rm -f verify*.log pytest*.log)
    ;;
s37rest)
    # s37check's two steps that its limits stopped (on the 2-GPU machine the default family's forward / paper-API /
    # backward tests reached 174 of 385 in 200 s, against 84 s for all of them on the 1-GPU machine in s36final), on
    # the 1-GPU machine (run with COMPILE_S=150), two processes at once, with pytest's slowest durations: those tests,
    # and trees / ordered dQ / dQ layout / tree reference
    ( TAIL=14 step pytest_default 220 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=8 \
        proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_paper_api.py proofs_tests/test_cuda_backward.py &
      TAIL=14 step pytest_trees 390 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=8 \
        proofs_tests/test_tree_cuda.py proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_dq_layout.py \
        proofs_tests/test_tree_reference.py &
      wait )
    (cd "$OUT" && tar czf s37rest.tgz *.log && rm -f pytest_*.log)
    ;;
s37def)
    # s37rest's stopped step alone (run with COMPILE_S=170): the default family's forward / paper-API / backward GPU
    # tests with a long limit, pytest's slowest durations and $DUALKV_BUILD_LOG (which specializations compiled
    # during the tests because the precompile did not hold them)
    DUALKV_BUILD_LOG=$OUT/build.jsonl TAIL=24 step pytest_default 470 python3 -m pytest -q -m gpu -p no:cacheprovider \
        --durations=16 proofs_tests/test_cuda_forward.py proofs_tests/test_cuda_paper_api.py \
        proofs_tests/test_cuda_backward.py
    python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; m=[x['spec'] for x in r if not x['cache_hit']];\
print(len(r), 'specializations asked for,', len(m), 'compiled during the tests'); print(*m[:12], sep='\\n')" "$OUT/build.jsonl"
    (cd "$OUT" && tar czf s37def.tgz *.log build.jsonl && rm -f pytest_*.log build.jsonl)
    ;;
s37pair)
    # Why s37check / s37rest's default-family test step stalled when it shared the machine (alone, s37def: 385 passed
    # in 82 s): two copies of it at once on the one GPU (run with COMPILE_S=170), each with pytest's faulthandler
    # timeout (a test running past 40 s prints every thread's Python stack) and slowest durations
    for i in 1 2; do
        DUALKV_BUILD_LOG=$OUT/build$i.jsonl TAIL=30 step pytest_pair$i 300 python3 -m pytest -q -m gpu \
            -p no:cacheprovider -o faulthandler_timeout=40 --durations=6 proofs_tests/test_cuda_forward.py \
            proofs_tests/test_cuda_paper_api.py proofs_tests/test_cuda_backward.py &
    done
    wait
    (cd "$OUT" && tar czf s37pair.tgz *.log build*.jsonl && rm -f pytest_*.log build*.jsonl)
    ;;
s38a)
    # The GPU check that s37's CPU-only review fixes owe (dualkv.testing compares equal shapes only and needs a finite
    # bound; GroupLayout / softmax_scale / context_attention refusals; verify's cuda_rows): alone on one GPU (run with
    # COMPILE_S=150), one step at a time: the default family's forward / paper-API / backward tests, dualkv verify of
    # both families, the forward tests under DUALKV_KERNELS=mma
    TAIL=4 step pytest_default 220 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_forward.py \
        proofs_tests/test_cuda_paper_api.py proofs_tests/test_cuda_backward.py
    TAIL=3 step verify 150 python3 -m dualkv verify --no-progress --json "$OUT/verify-default.json"
    DUALKV_KERNELS=mma TAIL=3 step verify_mma 150 python3 -m dualkv verify --no-progress --json "$OUT/verify-mma.json"
    DUALKV_KERNELS=mma TAIL=3 step pytest_mma_fwd 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_forward.py
    (cd "$OUT" && tar czf s38a.tgz *.log && rm -f verify*.log pytest*.log)
    ;;
s38b)
    # s38a's other half (run with COMPILE_S=150 right after it, the cache then warm): s36rest's two test processes
    # at once with longer limits
    rest_tests 480
    (cd "$OUT" && tar czf s38b.tgz *.log && rm -f pytest_*.log)
    ;;
s38mg)
    # On the 2-GPU machine (kind nvidia-h200-x2, COMPILE_S=150): s37check's open question (its default-family test
    # step, beside a process on the OTHER GPU, ran 174 of 385 tests in 200 s against 385 in 82-95 s alone). Those tests
    # compute their float64 oracle and comparisons on the CPU, and each process's torch takes every core for its
    # intra-op threads, so two processes oversubscribe the CPUs. Here the same step runs on both GPUs at once with the
    # cores split between them (OMP_NUM_THREADS = cores / 2); then the two-device tests at this commit
    python3 -c "import os, torch; print('cores', os.cpu_count(), 'torch threads by default', torch.get_num_threads())"
    half=$(( $(nproc) / 2 ))
    OMP_NUM_THREADS=$half default_tests_both_gpus 240
    TAIL=3 step pytest_multigpu 90 python3 -m pytest -q -m multigpu -p no:cacheprovider proofs_tests/test_cuda_multigpu.py
    (cd "$OUT" && tar czf s38mg.tgz *.log && rm -f pytest*.log)
    ;;
s38mg2)
    # s38mg's control, on the same warm 2-GPU machine right after it: the same two processes at once with torch's
    # default intra-op threads (every core each), as s37check ran them; a limit of 150 s (split: 73 s each)
    default_tests_both_gpus 150
    (cd "$OUT" && tar czf s38mg2.tgz *.log && rm -f pytest*.log)
    ;;
s38bench)
    # The bench CLI after s38's walkthrough fixes (run with COMPILE_S=1: the processes compile what they use): bench
    # layer / model with no --device (cuda on a GPU machine) and --tiny, bench kernel with --r-range LO,HI (the other
    # spelling) at a small ragged shape against the cuDNN cascade, then bench plot on its file
    mkdir -p "$OUT/bench"
    TAIL=2 step layer_tiny 120 python3 -m dualkv bench layer --tiny --out "$OUT/bench" --no-plot
    TAIL=2 step model_tiny 120 python3 -m dualkv bench model --tiny --out "$OUT/bench" --no-plot
    TAIL=4 step kernel_ragged 200 python3 -m dualkv bench kernel --shapes 8:1024 --r-range 256,2048 --groups 2 \
        --systems dualkv,cudnn_cascade --mode fwd,bwd --reps 3 --out "$OUT/bench"
    TAIL=3 step plot 60 python3 -m dualkv bench plot "$OUT"/bench/kernel-*.json --out "$OUT/bench/plot.png"
    (cd "$OUT" && tar czf s38bench.tgz *.log bench && rm -rf layer_tiny.log model_tiny.log kernel_ragged.log plot.log bench)
    ;;
s39addr)
    # #13 (s39; CPU only so far, checks/s39addr-cpu-20261130.log): the mma.sync dK/dV kernel's main-loop shared addresses
    # formed in 32 bits from one conversion of the smem base (bwd_dkdv.cu DKV_DKDV_SMEM32=7: the ldmatrix operands, the
    # step's copies, the P^T / dS^T stores and the LSE / D reads). NVRTC 13.0 keeps shared pointers in 64 bits (13.5:
    # 32); with the macro its d = 128 sm_90 ordered build's main loop is 1306 SASS instructions without spills in
    # addressing mode 0 (13.5's default build: 1307), 1332 in mode 2 (what build.py's choice keeps), against 1343 with
    # 16 / 20 bytes of spills at the default (mode 1). The mma.sync family's backward (dualkv_mma: ordered dQ,
    # dualkv_mma_atomic) at (8, 8K) / (16, 32K): the default (d0), the macro with the build's mode choice (s7), the
    # macro in mode 0 for every dK/dV build (s7m0), one process each, alternating, two rounds (COMPILE_S=5: the
    # precompile of the default family is not needed here)
    local_variants="d0:: s7:DKV_DKDV_SMEM32=7: s7m0:DKV_DKDV_SMEM32=7,DKV_DKDV_ADDR32=0:"
    mma_bwd_ab s39addr "$local_variants" 50
    ;;
s39final)
    # #13 (run with COMPILE_S=1, carry .commit): correctness of the new default under the machine's NVRTC 13.0 (every
    # dK/dV build with DKV_DKDV_SMEM32=7, ldmatrix mode 0 first): the mma.sync kernels precompiled (step warm), dualkv
    # verify under DUALKV_KERNELS=mma, the family's backward and tree GPU tests
    mma_warm warm 200
    DUALKV_KERNELS=mma TAIL=2 step verify130 150 python3 -m dualkv verify --no-progress --json "$OUT/verify-mma-130.json"
    TAIL=3 mma_backward_tests pytest_bwd 240
    ;;
s39def)
    # #13's default change reaches the default family too (run with COMPILE_S=240, carry .commit): its dK/dV builds
    # (windows, non-causal, head dims without the warp-specialised backward) take DKV_DKDV_SMEM32=7 under NVRTC 13.0:
    # dualkv verify, then the default family's forward / paper-API / backward GPU tests
    TAIL=3 step verify 150 python3 -m dualkv verify --no-progress --json "$OUT/verify-default.json"
    TAIL=4 step pytest_default 240 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_cuda_forward.py \
        proofs_tests/test_cuda_paper_api.py proofs_tests/test_cuda_backward.py
    ;;
s39rest)
    # s39def's other half (run with COMPILE_S=120, carry .commit): the rest of the GPU test files, two processes with
    # half the cores each (rest_tests)
    rest_tests 430
    ;;
s39rl)
    # #13 (run with COMPILE_S=1, carry .commit): s33rl's ragged RL micro-batches of the mma.sync family against the FA2
    # cascade at the new NVRTC 13.0 default (DKV_DKDV_SMEM32=7, mode 0 first): 4 groups x (8, 512) / (8, 1024), R in
    # 256-4096; 1 group (16, 2048) / (16, 4096), R in 512-8192
    mma_warm warm 200
    rl g4 dualkv_mma,dualkv_mma_atomic,cascade 4 8:512,8:1024 256:4096
    rl g1 dualkv_mma,dualkv_mma_atomic,cascade 1 16:2048,16:4096 512:8192
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s39rl-table.json"
    (cd "$OUT" && tar czf s39rl.tgz *.log bench && rm -rf g4.log g1.log bench)
    ;;
s39n135)
    # #13 (run with COMPILE_S=1, carry .commit and build/nvrtc135.tar.xz): does DKV_DKDV_SMEM32=7 help under NVRTC 13.5
    # too (the CPU: sm_90 d = 128 ordered loop 1312 in mode 0, 1323 in mode 1 with 32 / 48 B of spills, against the
    # default's 1307)? The mma.sync backward under 13.5: the default (n0), the macro with 13.5's mode choice (n7), the
    # macro in mode 0 (n7m0)
    nvrtc135_unpack s39n135
    mma_bwd_ab s39n135 "n0::/tmp/nv135 n7:DKV_DKDV_SMEM32=7:/tmp/nv135 n7m0:DKV_DKDV_SMEM32=7,DKV_DKDV_ADDR32=0:/tmp/nv135" 50
    ;;
s39table)
    # #13 (run with COMPILE_S=1, carry .commit): Table 1's rows of the mma.sync family against the FA2 cascade at the new
    # default under NVRTC 13.0 (t1: three shapes, 10 reps; t64: (16, 64K), 5 reps), then the ordered dQ and paper-API
    # GPU tests under DUALKV_KERNELS=mma
    mma_table warm 200
    python3 experiments/gpu/bench_table.py "$OUT/bench" > "$OUT/s39table.txt" 2>&1; cat "$OUT/s39table.txt"
    DUALKV_KERNELS=mma TAIL=3 step pytest_ord 120 python3 -m pytest -q -x -m gpu -p no:cacheprovider \
        proofs_tests/test_cuda_ordered_dq.py proofs_tests/test_cuda_paper_api.py
    (cd "$OUT" && tar czf s39table.tgz *.log bench && rm -rf t1.log t64.log bench)
    ;;
s40a)
    # Kind nvidia-h200-x2 (run with COMPILE_S=200, carry .commit and .whl from experiments/trl_grpo/fetch_wheels.sh). GPU 1:
    # TRL's end-to-end GRPO (stock against dualkv, its three settings) at this commit, last run on an H100 at 41b0c3e+
    # (Nov 26). GPU 0, #13: the mma.sync ordered backward at (16, 32K) / (16, 64K) under the two-level orders a user can
    # pick, which s25 measured only up to (16, 32K): the defaults (d; also the atomic dQ, for the ordering's cost at
    # 64K), DUALKV_MMA_CTA_ORDER=head (h), DUALKV_TWO_LEVEL_DQ_ORDER=own (o); one process each, alternating, two rounds
    ( export CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=8
      python3 experiments/trl_grpo/install_wheels.py .whl > "$OUT/trl_install.log" 2>&1 &&
      timeout 560 python3 experiments/trl_grpo/grpo_e2e.py --out "$OUT" --time-budget-s 330 --deadline-s 470 \
          > "$OUT/trl.log" 2>&1; echo "== trl: exit $? ($(date -u +%H:%M:%S))" ) &
    trl_pid=$!
    mkdir -p "$OUT/bench"
    for round in 1 2; do
        for v in d h o; do
            ( export CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=16 DUALKV_COMMIT="$DUALKV_COMMIT+$v"
              systems=dualkv_mma
              case $v in
                  d) systems=dualkv_mma,dualkv_mma_atomic ;;
                  h) export DUALKV_MMA_CTA_ORDER=head ;;
                  o) export DUALKV_TWO_LEVEL_DQ_ORDER=own ;;
              esac
              TAIL=1 step ab${round}_$v 150 python3 -m dualkv bench kernel --systems $systems \
                  --shapes 16:32768,16:65536 --mode bwd --reps 5 --out "$OUT/bench/ab${round}_$v" )
        done
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s40a-table.json"
    wait $trl_pid
    tail -15 "$OUT/trl.log"
    (cd "$OUT" && tar czf s40a.tgz *.log bench && rm -rf ab[12]_*.log trl*.log bench)
    ;;
s40b)
    # Kind nvidia-h200-x2, a fresh machine (TRL installed beside veRL 0.9.1 breaks veRL's import of trl: s40a's machine
    # was reused); run with COMPILE_S=150, carry .commit, .whl and experiments/verl/wheels. (1) veRL's 2-GPU parity (DP=2,
    # SP=2) and the multi-GPU tests at this commit; (2) the row gathers' GPU tests (dualkv/_gather.py); (3) TRL's
    # curves setting, dualkv only, once on each GPU at the same time: the two runs must agree bit for bit (s40a: two
    # dualkv runs of one seed parted at step 5, from index_select's atomic backward on repeated rows)
    PARTS=parity,pytest PYTEST_S=200 BUDGET_S=330 OUT="$OUT/verl" bash experiments/verl/run_multigpu.sh 2gpu 2>&1 \
        | grep -E "run_multigpu|passed|failed|Error" | tail -25
    TAIL=3 step pytest_gather 150 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_gather_rows.py
    python3 experiments/trl_grpo/install_wheels.py .whl > "$OUT/trl_install.log" 2>&1 || tail -5 "$OUT/trl_install.log"
    for gpu in 0 1; do
        CUDA_VISIBLE_DEVICES=$gpu timeout 200 python3 experiments/trl_grpo/grpo_e2e.py --settings curves --systems dualkv \
            --out "$OUT/trl$gpu" > "$OUT/trl$gpu.log" 2>&1 &
    done
    wait
    rm -f "$OUT"/trl[01]/*.png
    python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
runs = [json.loads(next((Path(sys.argv[1]) / f"trl{g}").glob("trl_grpo-*.json")).read_text()) for g in (0, 1)]
rows = [[(r["step"], r["reward"], r["loss"], r["entropy"]) for r in run["rows"]] for run in runs]
same = rows[0] == rows[1]
print(f"trl curves, dualkv on GPU 0 and GPU 1: {len(rows[0])} / {len(rows[1])} steps, bitwise equal: {same}")
if not same:
    first = next(i for i, (a, b) in enumerate(zip(*rows)) if a != b)
    print("first difference at", rows[0][first], rows[1][first])
PY
    (cd "$OUT" && tar czf s40b.tgz *.log && rm -f *.log)
    ;;
s40c)
    # Kind nvidia-h200-x2 (run with COMPILE_S=150, carry .commit and .whl). GPU 0: the GPU tests of the paths the row
    # gathers changed (call 2 / paper API, the log-prob heads, the HF backend, trees, dualkv/_gather.py). GPU 1: TRL's
    # curves setting (stock, stock_eager, dualkv) at seeds 1-4 (s40b had one seed): is dualkv's distance from stock's
    # reward curve within what bf16 rounding alone (stock_eager) gives?
    python3 experiments/trl_grpo/install_wheels.py .whl > "$OUT/trl_install.log" 2>&1 || tail -5 "$OUT/trl_install.log"
    ( export CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=8
      for seed in 1 2 3 4; do
          timeout 150 python3 experiments/trl_grpo/grpo_e2e.py --settings curves --systems stock,stock_eager,dualkv \
              --seed $seed --out "$OUT/trl_s$seed" > "$OUT/trl_s$seed.log" 2>&1
          echo "== trl seed $seed: exit $? ($(date -u +%H:%M:%S))"; grep -E "^curves:" "$OUT/trl_s$seed.log"
      done ) &
    trl_pid=$!
    CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=16 TAIL=4 step pytest_changed 420 python3 -m pytest -q -m gpu \
        -p no:cacheprovider proofs_tests/test_gather_rows.py proofs_tests/test_cuda_paper_api.py \
        proofs_tests/test_cuda_logprobs.py proofs_tests/test_hf_gpu.py proofs_tests/test_tree_cuda.py
    wait $trl_pid
    rm -f "$OUT"/trl_s*/*.png
    (cd "$OUT" && tar czf s40c.tgz *.log && rm -f *.log)
    ;;
s40d)
    # One H200 (run with COMPILE_S=150, carry .commit): dualkv verify with its new run-to-run repeat rows (the
    # deterministic backward at three multi-response cases, the log-prob head) and their control (the head gathering by
    # index_select, atomic backward), default family; the repeat GPU test under both families
    TAIL=3 step verify 220 python3 -m dualkv verify --no-progress --json "$OUT/verify-default.json"
    grep -E "repeat|atomic_gather" "$OUT/verify.log" | head -12
    TAIL=3 step pytest_repeat 120 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_verify_repeat.py
    DUALKV_KERNELS=mma TAIL=3 step pytest_repeat_mma 180 python3 -m pytest -q -m gpu -p no:cacheprovider \
        proofs_tests/test_verify_repeat.py
    (cd "$OUT" && tar czf s40d.tgz *.log && rm -f *.log)
    ;;
s40e)
    # One H200, nothing else running (COMPILE_S=1: the run compiles what it uses; carry .commit and .whl): TRL's
    # end-to-end GRPO, all three settings (fp32 parity, long: P = 4096, N = 16, curves), stock against dualkv, at
    # this commit (the README's TRL row was an H100 run at a098fd0)
    python3 experiments/trl_grpo/install_wheels.py .whl > "$OUT/trl_install.log" 2>&1 || tail -5 "$OUT/trl_install.log"
    TAIL=12 step trl 540 python3 experiments/trl_grpo/grpo_e2e.py --out "$OUT"
    (cd "$OUT" && tar czf s40e.tgz *.log && rm -f *.log)
    ;;
s41a)
    # (run at fccabeb, s41b at 845b5bf, s41c at a6cd2cd: the fixed-point mode lives on branch s41-fixed-dq, not on main;
    # experiments/results/checks/s41-fixed-dq-*.json)
    # #13 (run with COMPILE_S=1, carry .commit): the fixed-point dQ mode (mma_backward("fixed"), deterministic without
    # an order): the mma.sync kernels compiled, then the mma.sync backward with the ordered (default),
    # fixed-point and atomic dQ against the FA2 cascade at Table 1's shapes, bwd and fwd+bwd, in one process (t1: three
    # shapes, 10 reps; t64: (16, 64K), 5 reps), then the fixed-point mode's GPU tests
    mma_warm warm 150
    mkdir -p "$OUT/bench"
    TAIL=1 step t1 150 python3 -m dualkv bench kernel --systems dualkv_mma,dualkv_mma_fixed,dualkv_mma_atomic,cascade \
        --shapes 28:4096,8:8192,16:32768 --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/t1"
    TAIL=1 step t64 150 python3 -m dualkv bench kernel --systems dualkv_mma,dualkv_mma_fixed,dualkv_mma_atomic,cascade \
        --shapes 16:65536 --mode fwd,bwd,fwdbwd --reps 5 --out "$OUT/bench/t64"
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s41a-table.json"
    TAIL=4 step pytest_fixed 160 python3 -m pytest -q -x -m gpu -p no:cacheprovider proofs_tests/test_cuda_fixed_dq.py
    (cd "$OUT" && tar czf s41a.tgz *.log && rm -f *.log)
    ;;
s41b)
    # #13 (run with COMPILE_S=1, carry .commit): where s41a's fixed-point adds lose their time, by timing probes of the
    # DKV_DQ_FIXED build (DKV_FIXED_PROBE, wrong results, timing only): 1 the 64-bit REDs without the conversion, 2 the
    # conversion with 32-bit REDs, 3 without the unit loads; against the build itself (0) and the ordered and atomic
    # modes; bwd at (28, 4K) and (16, 32K), one process each
    fixed_probes 0 1 2 3
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s41b-table.json"
    (cd "$OUT" && tar czf s41b.tgz *.log && rm -f *.log)
    ;;
s41c)
    # #13 (run with COMPILE_S=1, carry .commit): s41b's probes left the fixed-point build's time unchanged; probe 4 adds
    # 32-bit integers at the fp32 modes' addresses (4 bytes apart, not 8: half the RED traffic), against the build (0)
    # and the ordered and atomic modes, bwd at (28, 4K) and (16, 32K), one process each
    fixed_probes 4 0
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s41c-table.json"
    (cd "$OUT" && tar czf s41c.tgz *.log && rm -f *.log)
    ;;
s41d)
    # #13 (run with COMPILE_S=1, carry .commit): Table 1's rows of the mma.sync family at this commit against the FA2
    # cascade, with the like-for-like nondeterministic row beside the deterministic default (dualkv_mma_atomic:
    # deterministic=False, atomic dQ as FA2's own backward adds it), in one process per table (t1: three shapes, 10
    # reps; t64: (16, 64K), 5 reps)
    mma_warm warm 150
    mkdir -p "$OUT/bench"
    TAIL=1 step t1 200 python3 -m dualkv bench kernel --systems dualkv_mma,dualkv_mma_atomic,cascade \
        --shapes 28:4096,8:8192,16:32768 --mode fwd,bwd,fwdbwd --reps 10 --out "$OUT/bench/t1"
    TAIL=1 step t64 150 python3 -m dualkv bench kernel --systems dualkv_mma,dualkv_mma_atomic,cascade \
        --shapes 16:65536 --mode fwd,bwd,fwdbwd --reps 5 --out "$OUT/bench/t64"
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s41d-table.json"
    (cd "$OUT" && tar czf s41d.tgz *.log && rm -f *.log)
    ;;
s41e)
    # (run at 9cfd2e3, the prototype since reverted: experiments/results/checks/s41e-dq-chains-*.json)
    # #13 (run with COMPILE_S=1, carry .commit): the ordered dQ in two rank chains (DUALKV_DQ_CHAINS=2: block b waits
    # on b - 2, one more fp32 accumulator) against one (the default): the mma.sync backward at Table 1's four shapes,
    # one process per setting, alternating, two rounds; then the ordered-dQ GPU tests under two chains
    mkdir -p "$OUT/bench"
    for round in 1 2; do
        for c in 1 2; do
            DUALKV_DQ_CHAINS=$c DUALKV_COMMIT="${DUALKV_COMMIT:-}+chains$c" TAIL=1 step ab${round}_c$c 150 \
                python3 -m dualkv bench kernel --systems dualkv_mma --shapes 28:4096,8:8192,16:32768,16:65536 \
                --mode bwd --reps 5 --out "$OUT/bench/ab${round}_c$c"
        done
    done
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s41e-table.json"
    DUALKV_DQ_CHAINS=2 DUALKV_KERNELS=mma TAIL=3 step pytest_chains 200 python3 -m pytest -q -x -m gpu \
        -p no:cacheprovider proofs_tests/test_cuda_ordered_dq.py -k "not tree"
    (cd "$OUT" && tar czf s41e.tgz *.log && rm -f *.log)
    ;;
s41f)
    # #13 (run with COMPILE_S=1, carry .commit): what the ordered dQ's waits cost in today's build: the ordered mode with
    # its waits skipped (DKV_DBG_NOWAIT=1: counters, releases, barriers and launch order kept; not deterministic) against
    # the default and the atomic dQ, bwd at Table 1's four shapes, one process per setting, alternating, two rounds
    nowait_ab 1 +nowait 28:4096,8:8192,16:32768,16:65536
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s41f-table.json"
    (cd "$OUT" && tar czf s41f.tgz *.log && rm -f *.log)
    ;;
s41g)
    # #13 (run with COMPILE_S=1, carry .commit): after s41f (the waits cost 1-2%), the ordered mode with its waits and
    # the barrier after them skipped (DKV_DBG_NOWAIT=2; sm_90 d = 128 has two Q / dO stages, so no buffer is reused
    # early) against the default and the atomic dQ, bwd at (16, 32K) and (16, 64K), alternating, two rounds
    nowait_ab 2 +nowait2 16:32768,16:65536
    python3 experiments/gpu/bench_table.py "$OUT/bench" --json "$OUT/s41g-table.json"
    (cd "$OUT" && tar czf s41g.tgz *.log && rm -f *.log)
    ;;
s42layer)
    # #12 item 1 (run with COMPILE_S=1, carry .commit): the layer-level cuDNN systems' GPU tests, then one Qwen3-8B
    # decoder layer over the paper's layer set (README's end-to-end row) with dualkv, the cuDNN cascade on its packing,
    # cuDNN N-copy and FA2 N-copy in one process, 10 timed runs per row
    TAIL=4 step pytest_bench 200 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_hf_gpu.py
    TAIL=14 step layer 420 python3 -m dualkv bench layer --systems dualkv,cudnn_cascade,cudnn_ncopy,fa2_ncopy \
        --P 8192,16384 --mb 8 --extra 5059x32,8192x16,65536x4,131072x8 --warmup 2 --reps 10 --time-budget-s 380 \
        --out "$OUT/bench"
    ;;
s43model)
    # #12 items 1 / 6 (run with COMPILE_S=1, carry .commit): the whole qwen3-1.7b model (28 layers, log-prob head,
    # gradient checkpointing), fwd+bwd, with dualkv, the cuDNN cascade on its packing, cuDNN N-copy and FA2 N-copy in
    # one process, 1 warm-up and 10 timed runs per row; then the layer systems' GPU tests (the _padded refactor)
    TAIL=14 step model 450 python3 -m dualkv bench model --model qwen3-1.7b \
        --systems dualkv,cudnn_cascade,cudnn_ncopy,fa2_ncopy --P 8192,16384 --mb 8 --extra '' --warmup 1 --reps 10 \
        --time-budget-s 400 --no-plot --out "$OUT/bench"
    TAIL=4 step pytest_bench 110 python3 -m pytest -q -m gpu -p no:cacheprovider proofs_tests/test_hf_gpu.py
    ;;
s43trl)
    # #12 item 6 (run with COMPILE_S=1, carry .commit and .whl): TRL's end-to-end GRPO, the long setting only (P = 4096,
    # N = 16), stock against dualkv, 11 steps each (the first is the warm-up), so the README's TRL row has a spread
    python3 experiments/trl_grpo/install_wheels.py .whl > "$OUT/trl_install.log" 2>&1 || tail -5 "$OUT/trl_install.log"
    TAIL=12 step trl 540 python3 experiments/trl_grpo/grpo_e2e.py --settings long --steps 11 --out "$OUT"
    ;;
s43peers)
    # #12 item 6 (run with COMPILE_S=1, carry .commit): the kernel table's FA2 N-copy and FlexAttention columns with
    # their spread (the committed runs, 09abfde / 7927fa9, predate ms_min / ms_max): dualkv and each peer in one
    # process, fwd+bwd, Table 1's six shapes, 2 warm-up and 10 timed runs
    TAIL=10 step peers_fa2 250 python3 -m dualkv bench kernel --mode fwdbwd --systems dualkv,fa2_ncopy --out "$OUT/bench"
    TAIL=10 step peers_flex 290 python3 -m dualkv bench kernel --mode fwdbwd --systems dualkv,flex --out "$OUT/bench"
    ;;
s42verl)
    # #12 item 6 (run with COMPILE_S=1, carry .commit and experiments/verl/wheels): veRL 0.9.1's policy update on one GPU
    # at this commit, stock vs dualkv (each system in its own child process), qwen3-1.7b, P=8192, R=2048, N=$VERL_N
    # (default 8), mb 8, 1 warm-up and $VERL_REPS (default 10) timed runs per phase with every run recorded (seconds_runs).
    # At N = 32 one stock run of the three phases takes ~28 s, so 10 runs of both systems overrun one call (s42)
    python3 -m pip install --no-deps --no-index --target /tmp/verl-site experiments/verl/wheels/*.whl \
        > "$OUT/verl_install.log" 2>&1 || tail -5 "$OUT/verl_install.log"
    PYTHONPATH=$PWD:/tmp/verl-site TAIL=12 step policy 570 python3 experiments/policy_update_bench.py --model qwen3-1.7b \
        --P 8192 --R 2048 --N "${VERL_N:-8}" --mb 8 --warmup 1 --reps "${VERL_REPS:-10}" --time-budget-s 530 \
        --out "$OUT/bench"
    ;;
host)
    # #12: the host's share of each pass (events vs GPU time vs host time), dualkv and the cuDNN cascade
    TAIL=8 step host 200 python3 experiments/gpu/host_overhead.py --shapes 16:32768,8:8192,4:1024 --out "$OUT"
    ;;
*) echo "unknown part $1 (tests, mma, dqorder, lsecp, mmatable, trees, hd96, treedq, orders, orderbench, treebench, defaults, groups8, hybrid,"\
        "table1, shared, headmajor, hd96cudnn, wsprofile, wsdefaults, ws64, ws96, dqfirst, dqpath, wsfwd96, table1dq,"\
        "floor6496, hybrid6496, wsfinal, dq96, final, floortests, floorjson,"\
        "host, wide, widefloor, final13, wswide, wsfinal2, wide256, wsreview, widetrees, widetreebench, tiles16, fwd16b, final16a, final16b, final16c, final16d, final16e, atomicprof, stage17, table17, final17, verify17, ordprof, frag, fragtable, ordred, ordfrag, ordearly, wsprof2, fence2ws, prefetch2, ordtable, autoord, mmatrees, mmaprof, qwarps, qwarps2, qwfinal, qwtests, release, fwdmask, defer, lsestage, final22, wsstages3, s23stages, s23mask, s23tests, s23tables, s23put, s23wide, s23prof, s24lse, s24searly, s24poly, s24diag, s24qdo, s24qdo2, s25split, s25tests, s25mma, s25final, s25floor, s26a, s26b, s26c, s26d, s26e, s26f, s26next, s27rl, s27fix, s27ab, s27sweep, s28next, s28nvrtc, s29addr32, s29addr32t, s29addr32b, s30nvrtc, s30mode1, s30final, s31next, s31ncu, s31fwd, s31swz, s31final, s31check, s32next, s32nvrtc, s32mid, s32t135, s32final, s32geom, s33seg, s33table, s33cache, s33fix, s33final, s33rl, s33hopper, s33atomic, s34mc, s34mc2, s34red, s34final, s34ncu, s34table, s34split, s37check, s37rest, s37def, s37pair, s38a, s38b, s38mg, s38mg2, s38bench, s39addr, s39final, s39table, s39def, s39rest, s39rl, s39n135, s40a, s40b, s40c, s40d, s40e, s42layer, s42verl, s43model, s43trl, s43peers)"
   exit 2 ;;
esac
