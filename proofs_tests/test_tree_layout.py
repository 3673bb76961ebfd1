"""PrefixTreeLayout: offsets, logical positions, predictors, the kernel tables and the N-copy view; GroupLayout as
its depth-1 case; from_sequences builds the radix trie (every shared prefix once, sequences recoverable)."""

import random

import numpy as np
import pytest
import torch

from dualkv import GroupLayout, PrefixTreeLayout
from dualkv.tree import TreeIndex

#     0 (3)              5 (2)
#    /     \               |
#  1 (2)   4 (1)         6 (4)
#  /  \
# 2(1) 3(3)
FOREST = PrefixTreeLayout((3, 2, 1, 3, 1, 2, 4), (-1, 0, 1, 1, 0, -1, 5))


def random_forest(rng: random.Random, nodes: int, lens=(1, 2, 3, 7)) -> PrefixTreeLayout:
    parents = [-1] + [rng.choice([-1] + list(range(i))) if rng.random() < 0.15 else rng.randrange(i)
                      for i in range(1, nodes)]
    return PrefixTreeLayout([rng.choice(lens) for _ in range(nodes)], parents)


def test_offsets_positions_and_structure():
    t = FOREST
    assert t.total_tokens == 16
    assert t.node_starts == (0, 3, 5, 6, 9, 10, 12)
    assert t.node_positions == (0, 3, 5, 5, 3, 0, 2)
    assert t.path_lens == (3, 5, 6, 8, 4, 2, 6)
    assert t.roots == (0, 5) and t.leaves == (2, 3, 4, 6)
    assert t.children[1] == (2, 3) and t.depths == (0, 1, 2, 2, 1, 0, 1)
    assert t.ancestors(3) == (0, 1) and t.path(6) == (5, 6)
    assert t.max_depth == 2 and t.max_node_len == 4 and t.max_path_len == 8
    assert t.tokens_std == 6 + 8 + 4 + 6
    assert t.position_ids().tolist() == [0, 1, 2, 3, 4, 5, 5, 6, 7, 3, 0, 1, 2, 3, 4, 5]
    assert t.path_rows(3).tolist() == [0, 1, 2, 3, 4, 6, 7, 8]


def test_predictor_index():
    """A node's first token is predicted by its parent's last row, other tokens by the previous row; a root's first
    token by nothing (-1)."""
    assert FOREST.predictor_index.tolist() == [-1, 0, 1, 2, 3, 4, 4, 6, 7, 2, -1, 10, 11, 12, 13, 14]


def test_kernel_tables():
    t = FOREST
    np.testing.assert_array_equal(t.node_table, [[0, 3, 0, 0, 0], [3, 2, 3, 0, 1], [5, 1, 5, 1, 2],
                                                 [6, 3, 5, 3, 2], [9, 1, 3, 5, 1], [10, 2, 0, 6, 0],
                                                 [12, 4, 2, 6, 1]])
    np.testing.assert_array_equal(t.context_runs, [[0, 3], [0, 3], [3, 2], [0, 3], [3, 2], [0, 3], [10, 2]])
    assert t.node_table.dtype == np.int32 and t.context_runs.dtype == np.int32
    one_root = PrefixTreeLayout((5,), (-1,))
    assert one_root.context_runs.shape == (0, 2)
    dev = t.device_tensors("cpu")
    assert dev is t.device_tensors("cpu")
    assert dev["node_table"].dtype == torch.int32 and torch.equal(dev["position_ids"], t.position_ids())


def test_copy_view_round_trip():
    t = FOREST
    x = torch.arange(t.total_tokens)
    std = x[torch.from_numpy(t.copy_token_index)]
    assert std.shape[0] == t.tokens_std
    assert t.copy_cu_seqlens.tolist() == [0, 6, 14, 18, 24]
    assert std[6:14].tolist() == [0, 1, 2, 3, 4, 6, 7, 8]
    assert torch.equal(std[torch.from_numpy(t.first_copy_index)], x)


