"""Group-preserving ``_balance_batch`` patches of veRL's legacy (``RayPPOTrainer``) and v1 (``PPOTrainer``) trainers,
run on trainer objects without Ray: every DP rank gets B/dp rows, each prompt group whole and adjacent; the stock
balancing (the known-wrong variant for dualkv) scatters groups and is refused by the packing."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import verl_fixtures as F  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from dualkv.integration.verl import DualKVBatchError  # noqa: E402
from dualkv.integration.verl.balance import partition_problems, split_groups  # noqa: E402
from dualkv.integration.verl.rows import pack_rows, prompt_lengths  # noqa: E402
from verl_fixtures.synthetic import rollout_batch  # noqa: E402

DP = 2


def _groups(count=8, n=4, seed=0):
    rng = random.Random(seed)
    return [(rng.randint(3, 40), [rng.randint(1, 30) for _ in range(n)]) for _ in range(count)]


def _config(dualkv: bool, role: str = "actor"):
    roles = {"actor": {"ppo_mini_batch_size": 4}, "ref": {}, "rollout": {"n": 4}}
    roles[role]["use_dualkv"] = dualkv
    return OmegaConf.create({"actor_rollout_ref": roles, "trainer": {"critic_warmup": 0}})


@pytest.fixture(scope="module")
def legacy_cls():
    F.setup_cpu_verl()
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    return RayPPOTrainer


@pytest.fixture(scope="module")
def v1_cls():
    F.setup_cpu_verl()
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    return PPOTrainer


def _legacy(cls, dualkv, role="actor"):
    trainer = object.__new__(cls)
    trainer.config = _config(dualkv, role)
    trainer.use_prefix_grouper = False
    trainer.actor_rollout_wg = None
    trainer._get_dp_size = lambda worker_group, role: DP
    return trainer


def _rank_chunks(uids):
    size = len(uids) // DP
    return [list(range(r * size, (r + 1) * size)) for r in range(DP)]


def _assert_packable(batch, chunk):
    """A DP rank's rows go through dualkv's packing (raises DualKVBatchError if a group is not adjacent)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(batch.select_idxs(chunk).to_tensordict())
    ids = td["input_ids"]
    pack_rows(ids, td["position_ids"], prompt_lengths(td["prompts"], td["attention_mask"]),
              list(tu.get(td, "uid")))


@pytest.mark.parametrize("role", ["actor", "ref"])
def test_legacy_trainer_balancing_keeps_groups(legacy_cls, role):
    groups = _groups()
    batch = rollout_batch(groups, vocab_size=F.VOCAB, loss_fields=False)
    metrics = {}
    _legacy(legacy_cls, True, role)._balance_batch(batch, metrics=metrics)
    uids = list(batch.non_tensor_batch["uid"])
    chunks = _rank_chunks(uids)
    assert partition_problems(uids, chunks) == [] and split_groups(uids, chunks) == []
    assert sorted(uids) == sorted(rollout_batch(groups, vocab_size=F.VOCAB, loss_fields=False)
                                  .non_tensor_batch["uid"])
    assert any(k.startswith("global_seqlen/") for k in metrics)
    for chunk in chunks:
        _assert_packable(batch, chunk)


def test_legacy_stock_balancing_breaks_groups_and_is_refused(legacy_cls):
    """Known-wrong variant: the stock row balancing (what runs when use_dualkv is off)."""
    groups = _groups()
    batch = rollout_batch(groups, vocab_size=F.VOCAB, loss_fields=False)
    _legacy(legacy_cls, False)._balance_batch(batch, metrics={})
    uids = list(batch.non_tensor_batch["uid"])
    chunks = _rank_chunks(uids)
    assert split_groups(uids, chunks) or partition_problems(uids, chunks)
    with pytest.raises(DualKVBatchError):
        for chunk in chunks:
            _assert_packable(batch, chunk)


