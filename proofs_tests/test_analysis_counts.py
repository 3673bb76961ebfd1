"""Token counts, rho, pair counts and attention FLOPs of dualkv.analysis against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dualkv import GroupLayout
from dualkv.analysis import (attention_flops, attn_speedup_pairs, attn_speedup_theory, causal_row_pairs,
                             micro_batch_layouts, n_copy_pairs, pairs_dualkv, pairs_ncopy, rho, rho_equal, rho_layout,
                             rho_micro_batched, tokens_dualkv, tokens_std, useful_pairs)


def brute_pairs(layout: GroupLayout, left: int) -> tuple[int, int]:
    """Count (query, key) pairs from the packed token stream itself: a key is visible to a query of the same group
    if it is a prompt key or a key of the query's own segment, at a logical position in [pos(q) - left, pos(q)].
    N-copy: the same rule over rows [prompt; response] laid out separately."""
    pos = layout.position_ids().tolist()
    seg = [None] * layout.total_tokens           # (group, -1) for prompt tokens, (group, i) for response i
    for g in range(layout.num_groups):
        a, b = layout.prompt_range(g)
        for t in range(a, b):
            seg[t] = (g, -1)
        for i in range(layout.group_sizes[g]):
            a, b = layout.response_range(g, i)
            for t in range(a, b):
                seg[t] = (g, i)

    def visible(q: int, k: int) -> bool:
        same = seg[k][0] == seg[q][0] and (seg[k][1] == -1 or seg[k] == seg[q])
        lo = pos[q] - left if left >= 0 else -1
        return same and lo <= pos[k] <= pos[q] and (seg[q][1] != -1 or seg[k][1] == -1)

    useful = sum(visible(q, k) for q in range(layout.total_tokens) for k in range(layout.total_tokens))
    ncopy = 0
    for lo, hi in zip(layout.copy_cu_seqlens[:-1], layout.copy_cu_seqlens[1:]):
        n = int(hi - lo)
        ncopy += sum(1 for q in range(n) for k in range(n) if k <= q and (left < 0 or k >= q - left))
    return useful, ncopy


LAYOUTS = [
    GroupLayout.single(5, [3]),
    GroupLayout.single(4, [1, 6, 2]),
    GroupLayout.single(1, [1, 1]),
    GroupLayout.from_lengths([3, 6], [[2, 5], [1, 1, 4]]),
    GroupLayout.from_lengths([7, 2, 4], [[1], [3, 3], [8, 1]]),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
@pytest.mark.parametrize("left", [-1, 0, 1, 2, 4, 7, 30])
def test_pairs_match_brute_force(layout, left):
    useful, ncopy = brute_pairs(layout, left)
    assert useful_pairs(layout, left) == useful
    assert n_copy_pairs(layout, left) == ncopy


def test_useful_pairs_is_the_baselines_definition():
    # /work/shared/notes/baselines.md: per group P(P+1)/2 + sum_i (R_i*P + R_i(R_i+1)/2)
    for layout in LAYOUTS:
        expected = sum(p * (p + 1) // 2 + sum(r * p + r * (r + 1) // 2 for r in lens)
                       for p, lens in zip(layout.prompt_lens, layout.response_lens))
        assert useful_pairs(layout) == expected
    assert pairs_dualkv(16, 32768, 2048) == 32768 * 32769 // 2 + 16 * (2048 * 32768 + 2048 * 2049 // 2)
    assert pairs_ncopy(16, 32768, 2048) == 16 * 34816 * 34817 // 2


def test_window_longer_than_rows_is_unwindowed():
    layout = GroupLayout.single(100, [50, 20])
    assert useful_pairs(layout, 10_000) == useful_pairs(layout)
    assert n_copy_pairs(layout, 149) == n_copy_pairs(layout)
    assert n_copy_pairs(layout, 148) < n_copy_pairs(layout)
    assert causal_row_pairs(0) == 0


def test_window_and_n_one():
    # N = 1: nothing is shared; a window inside the prompt leaves responses' pairs unchanged in both layouts
    layout = GroupLayout.single(1000, [64])
    assert useful_pairs(layout, 127) == n_copy_pairs(layout, 127)
    assert useful_pairs(layout) == n_copy_pairs(layout)


def test_attention_flops():
    assert attention_flops(10, 32, 128, "fwd") == 4 * 128 * 32 * 10
    assert attention_flops(10, 32, 128, "bwd") == 2.5 * 4 * 128 * 32 * 10
    assert attention_flops(10, 32, 128, "fwdbwd") == 3.5 * 4 * 128 * 32 * 10
    # baselines.md: Flex at (16, 32K) fwd+bwd 234 ms is "402" useful TFLOP/s (the ms is rounded: +-0.2%)
    tflops = attention_flops(pairs_dualkv(16, 32768, 2048), 32, 128, "fwdbwd") / 0.234 / 1e12
    assert abs(tflops - 402) < 1.0


def test_tokens_and_rho_equal_and_unequal():
    assert tokens_std(16, 65536, 512) == 16 * (65536 + 512)
    assert tokens_dualkv(16, 65536, 512) == 65536 + 16 * 512
    assert rho(16, 65536, 512) == pytest.approx(14.333333333333334)
    lens = [100, 300, 700, 900]
    assert tokens_std(None, 4096, lens) == 4 * 4096 + 2000
    assert tokens_dualkv(4, 4096, lens) == 4096 + 2000
    assert rho(None, 4096, lens) == pytest.approx(rho(4, 4096, 500))       # rho depends only on sum R_i
    assert attn_speedup_pairs(None, 4096, lens) != pytest.approx(attn_speedup_pairs(4, 4096, 500))
    layout = GroupLayout.from_lengths([10, 20], [[1, 2], [3]])
    assert rho_layout(layout) == (2 * 10 + 3 + 20 + 3) / (10 + 3 + 20 + 3)


def test_rho_equal_broadcasts_and_agrees():
    n = np.array([1, 2, 8, 16, 32])[:, None]
    p = np.array([128, 4096, 65536])[None, :]
    grid = rho_equal(n, p, 512)
    assert grid.shape == (5, 3)
    for i, j in itertools.product(range(5), range(3)):
        assert grid[i, j] == pytest.approx(rho(int(n[i, 0]), int(p[0, j]), 512), rel=1e-12)
    assert np.all(grid[0] == 1.0)
    assert isinstance(rho_equal(16, 65536, 512), float)


def test_attention_speedup_theory_vs_pairs():
    assert attn_speedup_theory(16, 32768, 2048) == pytest.approx(16 * 34816**2 / (32768**2 + 16 * 2048 * 34816))
    # N = 1 shares nothing: the exact ratio is 1, the paper's closed form is not (it counts squares)
    assert attn_speedup_pairs(1, 1000, 10) == 1.0
    assert attn_speedup_theory(1, 1000, 10) == pytest.approx(1010**2 / (1000**2 + 10 * 1010))
    for N, P, R in [(4, 1024, 2048), (16, 32768, 2048), (8, 131072, 512)]:
        # squares overcount the response-to-prompt term relative to triangles: the closed form is higher
        assert attn_speedup_theory(N, P, R) > attn_speedup_pairs(N, P, R)


def test_micro_batches():
    parts = micro_batch_layouts(32, 8192, 2048, 8)
    assert len(parts) == 4 and all(p.group_sizes == (8,) for p in parts)
    parts = micro_batch_layouts(4, 100, [1, 2, 3, 4], 3, prompts=2)
    assert [p.group_sizes for p in parts] == [(3,), (1, 2), (2,)]
    assert [p.response_lens for p in parts] == [((1, 2, 3),), ((4,), (1, 2)), ((3, 4),)]
    assert rho_micro_batched(8, 1000, 100, 16) == rho(8, 1000, 100)
    assert rho_micro_batched(8, 1000, 100, 1) == 1.0
    # mb that does not divide N: micro-batches of 3, 3, 2 rows
    expected = (3 * 1000 + 300 + 3 * 1000 + 300 + 2 * 1000 + 200) / (1300 + 1300 + 1200)
    assert rho_micro_batched(8, 1000, 100, 3) == pytest.approx(expected)


@pytest.mark.parametrize("call,match", [
    (lambda: rho(0, 100, 10), "N = 0"),
    (lambda: rho(4, -5, 10), "P = -5"),
    (lambda: rho(4, 100, -1), "R = -1"),
    (lambda: rho(4, 100, [1, 2]), "N = 4 but R lists 2"),
    (lambda: rho(None, 100, []), "empty"),
    (lambda: rho(None, 100, 5), "N is required"),
    (lambda: rho(4, 100, [1, 0, 2, 3]), r"R\[1\] = 0"),
    (lambda: rho(4, 100.5, 10), "whole number"),
    (lambda: rho(True, 100, 10), "bool"),
    (lambda: rho_equal(0.5, 100, 10), "N = 0.5"),
    (lambda: rho_equal(4, [100, -1], 10), "P = -1"),
    (lambda: useful_pairs(GroupLayout.single(3, [1]), -2), "window_left = -2"),
    (lambda: useful_pairs((3, [1])), "GroupLayout"),
    (lambda: attention_flops(10, 32, 128, "both"), "mode"),
    (lambda: attention_flops(-1, 32, 128, "fwd"), "pairs = -1"),
    (lambda: micro_batch_layouts(4, 100, 10, 0), "mb = 0"),
    (lambda: attn_speedup_theory(4, 100, 0), "R = 0"),
])
def test_bad_input_names_the_problem(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