@pytest.mark.parametrize("prompts,responses", [([5], [[2, 1, 4]]), ([4, 1, 3], [[3, 1], [2], [1, 1, 6]])])
def test_group_layout_is_the_depth_one_tree(prompts, responses):
    group = GroupLayout.from_lengths(prompts, responses)
    tree = PrefixTreeLayout.from_group_layout(group)
    assert tree.max_depth == 1 and tree.total_tokens == group.total_tokens and tree.tokens_std == group.tokens_std
    assert torch.equal(tree.position_ids(), group.position_ids())
    for name in ("copy_token_index", "copy_cu_seqlens", "first_copy_index"):
        np.testing.assert_array_equal(getattr(tree, name), getattr(group, name))
    first = np.asarray(group.response_starts)
    expected = [group.last_prompt_index(g) for g in group.response_group]
    assert tree.predictor_index[first].tolist() == expected
    back = tree.to_group_layout()
    assert back.prompt_lens == group.prompt_lens and back.response_lens == group.response_lens


@pytest.mark.parametrize("lens,parents,match", [
    ((3, 2, 2), (-1, 0, 1), r"node 1 has children \(depth > 1\)"),
    ((3, 2), (-1, -1), "root 0 has no children"),
    ((3, 3, 2, 2), (-1, -1, 0, 1), "the children of root 0 are not packed right after it"),
])
def test_to_group_layout_refuses_other_trees(lens, parents, match):
    with pytest.raises(ValueError, match=match):
        PrefixTreeLayout(lens, parents).to_group_layout()


@pytest.mark.parametrize("lens,parents,err,match", [
    ((3, 2), (-1, 1), ValueError, r"parents\[1\] = 1: a node's parent must come before it"),
    ((3, 2), (-1, 5), ValueError, r"parents\[1\] = 5"),
    ((3, 2), (-2, 0), ValueError, r"parents\[0\] = -2"),
    ((3, 0), (-1, 0), ValueError, r"node_lens\[1\] = 0: every node needs >= 1 token"),
    ((3, 2), (-1,), ValueError, "node_lens has 2 nodes but parents has 1"),
    ((), (), ValueError, "at least one node"),
    ((3, 2.0), (-1, 0), TypeError, r"node_lens\[1\] must be an int"),
    ((3, True), (-1, 0), TypeError, r"node_lens\[1\] must be an int"),
    (torch.tensor([1.0]), (-1,), TypeError, "1-D integer sequence"),
    ("ab", (-1, 0), TypeError, "sequence of ints"),
])
def test_bad_layouts_are_refused_by_name(lens, parents, err, match):
    with pytest.raises(err, match=match):
        PrefixTreeLayout(lens, parents)


def test_tensor_and_numpy_inputs():
    a = PrefixTreeLayout(torch.tensor([2, 3]), np.array([-1, 0]))
    assert a.node_lens == (2, 3) and a.parents == (-1, 0) and type(a.node_lens[0]) is int


@pytest.mark.parametrize("seed", range(6))
def test_random_forest_invariants(seed):
    t = random_forest(random.Random(seed), 30)
    pos = t.position_ids().numpy()
    for i in range(t.num_nodes):
        a, b = t.node_range(i)
        assert pos[a:b].tolist() == list(range(t.node_positions[i], t.path_lens[i]))
        rows = t.path_rows(i)
        assert pos[rows].tolist() == list(range(t.path_lens[i]))        # a path is positions 0..L-1 in order
        first, count = t.node_table[i, 3:]
        runs = t.context_runs[first:first + count]
        assert [tuple(r) for r in runs] == [(t.node_starts[a], t.node_lens[a]) for a in t.ancestors(i)]
    pred = t.predictor_index
    assert all(pos[pred[x]] == pos[x] - 1 for x in range(t.total_tokens) if pred[x] >= 0)
    assert (pred < 0).sum() == len(t.roots)


# ---------------------------------------------------------------------------------------------- from_sequences
def _distinct_prefixes(seqs) -> int:
    return len({tuple(s[:n]) for s in seqs for n in range(1, len(s) + 1)})


