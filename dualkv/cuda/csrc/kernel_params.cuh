// The kernels' parameter lists, one per kernel kind, shared by the mma.sync and the wgmma (sm_90a) kernel of that
// kind so that both match the launcher's argument order (dualkv/cuda/launch.py). Rows of (tokens, heads, d)
// tensors come as (pointer, token stride, head stride) in elements.
#pragma once

#define DKV_QKV_PARAMS                                                   \
    const elem_t* __restrict__ q, long long q_st, long long q_sh,        \
    const elem_t* __restrict__ kc, long long kc_st, long long kc_sh,     \
    const elem_t* __restrict__ vc, long long vc_st, long long vc_sh,     \
    const elem_t* __restrict__ kd, long long kd_st, long long kd_sh,     \
    const elem_t* __restrict__ vd, long long vd_st, long long vd_sh

// Forward: O and the natural-log LSE (H, T_q).
#define DKV_FWD_PARAMS                                                   \
    DKV_QKV_PARAMS,                                                      \
    elem_t* __restrict__ o, long long o_st, long long o_sh,              \
    float* __restrict__ lse, long long lse_sh,                           \
    const int* __restrict__ segments, const int* __restrict__ tiles,     \
    int group_size, float scale_log2, int window_left

// Backward inputs: dO, the LSE in the log2 domain and D = rowsum(dO * O), both (H, T_q).
#define DKV_BWD_IN_PARAMS                                                \
    DKV_QKV_PARAMS,                                                      \
    const elem_t* __restrict__ dout, long long do_st, long long do_sh,   \
    const float* __restrict__ lse2, const float* __restrict__ delta, long long lse_sh

#define DKV_DQ_PARAMS                                                    \
    DKV_BWD_IN_PARAMS,                                                   \
    elem_t* __restrict__ dq, long long dq_st, long long dq_sh,           \
    const int* __restrict__ segments, const int* __restrict__ tiles,     \
    int group_size, float scale_log2, float scale, int window_left

// dK/dV of context rows (dkc, dvc) and own rows (dkd, dvd); dq_acc: the atomic and ordered modes' fp32 dQ in
// fragment order (dualkv/cuda/dq_layout.py: head stride dqa_sh; dqa_st, its float count, is no longer read), and
// dq_sems, qtile_offset, n_qtiles, kv_heads, first_tiles: the ordered mode's counters and grid (first_tiles >= 0:
// head-major CTAs split after that many table rows, keywalk.cuh's cta_head_tile; < 0: a row's KV heads adjacent;
// else unused); part_acc, part_sems, parts, partial_rows: the ordered mode's split key tiles (split_parts.cuh; read
// by its DKV_SPLIT_TILES build only; parts 1 and no partial rows otherwise).
#define DKV_DKDV_PARAMS                                                  \
    DKV_BWD_IN_PARAMS,                                                   \
    elem_t* __restrict__ dkc, long long dkc_st, long long dkc_sh,        \
    elem_t* __restrict__ dvc, long long dvc_st, long long dvc_sh,        \
    elem_t* __restrict__ dkd, long long dkd_st, long long dkd_sh,        \
    elem_t* __restrict__ dvd, long long dvd_st, long long dvd_sh,        \
    float* __restrict__ dq_acc, long long dqa_st, long long dqa_sh,      \
    int* __restrict__ dq_sems, const int* __restrict__ qtile_offset,     \
    int n_qtiles, int kv_heads, int first_tiles,                         \
    const int* __restrict__ segments, const int* __restrict__ key_tiles, \
    int group_size, float scale_log2, float scale, int window_left,      \
    float* __restrict__ part_acc, int* __restrict__ part_sems, int parts, int partial_rows
