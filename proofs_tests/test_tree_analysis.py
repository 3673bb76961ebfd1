"""Tree token, pair and FLOP models checked by brute force: against the keys the reference attention actually
masks in, against from_sequences batches counted sequence by sequence, against GroupLayout's models on depth-1
trees; the best two-level packing against an exhaustive search; the issue's three workloads."""

import itertools
import random

import pytest
import torch

from dualkv import GroupLayout, PrefixTreeLayout
from dualkv.analysis import (branching_workload, causal_row_pairs, model_flops, multi_turn_workload, n_copy_pairs,
                             rho_layout, step_speedup_bounds, system_prompt_workload, tree_attn_ratio,
                             tree_n_copy_pairs, tree_rho, tree_tokens_ncopy, tree_useful_pairs, two_level_counts,
                             useful_pairs, workload_table)
from dualkv.analysis.trees import tree_rows
from dualkv.reference import core
from dualkv.reference.tree import tree_attention


def random_forest(rng: random.Random, nodes: int, lens=(1, 2, 3, 6, 11)) -> PrefixTreeLayout:
    parents = [-1] + [-1 if rng.random() < 0.1 else rng.randrange(i) for i in range(1, nodes)]
    return PrefixTreeLayout([rng.choice(lens) for _ in range(nodes)], parents)


def visible_keys(t: int, left: int) -> int:
    return t + 1 if left < 0 else min(t, left) + 1


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("left", [-1, 0, 3, 10])
def test_pairs_by_brute_force(seed, left):
    layout = random_forest(random.Random(seed), 15)
    positions = layout.position_ids().tolist()
    assert tree_useful_pairs(layout, left) == sum(visible_keys(t, left) for t in positions)
    rows = [layout.path_lens[i] for i in layout.leaves]
    assert tree_n_copy_pairs(layout, left) == sum(visible_keys(t, left) for s in rows for t in range(s))
    assert tree_tokens_ncopy(layout) == sum(rows) == layout.tokens_std


@pytest.mark.parametrize("left", [-1, 2, 9])
def test_pairs_are_what_the_reference_computes(monkeypatch, left):
    """The model counts exactly the (query, key) pairs the reference attention masks in."""
    layout = random_forest(random.Random(7), 12)
    seen = []
    original = core._chunk_attention

    def spy(q, k, v, mask, scale):
        seen.append(int(mask.sum()))
        return original(q, k, v, mask, scale)

    monkeypatch.setattr(core, "_chunk_attention", spy)
    x = torch.randn(layout.total_tokens, 1, 4, dtype=torch.float64)
    tree_attention(x, x, x, layout, window_size=(left, 0))
    assert sum(seen) == tree_useful_pairs(layout, left)


@pytest.mark.parametrize("seed", range(10))
def test_counts_of_from_sequences_batches(seed):
    """With a TreeIndex as rows, the N-copy side is the batch itself: duplicates and prefix sequences counted."""
    rng = random.Random(seed)
    seqs = []
    for _ in range(rng.randint(1, 8)):
        base = rng.choice(seqs) if seqs and rng.random() < 0.7 else []
        seqs.append(base[:rng.randint(0, len(base))] + [rng.randrange(3) for _ in range(rng.randint(1, 7))])
    seqs.append(list(seqs[0]))
    layout, index = PrefixTreeLayout.from_sequences(seqs)
    assert layout.total_tokens == index.packed_ids.shape[0] == len({tuple(s[:n]) for s in seqs
                                                                     for n in range(1, len(s) + 1)})
    assert tree_tokens_ncopy(layout, index) == sum(map(len, seqs))
    assert tree_rho(layout, index) == sum(map(len, seqs)) / layout.total_tokens
    for left in (-1, 2):
        assert tree_n_copy_pairs(layout, left, index) == sum(causal_row_pairs(len(s), left) for s in seqs)
        assert tree_attn_ratio(layout, left, index) == (tree_n_copy_pairs(layout, left, index)
                                                        / tree_useful_pairs(layout, left))


@pytest.mark.parametrize("left", [-1, 5])
def test_depth_one_tree_matches_the_group_models(left):
    group = GroupLayout.from_lengths([7, 30, 2], [[3, 9, 1], [12], [4, 4]])
    tree = PrefixTreeLayout.from_group_layout(group)
    assert tree_useful_pairs(tree, left) == useful_pairs(group, left) == useful_pairs(tree, left)
    assert tree_n_copy_pairs(tree, left) == n_copy_pairs(group, left) == n_copy_pairs(tree, left)
    assert tree_rho(tree) == rho_layout(group) == rho_layout(tree)
    for kind in ("dualkv", "ncopy"):
        assert model_flops("qwen3-8b", tree, "fwdbwd", kind) == model_flops("qwen3-8b", group, "fwdbwd", kind)
    assert two_level_counts(tree, left)["tokens"] == group.total_tokens
    assert two_level_counts(tree, left)["pairs"] == useful_pairs(group, left)