def _v1(cls, dualkv, multiple):
    concrete = type("ConcreteTrainer", (cls,), {name: (lambda self, *a, **k: None) for name in cls.__abstractmethods__})
    trainer = object.__new__(concrete)
    trainer.config = _config(dualkv)
    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": list(range(DP))},
                                               _query_dispatch_info=lambda role: list(range(DP)))
    trainer.tokenizer = SimpleNamespace(eos_token_id=1)
    trainer._get_required_batch_multiple = lambda dp_size: multiple
    return trainer


def _kv_batch(groups):
    from transfer_queue import KVBatchMeta

    keys, tags = [], []
    for gi, (p, rs) in enumerate(groups):
        for s, r in enumerate(rs):
            keys.append(f"uid-{gi:03d}_{s}_0")
            tags.append({"status": "success", "prompt_len": p, "response_len": r, "seq_len": p + r})
    return KVBatchMeta(keys=keys, tags=tags, partition_id="train")


def _fake_upsample(batch, multiple, eos_token_id):
    """veRL's padding without TransferQueue storage: synthetic (P=1, R=1) rows under one new uid."""
    from transfer_queue import KVBatchMeta

    pad = (-len(batch)) % multiple
    keys = [f"padabc_{i}_0" for i in range(pad)]
    tags = [{"status": "success", "prompt_len": 1, "response_len": 1, "seq_len": 2} for _ in range(pad)]
    return KVBatchMeta(keys=batch.keys + keys, tags=batch.tags + tags, partition_id=batch.partition_id)


@pytest.mark.parametrize("short", [False, True])
def test_v1_trainer_balancing_keeps_groups_with_padding(v1_cls, monkeypatch, short):
    import verl.trainer.ppo.padding_utils as padding_utils

    monkeypatch.setattr(padding_utils, "upsample_batch_to_divisible_size", _fake_upsample)
    groups = _groups(count=7)
    if short:   # a filtered/short group and padding rows that do not fill a whole group
        groups[2] = (groups[2][0], groups[2][1][:1])
    batch = _kv_batch(groups)
    metrics = {}
    out = _v1(v1_cls, True, 8)._balance_batch(batch, metrics=metrics)
    assert len(out) % 8 == 0 and len(out) >= len(batch)
    uids = [k.rsplit("_", 2)[0] for k in out.keys]
    chunks = _rank_chunks(uids)
    assert partition_problems(uids, chunks) == []
    assert len(split_groups(uids, chunks)) <= DP - 1
    if not short:
        assert split_groups(uids, chunks) == []
    assert any(k.startswith("global_seqlen/") for k in metrics)


def test_v1_stock_balancing_breaks_groups(v1_cls, monkeypatch):
    import verl.trainer.ppo.padding_utils as padding_utils

    monkeypatch.setattr(padding_utils, "upsample_batch_to_divisible_size", _fake_upsample)
    import verl.trainer.ppo.v1.trainer_base as trainer_base

    monkeypatch.setattr(trainer_base, "upsample_batch_to_divisible_size", _fake_upsample)
    out = _v1(v1_cls, False, 8)._balance_batch(_kv_batch(_groups(count=8)), metrics={})
    uids = [k.rsplit("_", 2)[0] for k in out.keys]
    chunks = _rank_chunks(uids)
    assert split_groups(uids, chunks) or partition_problems(uids, chunks)


def test_v1_key_without_uid_structure_is_refused(v1_cls, monkeypatch):
    import verl.trainer.ppo.padding_utils as padding_utils
    from transfer_queue import KVBatchMeta

    monkeypatch.setattr(padding_utils, "upsample_batch_to_divisible_size", _fake_upsample)
    batch = KVBatchMeta(keys=["a", "b"], tags=[{"prompt_len": 1, "response_len": 1, "seq_len": 2}] * 2,
                        partition_id="train")
    with pytest.raises(ValueError, match="<uid>_<session>_<index>"):
        _v1(v1_cls, True, 2)._balance_batch(batch, metrics={})
