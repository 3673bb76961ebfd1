"""veRL integration, the parts that need no engine: packing checks, the head plan under SP, group-preserving
micro-batches and DP balancing (each with a known-wrong variant that must be caught), K/V head repetition, the
post-import hook and the version gate."""

from __future__ import annotations

import random
import sys

import pytest
import torch

pytest.importorskip("verl")

from dualkv.integration.packing import pack_varlen  # noqa: E402
from dualkv.integration.verl import DualKVBatchError, check_verl_version, UnsupportedVerlError  # noqa: E402
from dualkv.integration.verl._hooks import when_imported  # noqa: E402
from dualkv.integration.verl.balance import (group_balanced_partitions, partition_problems,  # noqa: E402
                                             split_groups)
from dualkv.integration.verl.head import HeadPlan  # noqa: E402
from dualkv.integration.verl.micro_batches import group_units, plan_micro_batches  # noqa: E402
from dualkv.integration.verl.rows import pack_rows, prompt_lengths, to_nested_rows  # noqa: E402
from dualkv.integration.verl.sequence_parallel import repeat_kv_heads_for_sp  # noqa: E402


def _kk(loads, k, equal):
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

    return get_seqlen_balanced_partitions(loads, k, equal_size=equal)


def _nested_rows(groups, seed=0):
    """Nested input/position ids of rows [prompt_g; response], plus prompt lengths and uids."""
    g = torch.Generator().manual_seed(seed)
    rows, pos, plens, uids = [], [], [], []
    for gi, (p, rs) in enumerate(groups):
        prompt = torch.randint(3, 50, (p,), generator=g)
        for r in rs:
            rows.append(torch.cat([prompt, torch.randint(3, 50, (r,), generator=g)]))
            pos.append(torch.arange(p + r))
            plens.append(p)
            uids.append(f"u{gi}")
    nest = lambda ts: torch.nested.as_nested_tensor(ts, layout=torch.jagged)  # noqa: E731
    return nest(rows), nest(pos), plens, uids


# ---------------------------------------------------------------------------------------------- rows
def test_pack_rows_round_trip_to_verl_layout():
    ids, pos, plens, uids = _nested_rows([(5, [2, 3]), (3, [4])])
    packed = pack_rows(ids, pos, plens, uids)
    assert packed.layout.prompt_lens == (5, 3) and packed.layout.response_lens == ((2, 3), (4,))
    values = torch.arange(1, packed.layout.total_response_tokens + 1, dtype=torch.float32)
    nested = to_nested_rows(values, packed, ids.offsets())
    flat = nested.values()
    # row b's response token k sits at offset P_b - 1 + k of its row (no_padding_2_padding reads it there)
    off = ids.offsets().tolist()
    assert flat[off[0] + 4: off[0] + 6].tolist() == [1, 2]
    assert flat[off[1] + 4: off[1] + 7].tolist() == [3, 4, 5]
    assert flat[off[2] + 2: off[2] + 6].tolist() == [6, 7, 8, 9]
    assert float(flat.sum()) == float(values.sum())


def test_empty_responses_pack_with_a_placeholder_and_come_back_empty():
    """R = 0 rows (stock veRL accepts them): packed with one placeholder token at position P, whose value is
    zeroed, dropped from the row layout and gets a zero gradient; a whole group of them still packs its prompt."""
    ids, pos, plens, uids = _nested_rows([(5, [2, 0, 3]), (3, [0, 0])])
    packed = pack_rows(ids, pos, plens, uids)
    assert packed.layout.response_lens == ((2, 1, 3), (1, 1))
    assert packed.input_ids[7].item() == ids.values()[ids.offsets()[1] + 4].item()     # last prompt token again
    assert packed.position_ids[7].item() == 5
    values = torch.arange(1, packed.layout.total_response_tokens + 1, dtype=torch.float32, requires_grad=True)
    nested = to_nested_rows(values, packed, ids.offsets())
    assert torch.equal(nested.offsets(), ids.offsets())
    flat, off = nested.values(), ids.offsets().tolist()
    assert flat[off[0] + 4: off[0] + 6].tolist() == [1, 2]
    assert flat[off[2] + 4: off[2] + 7].tolist() == [4, 5, 6]
    assert not flat[off[1]:off[2]].detach().any() and not flat[off[3]:].detach().any()
    flat.sum().backward()
    assert values.grad.tolist() == [1, 1, 0, 1, 1, 1, 0, 0]


