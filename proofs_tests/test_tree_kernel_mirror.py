"""The tree kernels' walks (DKV_TREE=1 query kernels, descendant-range key tiles), replayed in float64 on the CPU from
the tables the GPU reads, equal the tree reference (<= 1e-10) on random forests; known-wrong tables are caught; the
tables themselves (preorder, runs, tiles) are checked."""

import random

import numpy as np
import pytest
import torch

from dualkv import GroupLayout, PrefixTreeLayout
from dualkv.cuda import tree_schedule as ts
from dualkv.cuda.configs import DKDV_TILES, DQ_TILES, FWD_TILES, SM90_FWD_TILES, SM90_WS_FWD_TILES, pack_for
from dualkv.cuda.tree_mirror import mirror_tree_dkdv, mirror_tree_dq, mirror_tree_forward
from dualkv.reference.tree import tree_attention
from dualkv.testing import rel_err

BOUND = 1e-10
LENS = (1, 2, 3, 5, 9, 17, 31, 33, 63, 65)


def random_preorder_forest(rng: random.Random, nodes: int, lens=LENS) -> PrefixTreeLayout:
    parents = [-1] + [-1 if rng.random() < 0.15 else rng.randrange(i) for i in range(1, nodes)]
    return ts.preorder_permutation(PrefixTreeLayout([rng.choice(lens) for _ in range(nodes)], parents))[0]


def _preorder(layout: PrefixTreeLayout) -> PrefixTreeLayout:
    return ts.preorder_permutation(layout)[0]


SHAPES = {name: _preorder(layout) for name, layout in {
    "single-token nodes": PrefixTreeLayout([1] * 9, [-1, 0, 1, 1, 0, 4, -1, 6, 6]),
    "chain": PrefixTreeLayout([3, 1, 4, 1, 5, 9, 2], [-1, 0, 1, 2, 3, 4, 5]),
    "wide fan": PrefixTreeLayout([7] + [1, 2, 3, 4] * 4, [-1] + [0] * 16),
    "several roots": PrefixTreeLayout([4, 2, 3, 1, 6, 2, 5], [-1, 0, -1, 2, 2, -1, 5]),
    "fans of fans": PrefixTreeLayout([65, 33, 17, 2, 63, 1, 31, 9, 5], [-1, 0, 0, 1, 1, 2, 2, 3, 3]),
    "deep and wide": PrefixTreeLayout([40, 70, 1, 20, 20, 3, 90, 5], [-1, 0, 1, 2, 2, 0, 5, -1]),
}.items()}


