"""P+ΣR packing of padded and varlen rows, the maps back, and the refusals."""

import pytest
import torch

from dualkv.integration.packing import pack_padded, pack_varlen, split_token_values, unpack_token_values

PAD = 0


def _padded(rows, prompt_width, response_width):
    """rows: list of (prompt, response) lists -> (input_ids, attention_mask), prompts left-, responses right-padded."""
    ids, mask = [], []
    for prompt, response in rows:
        lp, lr = len(prompt), len(response)
        ids.append([PAD] * (prompt_width - lp) + prompt + response + [PAD] * (response_width - lr))
        mask.append([0] * (prompt_width - lp) + [1] * (lp + lr) + [0] * (response_width - lr))
    return torch.tensor(ids), torch.tensor(mask)


ROWS = [([5, 6, 7], [11, 12]), ([5, 6, 7], [13]), ([5, 6, 7], [14, 15, 16]), ([8, 9], [17, 18])]
GROUPS = ["a", "a", "a", "b"]


def test_pack_padded_layout_and_ids():
    ids, mask = _padded(ROWS, 4, 3)
    packed = pack_padded(ids, mask, 4, GROUPS)
    assert packed.input_ids.tolist() == [5, 6, 7, 11, 12, 13, 14, 15, 16, 8, 9, 17, 18]
    assert packed.position_ids.tolist() == [0, 1, 2, 3, 4, 3, 3, 4, 5, 0, 1, 2, 3]
    assert packed.layout.prompt_lens == (3, 2)
    assert packed.layout.response_lens == ((2, 1, 3), (2,))
    assert packed.response_ids.tolist() == [11, 12, 13, 14, 15, 16, 17, 18]
    # First response token of every row is predicted from its group's last prompt row (index 2 or 10).
    assert packed.predictor_index.tolist() == [2, 3, 2, 2, 6, 7, 10, 11]
    assert packed.group_ids == ("a", "b")


def test_pack_varlen_matches_pack_padded():
    ids, mask = _padded(ROWS, 4, 3)
    a = pack_padded(ids, mask, 4, GROUPS)
    flat = torch.tensor([t for p, r in ROWS for t in p + r])
    cu = torch.tensor([0, 5, 9, 15, 19])
    b = pack_varlen(flat, cu, [3, 3, 3, 2], GROUPS)
    for name in ("input_ids", "position_ids", "response_ids", "predictor_index", "response_cu_seqlens"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_n_copy_round_trip():
    ids, mask = _padded(ROWS, 4, 3)
    packed = pack_padded(ids, mask, 4, GROUPS)
    std_ids, std_pos, cu = packed.n_copy_input_ids()
    rows = [std_ids[a:b].tolist() for a, b in zip(cu.tolist(), cu[1:].tolist())]
    assert rows == [p + r for p, r in ROWS]
    assert std_pos[cu[1]:cu[2]].tolist() == [0, 1, 2, 3]


def test_unpack_token_values_to_padded_rows():
    ids, mask = _padded(ROWS, 4, 3)
    packed = pack_padded(ids, mask, 4, GROUPS)
    values = torch.arange(1.0, 9.0)
    out = unpack_token_values(values, packed, pad_value=-1.0)
    assert out.tolist() == [[1, 2, -1], [3, -1, -1], [4, 5, 6], [7, 8, -1]]
    assert [t.tolist() for t in split_token_values(values, packed)] == [[1, 2], [3], [4, 5, 6], [7, 8]]
    two = unpack_token_values(torch.stack([values, -values], 1), packed)
    assert two.shape == (4, 3, 2)
    with pytest.raises(ValueError, match="must have 8 rows"):
        unpack_token_values(values[:5], packed)


def test_uid_strings_and_tensor_ids():
    ids, mask = _padded(ROWS, 4, 3)
    packed = pack_padded(ids, mask, 4, torch.tensor([7, 7, 7, 9]))
    assert packed.group_ids == (7, 9)


@pytest.mark.parametrize("rows,groups,match", [
    ([([5, 6], [1]), ([5, 7], [2])], ["a", "a"], "rows 0 and 1 share group id 'a' but their prompts differ"),
    ([([5, 6], [1]), ([6], [2])], ["a", "a"], "prompts differ \\(2 vs 1 tokens\\)"),
    ([([5], [1]), ([6], [2]), ([5], [3])], ["a", "b", "a"], "rows of group 'a' are not adjacent"),
    ([([5], []), ([5], [2])], ["a", "a"], "row 0 \\(group 'a'\\) has an empty response"),
    ([([], [1])], ["a"], "row 0 \\(group 'a'\\) has an empty prompt"),
])
def test_refusals(rows, groups, match):
    ids, mask = _padded(rows, 2, 1)
    with pytest.raises(ValueError, match=match):
        pack_padded(ids, mask, 2, groups)


def test_refuses_bad_padding_and_shapes():
    ids, mask = _padded(ROWS, 4, 3)
    bad = mask.clone()
    bad[0, :4] = torch.tensor([1, 0, 1, 1])  # a hole in row 0's left padding
    with pytest.raises(ValueError, match="row 0: the prompt part of attention_mask is not left-padded"):
        pack_padded(ids, bad, 4, GROUPS)
    bad = mask.clone()
    bad[1, 4:] = torch.tensor([0, 1, 0])
    with pytest.raises(ValueError, match="row 1: the response part of attention_mask is not right-padded"):
        pack_padded(ids, bad, 4, GROUPS)
    with pytest.raises(ValueError, match="group_ids has 3 entries"):
        pack_padded(ids, mask, 4, GROUPS[:3])
    with pytest.raises(ValueError, match="attention_mask must have"):
        pack_padded(ids, mask[:, :5], 4, GROUPS)
    with pytest.raises(ValueError, match="prompt_width"):
        pack_padded(ids, mask, 7, GROUPS)
    with pytest.raises(TypeError, match="integer token ids"):
        pack_padded(ids.float(), mask, 4, GROUPS)
    with pytest.raises(ValueError, match="only 0 and 1"):
        pack_padded(ids, mask * 2, 4, GROUPS)
    for bad_mask in (mask.long() * 256, mask.long() * 257, mask.float() * 0.5):  # values a cast to int8 hides
        with pytest.raises(ValueError, match="only 0 and 1"):
            pack_padded(ids, bad_mask, 4, GROUPS)
    with pytest.raises(ValueError, match="prompt_lens\\[0\\] = 2.9 must be a whole number"):
        pack_varlen(torch.arange(6), torch.tensor([0, 3, 6]), [2.9, 2.9], ["a", "a"])
    with pytest.raises(TypeError, match="prompt_lens must hold integers"):
        pack_varlen(torch.arange(6), torch.tensor([0, 3, 6]), torch.tensor([2.0, 2.0]), ["a", "a"])
    with pytest.raises(ValueError, match="cu_seqlens\\[0\\] = 1"):
        pack_varlen(torch.arange(6), torch.tensor([1, 3, 6]), [1, 1], ["a", "a"])
    with pytest.raises(ValueError, match="prompt_lens\\[1\\] = 4 but the row has 3 tokens"):
        pack_varlen(torch.arange(6), torch.tensor([0, 3, 6]), [1, 4], ["a", "b"])