@pytest.mark.parametrize("case, message", [
    ("split", "not adjacent"), ("prompts", "prompts differ.*dualkv_packing=trie"), ("positions", "position_ids"),
    ("uid_count", "'uid' has"), ("no_prompt", "non-empty prompt"),
])
def test_pack_rows_refuses_what_would_be_wrong(case, message):
    ids, pos, plens, uids = _nested_rows([(5, [2, 3]), (4, [2, 2])])
    if case == "split":
        uids = ["u0", "u1", "u0", "u1"]
    elif case == "prompts":
        uids = ["u0"] * 4
    elif case == "positions":
        pos = torch.nested.as_nested_tensor([p + 1 for p in pos.unbind()], layout=torch.jagged)
    elif case == "uid_count":
        from dualkv.integration.verl.rows import group_ids_of

        with pytest.raises(DualKVBatchError, match=message):
            group_ids_of(uids[:3], 4)
        return
    elif case == "no_prompt":
        plens = [5, 5, 0, 0]
    with pytest.raises(DualKVBatchError, match=message):
        pack_rows(ids, pos, plens, uids)


def test_prompt_lengths_dense_and_nested():
    prompts = torch.tensor([[0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    assert prompt_lengths(prompts, mask) == [2, 3]
    nested = torch.nested.as_nested_tensor([torch.tensor([5, 6]), torch.tensor([7, 8, 9])], layout=torch.jagged)
    assert prompt_lengths(nested, None) == [2, 3]
    with pytest.raises(DualKVBatchError):
        prompt_lengths(prompts, None)


# ---------------------------------------------------------------------------------------------- head plan
@pytest.mark.parametrize("sp", [1, 2, 3, 4])
def test_head_plan_covers_every_response_token_once(sp):
    ids, pos, plens, uids = _nested_rows([(6, [2, 5, 1]), (3, [4, 3])])
    packed = pack_varlen(ids.values(), ids.offsets(), plens, uids)
    total = packed.layout.total_tokens
    part = -(-total // sp)
    plans = [HeadPlan.build(packed, rank=r, part=part) for r in range(sp)]
    predictor = packed.predictor_index
    first = packed.response_cu_seqlens[:-1]
    seen = torch.cat([p.shifted_slots for p in plans] + [plans[0].first_slots])
    assert sorted(seen.tolist()) == list(range(packed.layout.total_response_tokens))
    for r, plan in enumerate(plans):
        assert torch.equal(predictor[plan.shifted_slots], plan.shifted_rows + r * part)
        assert torch.equal(plan.first_slots, first)
        assert torch.equal(plan.shifted_targets, packed.response_ids[plan.shifted_slots])
    # each group's shared row is owned by exactly one rank (seed Eq. 9)
    owned = torch.cat([p.owned_groups for p in plans]).sort().values
    assert owned.tolist() == list(range(packed.layout.num_groups))


# ---------------------------------------------------------------------------------------------- micro-batches
def _row_lens(groups):
    uids, plens, rlens = [], [], []
    for gi, (p, rs) in enumerate(groups):
        for r in rs:
            uids.append(gi)
            plens.append(p)
            rlens.append(r)
    return uids, plens, rlens


def test_dynamic_micro_batches_keep_groups_and_count_shared_tokens():
    rng = random.Random(0)
    groups = [(rng.randint(20, 60), [rng.randint(1, 12) for _ in range(rng.randint(2, 6))]) for _ in range(12)]
    uids, plens, rlens = _row_lens(groups)
    budget = 120
    batches = plan_micro_batches(uids, plens, rlens, budget, partition=lambda w, k: _kk(w, k, False))
    assert sorted(r for b in batches for r in b) == list(range(len(uids)))
    gain = False
    for b in batches:
        members = {uids[r] for r in b}
        for g in members:   # whole groups only (every group fits the budget here)
            assert sum(1 for r in b if uids[r] == g) == len(groups[g][1])
        shared = sum(groups[g][0] + sum(groups[g][1]) for g in members)
        ncopy = sum(plens[r] + rlens[r] for r in b)
        assert shared <= budget
        gain |= ncopy > budget
        assert partition_problems([uids[r] for r in b], [list(range(len(b)))]) == []   # groups adjacent
    assert gain, "no micro-batch holds more N-copy tokens than the budget: P+ΣR counting is not exercised"


def test_veRL_row_balancing_splits_groups_and_is_caught():
    """Known-wrong variant: veRL's own row-level partition (what dynamic batch size does without dualkv)."""
    groups = [(30, [5, 9, 2, 7]), (10, [3, 3, 3, 3]), (44, [1, 8, 2, 6])]
    uids, plens, rlens = _row_lens(groups)
    rows = _kk([p + r for p, r in zip(plens, rlens)], 3, False)
    assert split_groups(uids, rows) != []
    ours = plan_micro_batches(uids, plens, rlens, 70, partition=lambda w, k: _kk(w, k, False))
    assert len(ours) > 1 and split_groups(uids, ours) == []


def test_oversize_group_is_cut_into_consecutive_units():
    units = group_units(["a"] * 5, [10] * 5, [6, 6, 6, 6, 6], max_tokens=25)
    assert [u.rows for u in units] == [(0, 1), (2, 3), (4,)]
    assert all(u.tokens <= 25 for u in units)
    with pytest.raises(ValueError, match="alone has"):
        group_units(["a"], [30], [1], max_tokens=25)


def test_micro_batch_count_is_agreed_and_units_split_to_reach_it():
    uids, plens, rlens = _row_lens([(5, [1, 1, 1, 1])])
    batches = plan_micro_batches(uids, plens, rlens, 100, partition=lambda w, k: _kk(w, k, False),
                                 agree_count=lambda k: 3)
    assert len(batches) == 3 and sorted(r for b in batches for r in b) == [0, 1, 2, 3]
    assert all(b == list(range(b[0], b[-1] + 1)) for b in batches)


def test_dynamic_micro_batches_regroup_scattered_rows():
    """Rows of a group that arrive apart (e.g. after a row shuffle) are listed together in their micro-batch."""
    uids, plens, rlens = ["a", "b", "a", "b", "a"], [5, 7, 5, 7, 5], [1, 2, 3, 4, 5]
    batches = plan_micro_batches(uids, plens, rlens, 100, partition=lambda w, k: _kk(w, k, False))
    assert batches == [[0, 2, 4, 1, 3]]


# ---------------------------------------------------------------------------------------------- DP balancing
def test_group_balancing_equal_groups_keeps_every_group_on_one_rank():
    rng = random.Random(1)
    groups = [(rng.randint(5, 80), [rng.randint(1, 40) for _ in range(4)]) for _ in range(16)]
    uids, plens, rlens = _row_lens(groups)
    parts = group_balanced_partitions(uids, plens, rlens, 4, equal_partition=lambda w, k: _kk(w, k, True))
    assert partition_problems(uids, parts) == [] and split_groups(uids, parts) == []
    loads = [sum(groups[g][0] + sum(groups[g][1]) for g in {uids[r] for r in part}) for part in parts]
    assert max(loads) < 2 * min(loads)


def test_group_balancing_padded_and_short_groups():
    groups = [(20, [3] * 4), (7, [2] * 3), (9, [5] * 4), (15, [1] * 2), (4, [2] * 5), (30, [1])]  # 19 rows
    uids, plens, rlens = _row_lens(groups)
    uids, plens, rlens = uids + ["pad"] * 5, plens + [1] * 5, rlens + [1] * 5     # veRL's synthetic padding
    parts = group_balanced_partitions(uids, plens, rlens, 4, equal_partition=lambda w, k: _kk(w, k, True))
    assert partition_problems(uids, parts) == []
    assert len(split_groups(uids, parts)) <= 3        # at most k - 1 groups cut where sizes force it


def test_stock_row_balancing_is_caught():
    """Known-wrong variant: veRL's length-sorted row partition scatters groups over ranks."""
    groups = [(20, [3, 9, 4, 1]), (7, [2, 8, 2, 5]), (9, [5, 1, 7, 3]), (15, [1, 6, 2, 2])]
    uids, plens, rlens = _row_lens(groups)
    rows = _kk([p + r for p, r in zip(plens, rlens)], 2, True)
    assert split_groups(uids, rows) != []
    interleaved = [sorted(part, key=lambda i: (rlens[i], i)) for part in rows]
    assert partition_problems(uids, interleaved) != [] or split_groups(uids, interleaved) != []


def test_group_balancing_rejects_unequal_split():
    with pytest.raises(ValueError, match="equal DP partitions"):
        group_balanced_partitions([0, 0, 1], [1, 1, 1], [1, 1, 1], 2)


# ---------------------------------------------------------------------------------------------- misc
def test_repeat_kv_heads_keeps_gqa_mapping():
    k = torch.arange(2).view(1, 2, 1).float().expand(3, 2, 4)
    k4, _ = repeat_kv_heads_for_sp(k, k, 4)
    assert k4.shape[1] == 4
    heads, sp = 8, 4   # query head h uses kv head h // (H / H_k) before and after the repeat
    for h in range(heads):
        assert int(k4[0, h // (heads // 4), 0]) == h // (heads // 2)
    with pytest.raises(ValueError, match="cannot be split"):
        repeat_kv_heads_for_sp(torch.zeros(1, 3, 1), torch.zeros(1, 3, 1), 2)


def test_when_imported_runs_after_import_and_now():
    name = "dualkv_test_hooked_module"
    calls = []
    when_imported(name, lambda m: calls.append(m.VALUE))
    import importlib.util

    class _Loader:
        def create_module(self, spec):
            return None

        def exec_module(self, m):
            m.VALUE = 7

    class _Finder:
        def find_spec(self, fullname, path, target=None):
            return importlib.util.spec_from_loader(fullname, _Loader()) if fullname == name else None

    finder = _Finder()
    sys.meta_path.append(finder)
    try:
        importlib.import_module(name)
    finally:
        sys.meta_path.remove(finder)
    assert calls == [7]
    when_imported(name, lambda m: calls.append(m.VALUE + 1))
    assert calls == [7, 8]
    sys.modules.pop(name, None)


@pytest.mark.parametrize("version", ["0.7.1", "0.8.3", "0.10.0", "1.0", "garbage!", "0.10.0rc1", "0.10.0.dev0",
                                     "0.9.1rc1"])
def test_version_gate_refuses_other_releases(version):
    with pytest.raises(UnsupportedVerlError, match=r"verl>=0\.9\.1,<0\.10"):
        check_verl_version(version)
    assert str(check_verl_version("0.9.1")) == "0.9.1"


def test_planning_an_empty_batch_is_refused_by_name():
    with pytest.raises(ValueError, match="no rows to plan micro-batches for"):
        plan_micro_batches([], [], [], 100, partition=lambda w, k: _kk(w, k, False))


def test_micro_batches_that_split_groups_are_noted_once(recwarn):
    """Fixed micro-batch sizes that are not a multiple of rollout.n split prompt groups (exact, little shared): the
    trainer's balancing warns once per setting, as TRL's integration does; string switches read like bools."""
    from omegaconf import OmegaConf

    from dualkv.integration.verl import trainers

    def config(actor_mb=8, ref_mb=8, switch=True, dynamic=False, n=4):
        return OmegaConf.create({"actor_rollout_ref": {
            "actor": {"use_dualkv": switch, "ppo_micro_batch_size_per_gpu": actor_mb, "use_dynamic_bsz": dynamic},
            "rollout": {"n": n, "log_prob_micro_batch_size_per_gpu": 8, "log_prob_use_dynamic_bsz": False},
            "ref": {"log_prob_micro_batch_size_per_gpu": ref_mb, "log_prob_use_dynamic_bsz": False}}})

    assert trainers.micro_batch_notes(config()) == []
    notes = trainers.micro_batch_notes(config(actor_mb=3, ref_mb=6))
    assert [note.split("=")[0] for note in notes] == ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                                                     "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"]
    assert "multiple of rollout.n=4" in notes[0] and "use_dynamic_bsz=true" in notes[0]
    assert trainers.micro_batch_notes(config(actor_mb=3, dynamic=True, ref_mb=8)) == []
    assert trainers.micro_batch_notes(config(actor_mb=3, switch=False)) == []
    assert trainers.micro_batch_notes(config(actor_mb=3, switch="off")) == []
    assert trainers.micro_batch_notes(config(actor_mb=3, n=1)) == []
    assert trainers.uses_dualkv(config(switch="true")) and not trainers.uses_dualkv(config(switch="false"))
    with pytest.raises(ValueError, match="expected true or false"):
        trainers.uses_dualkv(config(switch="maybe"))
    trainers._noted.clear()
    trainers.warn_micro_batches(config(actor_mb=3))
    trainers.warn_micro_batches(config(actor_mb=3))
    assert [str(w.message).split("=")[0] for w in recwarn.list if "rollout.n" in str(w.message)] == [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"]