def _inputs(layout, heads=4, kv_heads=2, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(layout.total_tokens, h, d, generator=gen, dtype=torch.float64)  # noqa: E731
    q, k, v = (make(h).requires_grad_() for h in (heads, kv_heads, kv_heads))
    return q, k, v, make(heads)


def _reference(layout, q, k, v, g, scale):
    out, lse = tree_attention(q, k, v, layout, softmax_scale=scale, return_lse=True)
    dq, dk, dv = torch.autograd.grad((out * g).sum(), (q, k, v))
    return out.detach(), lse.detach(), dq, dk, dv


def mirror_errors(layout, *, fwd_tile=FWD_TILES[64], dq_tile=DQ_TILES[64], block_keys=DKDV_TILES[64].block_keys,
                  heads=4, kv_heads=2, d=16, seed=0, table_fn=ts.tree_segments, key_tiles_fn=ts.tree_key_tiles):
    q, k, v, g = _inputs(layout, heads, kv_heads, d, seed)
    scale = 0.7 * d ** -0.5
    out_r, lse_r, dq_r, dk_r, dv_r = _reference(layout, q, k, v, g, scale)
    group = heads // kv_heads
    out, lse = mirror_tree_forward(q, k, v, layout, block_m=fwd_tile.block_m, block_n=fwd_tile.block_n,
                                   pack=pack_for(group, fwd_tile), scale=scale, table_fn=table_fn)
    dq = mirror_tree_dq(q, k, v, g, out_r, lse_r, layout, block_m=dq_tile.block_m, block_n=dq_tile.block_n,
                        pack=pack_for(group, dq_tile), scale=scale, table_fn=table_fn)
    dk, dv, writes = mirror_tree_dkdv(q, k, v, g, out_r, lse_r, layout, block_keys=block_keys, scale=scale,
                                      key_tiles_fn=key_tiles_fn)
    errors = {"out": rel_err(out, out_r), "lse": rel_err(lse, lse_r), "dq": rel_err(dq, dq_r),
              "dk": rel_err(dk, dk_r), "dv": rel_err(dv, dv_r)}
    return {n: (e if e == e else float("inf")) for n, e in errors.items()}, writes


def assert_exact(errors):
    bad = {k: e for k, e in errors.items() if not e <= BOUND}
    assert not bad, f"mirror errors above {BOUND}: {bad}"


@pytest.mark.parametrize("name", list(SHAPES))
def test_mirror_equals_reference_on_shapes(name):
    errors, writes = mirror_errors(SHAPES[name])
    assert_exact(errors)
    assert (writes == 1).all()  # every key row written by exactly one tile


@pytest.mark.parametrize("seed", range(6))
def test_mirror_random_forests_and_tiles(seed):
    rng = random.Random(seed)
    layout = random_preorder_forest(rng, rng.randint(2, 16))
    fwd_tile = rng.choice([FWD_TILES[64], FWD_TILES[128], SM90_FWD_TILES[128], SM90_WS_FWD_TILES[256]])
    dq_tile = rng.choice([DQ_TILES[64], DQ_TILES[128]])
    heads, kv_heads = rng.choice([(4, 2), (8, 2), (8, 1), (2, 2)])
    errors, writes = mirror_errors(layout, fwd_tile=fwd_tile, dq_tile=dq_tile, block_keys=rng.choice([32, 64, 128]),
                                   heads=heads, kv_heads=kv_heads, d=8, seed=seed)
    assert_exact(errors)
    assert (writes == 1).all()


def test_mirror_of_a_depth_one_tree_equals_the_group_layout_schedule():
    """A GroupLayout as a tree: one context run per response, the same blocks as the two-level kernels visit."""
    group = GroupLayout.from_lengths([65, 2], [[63, 1, 129], [70]])
    tree = PrefixTreeLayout.from_group_layout(group)
    assert_exact(mirror_errors(tree)[0])
    table = ts.tree_segments(tree)
    seg = group.segment_table
    for s in range(tree.num_nodes):
        q_start, q_len, runs, pos = ts.parse_segment(table, s)
        assert (q_start, q_len) == (tree.node_starts[s], tree.node_lens[s])
        ctx = ts.context_list(table, runs)
        if tree.parents[s] >= 0:   # a response: its group's prompt, exactly the two-level segment's context
            row = next(r for r in seg.tolist() if r[0] == q_start)
            assert ctx == [(row[2], row[3])] and pos == row[3]
        else:
            assert ctx == [] and pos == 0


# ---------------------------------------------------------------------------------------------- known-wrong variants
def _drop_root_run(layout):
    """Context lists without their first (root) run: a missing ancestor."""
    table = ts.tree_segments(layout).copy()
    n = layout.num_nodes
    for s in range(n):
        runs = int(table[4 * s + 2])
        n_runs = int(table[2 * runs])
        if n_runs > 0:
            rest = table[2 * (runs + 2):2 * (runs + 1 + n_runs)].copy()
            table[2 * (runs + 1):2 * (runs + 1) + rest.size] = rest
            table[2 * runs] = n_runs - 1
    return table


def _first_dependent_only(layout, block_keys):
    """Key tiles that walk only their first dependent segment: an ancestor's dK/dV not summed over every
    descendant."""
    tiles = ts.tree_key_tiles(layout, block_keys).copy()
    tiles[:, 3] = np.minimum(tiles[:, 3], tiles[:, 2] + 1)
    return tiles


def test_missing_ancestor_is_caught():
    chain = PrefixTreeLayout([3, 70, 4, 1, 5], [-1, 0, 1, 1, 3])
    for lay in (chain, SHAPES["deep and wide"], SHAPES["fans of fans"]):
        errors, _ = mirror_errors(lay, table_fn=_drop_root_run)
        assert errors["out"] > 1e-3 and errors["dq"] > 1e-3


def test_context_blocks_masked_as_future_keys_are_caught(monkeypatch):
    """The bug the first GPU run found: context blocks numbered run after run and masked causally by that number."""
    from dualkv.cuda import tree_mirror

    layout = PrefixTreeLayout([1, 1, 1, 1, 1, 1, 3, 1], [-1, 0, 1, 1, 0, 4, 5, 6])  # two one-token context runs
    assert_exact(mirror_errors(layout)[0])
    monkeypatch.setattr(tree_mirror, "context_key_base", lambda j, block_n: j * block_n)
    errors, _ = mirror_errors(layout)
    assert errors["out"] > 1e-3 and errors["lse"] > 1e-3


def test_ancestor_gradient_not_summed_is_caught():
    layout = SHAPES["fans of fans"]
    errors, _ = mirror_errors(layout, key_tiles_fn=_first_dependent_only)
    assert errors["out"] <= BOUND and errors["dq"] <= BOUND
    assert errors["dk"] > 1e-3 and errors["dv"] > 1e-3


# ---------------------------------------------------------------------------------------------- tables
def test_preorder_check_and_permutation():
    bad = PrefixTreeLayout([2, 3, 4, 5], [-1, -1, 0, 1])
    assert not ts.is_preorder(bad)
    with pytest.raises(ValueError, match="not in depth-first preorder: node 2"):
        ts.tree_segments(bad)
    good, perm = ts.preorder_permutation(bad)
    assert good.parents == (-1, 0, -1, 2) and good.node_lens == (2, 4, 3, 5)
    assert perm.tolist() == [0, 1, 5, 6, 7, 8, 2, 3, 4, 9, 10, 11, 12, 13]
    assert ts.is_preorder(good)
    for lay in SHAPES.values():
        assert ts.is_preorder(lay)
        assert ts.preorder_permutation(lay)[1].tolist() == list(range(lay.total_tokens))


def test_from_sequences_emits_preorder():
    rng = random.Random(3)
    seqs = [[rng.randrange(3) for _ in range(rng.randint(1, 12))] for _ in range(40)]
    layout, _ = PrefixTreeLayout.from_sequences(seqs)
    assert ts.is_preorder(layout)


def test_runs_merge_contiguous_ancestors():
    chain = SHAPES["chain"]  # every node directly after its parent: one run
    assert ts.tree_runs(chain, 6) == [(0, sum(chain.node_lens[:6]))]
    layout = SHAPES["deep and wide"]  # node 6's ancestors 0 and 5 are not adjacent in the packed stream
    assert ts.tree_runs(layout, 6) == [(0, 40), (layout.node_starts[5], 3)]
    table = ts.tree_segments(layout)
    assert table.dtype == np.int32 and ts.context_list(table, ts.parse_segment(table, 6)[2]) == ts.tree_runs(layout, 6)


@pytest.mark.parametrize("block_n", [32, 64, 128])
def test_tree_block_walks_every_context_key_once(block_n):
    layout = SHAPES["deep and wide"]
    for node in range(layout.num_nodes):
        runs = ts.tree_runs(layout, node)
        keys = []
        for j in range(ts.context_blocks(runs, block_n)):
            row, count = ts.tree_block(runs, j, block_n)
            assert 1 <= count <= block_n
            keys.extend(range(row, row + count))
        expected = [r for a in layout.ancestors(node) for r in range(*layout.node_range(a))]
        assert keys == expected


def test_key_tiles_cover_every_row_once_with_descendant_ranges():
    layout = SHAPES["deep and wide"]
    tiles = ts.tree_key_tiles(layout, 64)
    ends = ts.subtree_ends(layout)
    covered = np.zeros(layout.total_tokens, dtype=int)
    for node, blk, dep_begin, dep_end in tiles.tolist():
        assert (dep_begin, dep_end) == (node + 1, ends[node])
        a, b = layout.node_range(node)
        covered[a + blk * 64:min(b, a + (blk + 1) * 64)] += 1
    assert (covered == 1).all()
    # heaviest first: the root's first block (its node and every descendant) leads
    assert tuple(tiles[0]) == (0, 0, 1, 7)


# ---------------------------------------------------------------------------------------------- builds
def test_tree_specializations_compile_without_spills_or_serialized_wgmma():
    """Every query kernel (and on sm_90 the warp-specialised backward) has a DKV_TREE=1 specialization in the build
    list (causal, no window; of the dK/dV kernels only the ordered dQ mode, whose ranks need it), and a sample of the query kernels compiles with NVRTC for
    sm_80 / sm_90a with no more spills than the two-level build of the same kernel and no serialized wgmma
    (proofs_tests/test_ws_backward_tree.py compiles the backward's). (`dualkv kernels --compile-only` builds all.)"""
    from dualkv.cuda.build import compile_spec, resource_usage
    from dualkv.cuda.configs import TREE_KERNELS, all_specs

    for arch in ("sm_80", "sm_90"):
        tree_specs = [s for s in all_specs(arch) if s.tree]
        assert all(s.causal and not s.window and (s.kernel in TREE_KERNELS or s.dq_ordered) for s in tree_specs)
        expected = {"fwd", "bwd_dq"} | ({"fwd_sm90", "fwd_sm90_ws", "bwd_dq_sm90"} if arch == "sm_90" else set())
        assert {s.kernel for s in tree_specs} == expected | ({"bwd_sm90_ws"} if arch == "sm_90" else set()) | {
            "bwd_dkdv"}
        sample = [s for s in tree_specs if s.dtype == "bf16" and s.head_dim in (64, 128) and s.pack == 4
                  and s.kernel in expected]
        assert len(sample) == 2 * len(expected)
        for spec in sample:
            from dataclasses import replace

            tree = resource_usage(compile_spec(spec, use_cache=False, verbose=True).log)
            flat = resource_usage(compile_spec(replace(spec, tree=False), use_cache=False, verbose=True).log)
            assert not tree["wgmma_serialized"], spec
            assert tree["spill_stores"] <= max(flat["spill_stores"], 0) + 16, (spec, tree, flat)
            if spec.kernel in ("fwd_sm90", "fwd_sm90_ws", "bwd_dq_sm90"):
                assert tree["spill_stores"] == 0, (spec, tree)


def test_tree_specs_are_refused_where_they_do_not_exist():
    from dualkv.cuda.configs import DKDV_TILES, KernelSpec

    with pytest.raises(ValueError, match="prefix-tree specializations exist for the kernels"):
        KernelSpec("bwd_dkdv", 64, "bf16", DKDV_TILES[64], 1, False, "sm_80", tree=True)
    with pytest.raises(ValueError, match="prefix-tree specializations"):
        KernelSpec("fwd", 64, "bf16", FWD_TILES[64], 1, True, "sm_80", tree=True)
