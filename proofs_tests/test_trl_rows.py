"""TRL rows -> prompt groups, packable chunks and the group-preserving shuffle (TRL only for its own shuffle and
split, the references)."""

from __future__ import annotations

import pytest
import torch

from dualkv.integration.trl.rows import group_rows, group_shuffle, group_shuffle_order, plan_chunks


def _batch(rows, prompt_width=5, completion_width=4):
    """rows: (prompt tokens, completion length); returns TRL-style (B, L) ids and mask (left/right padded)."""
    ids = torch.zeros(len(rows), prompt_width + completion_width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, (prompt, r) in enumerate(rows):
        ids[b, prompt_width - len(prompt):prompt_width] = torch.tensor(prompt)
        mask[b, prompt_width - len(prompt):prompt_width] = 1
        ids[b, prompt_width:prompt_width + r] = torch.arange(r) + 10 * b + 20
        mask[b, prompt_width:prompt_width + r] = 1
    return ids, mask


def test_group_rows_groups_by_prompt_tokens_and_drops_empty_completions():
    a, b = [3, 4, 5], [3, 4]
    ids, mask = _batch([(a, 2), (b, 1), (a, 3), (a, 0), (b, 4), ([7], 2)])
    groups = group_rows(mask, ids, 5)
    assert groups.groups == ((0, 2), (1, 4), (5,))          # row 3 (a, empty) is in no group
    assert groups.prompt_lens == (3, 2, 1)
    assert groups.completion_lens == (2, 1, 3, 0, 4, 2)
    assert groups.empty_rows == (3,)
    # a prefix is not the same prompt: [3, 4] and [3, 4, 5] are separate groups
    ids, mask = _batch([(a, 1), (b, 1)])
    assert group_rows(mask, ids, 5).groups == ((0,), (1,))


def test_group_rows_refuses_bad_shapes():
    ids, mask = _batch([([3], 1)])
    with pytest.raises(ValueError, match="one shape"):
        group_rows(mask[:, :-1], ids, 5)
    with pytest.raises(ValueError, match="prompt width"):
        group_rows(mask, ids, 9)


def test_plan_chunks_whole_groups_within_budget():
    ids, mask = _batch([([3, 4], 4), ([3, 4], 4), ([5], 3), ([5], 3), ([6, 7, 8], 2)])
    groups = group_rows(mask, ids, 5)          # tokens per group: 2+8=10, 1+6=7, 3+2=5
    assert plan_chunks(groups, None) == [[(0, 1), (2, 3), (4,)]]
    assert plan_chunks(groups, 17) == [[(0, 1), (2, 3)], [(4,)]]
    assert plan_chunks(groups, 12) == [[(0, 1)], [(2, 3), (4,)]]
    # a group over budget is cut into sub-groups, each with its own prompt (2+4 = 6, 1+3 = 4 tokens each)
    assert plan_chunks(groups, 6) == [[(0,)], [(1,)], [(2,)], [(3,)], [(4,)]]
    assert plan_chunks(groups, 9) == [[(0,)], [(1,)], [(2, 3)], [(4,)]]
    for budget in (6, 7, 12, 17, 100):
        chunks = plan_chunks(groups, budget)
        assert sorted(r for chunk in chunks for g in chunk for r in g) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="budget"):
        plan_chunks(groups, 0)


def _generation_batch(num_prompts=6, n=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 60, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(num_prompts)]
    ids, mask = _batch([(p, 2) for p in prompts for _ in range(n)])
    return {"prompt_ids": ids[:, :5], "prompt_mask": mask[:, :5], "completion_ids": ids[:, 5:],
            "advantages": torch.arange(len(ids), dtype=torch.float32), "num_items_in_batch": torch.tensor(7),
            "tags": [f"row{i}" for i in range(len(ids))], "old_per_token_logps": None}


def test_group_shuffle_keeps_groups_whole_and_permutes_all_keys_alike():
    split_tensor_dict = pytest.importorskip("trl.trainer.utils").split_tensor_dict

    batch = _generation_batch()
    torch.manual_seed(3)
    out = group_shuffle(batch)
    order = out["advantages"].long()
    assert sorted(order.tolist()) == list(range(24))
    assert out["tags"] == [f"row{i}" for i in order.tolist()]
    assert torch.equal(out["prompt_ids"], batch["prompt_ids"][order])
    assert out["num_items_in_batch"] is batch["num_items_in_batch"] and out["old_per_token_logps"] is None
    assert order.tolist() != list(range(24))          # groups were reordered
    # split into steps_per_generation = 3 micro-batches of 8 rows (2 groups of 4): every group whole
    for part in split_tensor_dict(out, 3):
        groups = {}
        for row in part["advantages"].long().tolist():
            groups.setdefault(row // 4, []).append(row)
        assert all(len(rows) == 4 for rows in groups.values())


def test_group_shuffle_draws_the_same_random_numbers_as_trl_shuffle():
    shuffle_sequence_dict = pytest.importorskip("trl.trainer.utils").shuffle_sequence_dict

    batch = _generation_batch(seed=1)
    torch.manual_seed(11)
    shuffle_sequence_dict(batch)
    after_stock = torch.rand(4)
    torch.manual_seed(11)
    group_shuffle(batch)
    assert torch.equal(torch.rand(4), after_stock)


def test_stock_row_shuffle_splits_groups_known_wrong_for_sharing():
    """TRL's own shuffle is what group_shuffle replaces: with the same seed it scatters groups over micro-batches."""
    utils = pytest.importorskip("trl.trainer.utils")
    shuffle_sequence_dict, split_tensor_dict = utils.shuffle_sequence_dict, utils.split_tensor_dict

    torch.manual_seed(3)
    out = shuffle_sequence_dict(_generation_batch())
    sizes = [len({r // 4 for r in part["advantages"].long().tolist()}) for part in split_tensor_dict(out, 3)]
    assert max(sizes) > 2          # some micro-batch holds pieces of more than 2 groups


def test_group_shuffle_order_groups_identical_prompts_together():
    ids = torch.tensor([[0, 5], [0, 6], [0, 5], [7, 5]])
    mask = torch.tensor([[0, 1], [0, 1], [0, 1], [1, 1]])
    for seed in range(5):
        torch.manual_seed(seed)
        order = group_shuffle_order(ids, mask).tolist()
        assert abs(order.index(0) - order.index(2)) == 1 and order.index(0) < order.index(2)
    with pytest.raises(KeyError, match="prompt_mask"):
        group_shuffle({"prompt_ids": ids})


def test_autocast_packed_attention_casts_like_stock_under_autocast(monkeypatch):
    """fp32 q/k next to bf16 v (a Qwen3 layer with fp32 weights under bf16 autocast) reach the packed attention in
    the autocast dtype; without autocast nothing is cast."""
    from dualkv import GroupLayout
    from dualkv.integration.trl import attention

    seen = []
    monkeypatch.setattr(attention, "shared_prefix_attention",
                        lambda q, k, v, layout, **kw: seen.append((q.dtype, k.dtype, v.dtype)) or q)
    layout = GroupLayout.single(2, [1])
    q, k = torch.randn(3, 2, 4), torch.randn(3, 1, 4)
    v = k.to(torch.bfloat16)
    attention.autocast_packed_attention(q, k, v, layout, softmax_scale=0.5, window_size=(-1, -1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attention.autocast_packed_attention(q, k, v, layout, softmax_scale=0.5, window_size=(-1, -1))
    assert seen == [(torch.float32, torch.float32, torch.bfloat16), (torch.bfloat16,) * 3]
