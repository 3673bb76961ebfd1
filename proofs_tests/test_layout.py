import numpy as np
import pytest
import torch

from dualkv import GroupLayout


def test_offsets_and_counts():
    layout = GroupLayout.from_lengths([5, 3], [[2, 1, 4], [6]])
    assert layout.total_tokens == 5 + 7 + 3 + 6
    assert layout.tokens_std == 3 * 5 + 7 + 3 + 6
    assert layout.group_starts == (0, 12)
    assert layout.response_starts == (5, 7, 8, 15)
    assert layout.responses_range(0) == (5, 12)
    assert layout.response_range(1, 0) == (15, 21)
    assert layout.last_prompt_index(1) == 14
    assert layout.response_cu_seqlens(0) == [0, 2, 3, 7]
    np.testing.assert_array_equal(layout.segment_table, [[0, 5, 0, 0], [12, 3, 12, 0], [5, 2, 0, 5], [7, 1, 0, 5],
                                                         [8, 4, 0, 5], [15, 6, 12, 3]])
    assert layout.segment_table.dtype == np.int32


def test_position_ids():
    layout = GroupLayout.from_lengths([3, 2], [[2, 1], [1]])
    assert layout.position_ids().tolist() == [0, 1, 2, 3, 4, 3, 0, 1, 2]


def test_copy_index_round_trip():
    layout = GroupLayout.from_lengths([4, 2], [[3, 1], [2, 2]])
    x = torch.arange(layout.total_tokens)
    std = x[torch.from_numpy(layout.copy_token_index)]
    assert std.shape[0] == layout.tokens_std
    assert std[:7].tolist() == [0, 1, 2, 3, 4, 5, 6]          # row 0: prompt + response 0
    assert std[7:12].tolist() == [0, 1, 2, 3, 7]               # row 1: the prompt again + response 1
    assert torch.equal(std[torch.from_numpy(layout.first_copy_index)], x)
    assert layout.copy_cu_seqlens.tolist() == [0, 7, 12, 16, 20]


def test_device_tensors_are_cached():
    layout = GroupLayout.single(7, [3, 4])
    a = layout.device_tensors("cpu")
    assert a is layout.device_tensors("cpu")
    assert a["segment_table"].dtype == torch.int32


@pytest.mark.parametrize("prompts,responses,match", [
    ([0], [[1]], "prompt_lens\\[0\\] = 0"),
    ([3], [[2, 0]], "response_lens\\[0\\]\\[1\\] = 0"),
    ([3], [[]], "group 0 has no responses"),
    ([3, 4], [[1]], "2 groups but response_lens has 1"),
    ([], [], "at least one group"),
    ([2.5], [[1]], "must be an int"),
])
def test_bad_lengths(prompts, responses, match):
    with pytest.raises((ValueError, TypeError), match=match):
        GroupLayout.from_lengths(prompts, responses)


@pytest.mark.parametrize("build,match", [
    (lambda: GroupLayout((5,), ({3, 2},)), "response_lens\\[0\\] is a set"),
    (lambda: GroupLayout.single(5, {3, 3}), "response_lens\\[0\\] is a set"),
    (lambda: GroupLayout.from_lengths([5], [{4, 2}]), "response_lens\\[0\\] is a set"),
    (lambda: GroupLayout.from_lengths({5, 6}, [[1], [2]]), "prompt_lens is a set"),
    (lambda: GroupLayout((5,), (frozenset({3, 2}),)), "response_lens\\[0\\] is a frozenset"),
    (lambda: GroupLayout((5,), ({3: 1},)), "response_lens\\[0\\] is a dict"),
    (lambda: GroupLayout((5, 6), {(1,), (2,)}), "response_lens is a set"),
])
def test_unordered_lengths_are_refused(build, match):
    """A set has no order and merges equal lengths ({3, 3} is one response), a dict iterates its keys: either would
    pack the rows silently in another order or drop some, so both are refused by name."""
    with pytest.raises(TypeError, match=match):
        build()


def test_ordered_iterables_of_lengths_still_work():
    layout = GroupLayout.from_lengths(np.array([5, 2]), (lens for lens in (range(1, 3), (n for n in (4,)))))
    assert layout.prompt_lens == (5, 2) and layout.response_lens == ((1, 2), (4,))
    assert GroupLayout.single(3, {7: None, 1: None}.keys()).response_lens == ((7, 1),)


def test_layouts_compare_by_identity_and_by_lengths():
    """Layouts are compared by identity (each holds its own device cache); ``lengths`` compares the micro-batch shape."""
    a = GroupLayout.from_lengths([4, 2], [[3, 1], [2]])
    b = GroupLayout.from_lengths([4, 2], [[3, 1], [2]])
    assert a != b and a == a and len({a, b}) == 2
    assert a.lengths == b.lengths == ((4, 2), ((3, 1), (2,)))
    assert a.lengths != GroupLayout.from_lengths([4, 2], [[3, 1], [1]]).lengths