def random_batch(rng: random.Random, vocab: int = 4) -> list[list[int]]:
    """Sequences with shared prefixes, duplicates, prefixes of one another and several first tokens."""
    seqs = []
    for _ in range(rng.randint(1, 9)):
        if seqs and rng.random() < 0.6:
            base = rng.choice(seqs)
            cut = rng.randint(0, len(base))
            seqs.append(base[:cut] + [rng.randrange(vocab) for _ in range(rng.randint(0 if cut else 1, 6))])
        else:
            seqs.append([rng.randrange(vocab) for _ in range(rng.randint(1, 8))])
    if rng.random() < 0.5:
        seqs.append(list(rng.choice(seqs)))                     # a duplicate
    return seqs


def check_index(seqs, layout: PrefixTreeLayout, index: TreeIndex) -> None:
    assert len(index) == len(seqs)
    for s, seq in enumerate(seqs):
        assert index.packed_ids[index[s]].tolist() == list(seq)
        rows = index[s].numpy()
        assert layout.position_ids()[index[s]].tolist() == list(range(len(seq)))
        assert layout.predictor_index[rows[0]] == -1                    # nothing predicts a sequence's first token
        assert layout.predictor_index[rows[1:]].tolist() == rows[:-1].tolist()   # token t from row of token t-1
    # every shared prefix once: one packed token per distinct prefix
    assert layout.total_tokens == _distinct_prefixes(seqs)
    # a radix trie: siblings start with different tokens; a node with one child is where a sequence ends
    ids = index.packed_ids.tolist()
    ends = set(index.end_nodes)
    for kids in (layout.roots, *layout.children):
        firsts = [ids[layout.node_starts[c]] for c in kids]
        assert len(set(firsts)) == len(firsts)
    for i, kids in enumerate(layout.children):
        assert len(kids) != 1 or i in ends, f"node {i} has one child and no sequence ends there: not compressed"
        assert kids or i in ends


@pytest.mark.parametrize("seed", range(40))
def test_from_sequences_random_batches(seed):
    seqs = random_batch(random.Random(seed))
    layout, index = PrefixTreeLayout.from_sequences(seqs)
    check_index(seqs, layout, index)
    assert index.sequences()[0].tolist() == seqs[0]


def test_from_sequences_handwritten():
    seqs = [[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2], [1, 2, 3, 4], [7, 8], [1, 9]]
    layout, index = PrefixTreeLayout.from_sequences(seqs)
    # [1] -> [2] -> [3] -> {[4], [5, 6]};  [1] -> [9];  [7, 8]: children in order of first appearance
    assert layout.node_lens == (1, 1, 1, 1, 2, 1, 2)
    assert layout.parents == (-1, 0, 1, 2, 2, 0, -1)
    assert index.packed_ids.tolist() == [1, 2, 3, 4, 5, 6, 9, 7, 8]
    assert index.end_nodes == (3, 4, 1, 3, 6, 5)                    # the duplicate ends where the original does
    check_index(seqs, layout, index)