def _two_level_brute(layout: PrefixTreeLayout, left: int) -> tuple[int, int]:
    """Every assignment of each leaf to one of its strict ancestors (or none): min (tokens, pairs)."""
    S = layout.path_lens
    F = [causal_row_pairs(s, left) for s in S]
    choices = [(-1, *layout.ancestors(leaf)) for leaf in layout.leaves]
    best = None
    for pick in itertools.product(*choices):
        used = {a for a in pick if a >= 0}
        tokens = sum(S[a] for a in used) + sum(S[l] - (S[a] if a >= 0 else 0) for l, a in zip(layout.leaves, pick))
        pairs = sum(F[a] for a in used) + sum(F[l] - (F[a] if a >= 0 else 0) for l, a in zip(layout.leaves, pick))
        best = (tokens, pairs) if best is None else min(best, (tokens, pairs))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_two_level_counts_are_optimal(seed):
    rng = random.Random(seed)
    layout = random_forest(rng, rng.randint(2, 9), lens=(1, 2, 5, 13))
    got = two_level_counts(layout, -1)
    assert (got["tokens"], got["pairs"]) == _two_level_brute(layout, -1)
    assert layout.total_tokens <= got["tokens"] <= layout.tokens_std       # a tree never packs worse


def test_workloads_match_their_closed_forms():
    a = system_prompt_workload()
    assert (a.num_nodes, a.num_paths, a.max_depth, a.max_path_len) == (73, 64, 2, 2048 + 4096 + 2048)
    assert a.total_tokens == 2048 + 8 * 4096 + 64 * 2048 and a.tokens_std == 64 * 8192
    assert two_level_counts(a)["tokens"] == 8 * (6144 + 8 * 2048)         # one group per prompt
    b = branching_workload()
    assert (b.num_nodes, b.num_paths, b.max_path_len) == (21, 16, 4096 + 512 + 1536)
    assert b.total_tokens == 4096 + 4 * 512 + 16 * 1536 and b.tokens_std == 16 * 6144
    assert two_level_counts(b)["tokens"] == 4096 + 16 * 2048              # the prompt as the one group prompt
    c = multi_turn_workload()
    assert (c.num_nodes, c.max_depth, c.num_paths) == (11, 3, 8)
    assert c.total_tokens == 3 * 1024 + 8 * 1024 and c.tokens_std == 8 * 4096
    assert two_level_counts(c)["tokens"] == c.total_tokens                 # a chain then one fan is two-level
    assert tree_rho(a) == pytest.approx(524288 / 165888)
    assert tree_rho(b) == pytest.approx(3.2)


def test_workload_lengths_per_leaf_and_bad_sizes():
    b = branching_workload(responses=2, continuations=2, continuation_len=[5, 6, 7, 8])
    assert [b.node_lens[i] for i in b.leaves] == [5, 6, 7, 8]
    with pytest.raises(ValueError, match="N = 4 but R lists 3"):
        branching_workload(responses=2, continuations=2, continuation_len=[5, 6, 7])
    with pytest.raises(ValueError, match="prompts = 0"):
        system_prompt_workload(prompts=0)
    with pytest.raises(ValueError, match="turns = 0"):
        multi_turn_workload(turns=0)


def test_workload_table_rows_are_consistent():
    rows = workload_table()
    assert [r["workload"][0] for r in rows] == ["a", "b", "c"]
    for r in rows:
        assert r["tokens_tree"] <= r["tokens_two_level"] <= r["tokens_ncopy"]
        assert r["rho"] == r["tokens_ncopy"] / r["tokens_tree"]
        # whole-model FLOP ratio is a mediant of the token and attention ratios
        assert min(r["rho"], r["attn_ratio"]) <= r["flop_ratio"] <= max(r["rho"], r["attn_ratio"])


def test_speedup_bounds_accept_trees():
    bounds = step_speedup_bounds("qwen3-8b", branching_workload())
    assert bounds["rho"] == pytest.approx(3.2)
    assert bounds["lower"] <= bounds["flop_ratio"] <= bounds["upper"]


def test_bad_rows_and_layouts_are_refused():
    layout = multi_turn_workload()
    other, index = PrefixTreeLayout.from_sequences([[1, 2], [1, 3]])
    with pytest.raises(ValueError, match="TreeIndex of another layout"):
        tree_rows(layout, index)
    with pytest.raises(ValueError, match="not a node"):
        tree_rows(layout, [99])
    with pytest.raises(ValueError, match="rows is empty"):
        tree_rows(layout, [])
    with pytest.raises(TypeError, match="must be a PrefixTreeLayout"):
        tree_useful_pairs(GroupLayout.single(3, [1]))
    with pytest.raises(TypeError, match="GroupLayout or a PrefixTreeLayout"):
        model_flops("qwen3-8b", [3, 1])
    assert tree_rows(other, index) == index.end_nodes


def test_docs_table_is_the_models_output():
    """docs/trees.md shows exactly what workload_table computes (no hand-entered numbers)."""
    from pathlib import Path

    from dualkv.analysis import format_workload_table

    doc = (Path(__file__).resolve().parents[1] / "docs" / "trees.md").read_text()
    assert format_workload_table(workload_table()) in doc