def test_from_sequences_of_a_grouped_batch_is_the_group_layout():
    """Prompts with responses whose first tokens differ give exactly the GroupLayout packing."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 50, (n,), generator=gen) for n in (6, 3)]
    seqs, responses = [], [[4, 1, 2], [5, 3]]
    for g, lens in enumerate(responses):
        for i, r in enumerate(lens):
            head = torch.tensor([100 + i])                               # distinct first response tokens
            seqs.append(torch.cat([prompts[g], head, torch.randint(0, 50, (r - 1,), generator=gen)]))
    layout, index = PrefixTreeLayout.from_sequences(seqs)
    group = layout.to_group_layout()
    assert group.prompt_lens == (6, 3) and group.response_lens == ((4, 1, 2), (5, 3))
    check_index([s.tolist() for s in seqs], layout, index)


def test_targets_and_unpack():
    seqs = [[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2], [1, 2, 3, 4]]
    layout, index = PrefixTreeLayout.from_sequences(seqs)
    starts = [2, 2, 1, 3]
    tg = index.targets(starts)
    assert tg.rows.tolist() == sorted(set(tg.rows.tolist()))
    assert tg.cu_seqlens.tolist() == [0, 2, 5, 6, 7]
    assert index.targets([2, 2, 2, 4]).cu_seqlens.tolist() == [0, 2, 5, 5, 5]   # start = L: nothing scored
    per_seq = tg.split(tg.unpack(tg.rows))
    for s, seq in enumerate(seqs):
        assert per_seq[s].tolist() == index[s][starts[s]:].tolist()
        assert tg.split(tg.unpack(tg.target_ids))[s].tolist() == seq[starts[s]:]
        assert tg.split(tg.unpack(tg.predictor_index))[s].tolist() == index[s][starts[s] - 1:-1].tolist()
    # a token scored for two sequences is one row, read twice (so its gradient sums over both)
    x = torch.ones(tg.rows.shape[0], requires_grad=True)
    tg.unpack(x).sum().backward()
    assert x.grad.max() == 2
    assert index.targets().rows.shape[0] == layout.total_tokens - len(layout.roots)


@pytest.mark.parametrize("seqs,err,match", [
    ([], ValueError, "seqs is empty"),
    ([[1, 2], []], ValueError, r"seqs\[1\] is empty"),
    ([torch.tensor([1.0, 2.0])], TypeError, r"seqs\[0\] must be a 1-D integer tensor"),
    ([torch.zeros(2, 3, dtype=torch.long)], TypeError, r"seqs\[0\] must be a 1-D integer tensor"),
    ([[1, 2.5]], TypeError, r"seqs\[0\]\[1\] must be an int"),
    (torch.zeros(2, 3, dtype=torch.long), TypeError, "list of 1-D token sequences"),
    ("abc", TypeError, "sequence of token sequences"),
])
def test_from_sequences_refuses_bad_input(seqs, err, match):
    with pytest.raises(err, match=match):
        PrefixTreeLayout.from_sequences(seqs)


def test_targets_refuse_bad_starts():
    _, index = PrefixTreeLayout.from_sequences([[1, 2, 3], [1, 4]])
    with pytest.raises(ValueError, match=r"start\[1\] = 3: must be in \[1, 2\]"):
        index.targets([1, 3])
    with pytest.raises(ValueError, match=r"start\[0\] = 0"):
        index.targets(0)
    with pytest.raises(ValueError, match="start has 1 entries"):
        index.targets([1])
    with pytest.raises(ValueError, match="must have 3 rows"):
        index.targets().unpack(torch.zeros(2))
    with pytest.raises(ValueError, match="must have 3 rows .the scored tokens of every sequence"):
        index.targets().split(torch.zeros(2))


def test_large_batch_is_fast():
    """64 sequences of 8K tokens (2K system prompt, 8 prompts of 4K, 8 responses of 2K each) build in well under a
    second: the trie compares runs with numpy, not token by token in Python."""
    import time

    gen = torch.Generator().manual_seed(0)
    system = torch.randint(0, 1000, (2048,), generator=gen)
    seqs = []
    for _ in range(8):
        prompt = torch.randint(0, 1000, (4096,), generator=gen)
        for i in range(8):
            response = torch.cat([torch.tensor([1000 + i]), torch.randint(0, 1000, (2047,), generator=gen)])
            seqs.append(torch.cat([system, prompt, response]))
    start = time.perf_counter()
    layout, index = PrefixTreeLayout.from_sequences(seqs)
    elapsed = time.perf_counter() - start
    assert layout.num_nodes == 1 + 8 + 64 and layout.total_tokens == 2048 + 8 * 4096 + 64 * 2048
    assert layout.tokens_std == 64 * 8192
    assert torch.equal(index.packed_ids[index[37]], seqs[37])
    assert elapsed < 2.0, f"from_sequences took {elapsed:.2f} s"


def test_unordered_node_lengths_and_parents_are_refused():
    """Nodes are read in order: a set (equal lengths merge, no order) or a dict (its keys) is refused by name."""
    import pytest

    from dualkv import PrefixTreeLayout

    with pytest.raises(TypeError, match="node_lens is a set"):
        PrefixTreeLayout({4, 2, 2}, (-1, 0, 0))
    with pytest.raises(TypeError, match="parents is a dict"):
        PrefixTreeLayout((4, 2, 2), {-1: 0, 0: 1, 1: 2})
    assert PrefixTreeLayout((4, 2, 2), (-1, 0, 0)).node_lens == (4, 2, 2)
