"""Trie packing in veRL's real FSDP2 engine (gloo, CPU, float32; ``dualkv_packing="trie"``): log-probs, entropy,
the PPO loss and every parameter gradient equal stock's on batches whose groups share a system prompt, on batches
with no cross-group sharing (where the trie is the group packing), with empty responses, cut micro-batches and
dynamic batch size; the token saving over group packing; known-wrong tries and unpackings caught; bad settings
refused by name."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")

import verl_fixtures as F  # noqa: E402
from test_verl_engine import N, TOL, _infer, _mask, _rel, _train  # noqa: E402

from dualkv import PrefixTreeLayout  # noqa: E402
from dualkv.integration.verl.rows import group_ids_of, pack_rows, prompt_lengths  # noqa: E402
from dualkv.integration.verl.trie import TrieRows, pack_rows_as_trie  # noqa: E402
from dualkv.tree import TreeIndex, TreeTargets  # noqa: E402

#: Three groups (different P, N, R; R = 1 included) whose prompts start with one 5-token system prompt.
GROUPS = [(9, [3, 5, 2]), (7, [6, 1, 2]), (11, [1, 4])]
SYSTEM = 5
#: With empty responses (a row of prompt tokens only), one inside a group and one at a group's end.
EMPTY_GROUPS = [(9, [3, 0, 2]), (7, [6, 1, 2]), (11, [1, 4, 0])]

CASES = {   # name: (groups, system prompt, engine_batch metadata)
    "system": (GROUPS, SYSTEM, {}),
    "no_sharing": (GROUPS, 0, {}),
    "system_empty": (EMPTY_GROUPS, SYSTEM, {}),
    "system_cut": (GROUPS, SYSTEM, {"micro_batch_size_per_gpu": 2}),      # micro-batches cut groups
    "system_dynamic": (GROUPS, SYSTEM, {"use_dynamic_bsz": True, "max_token_len_per_gpu": 32}),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return F.tiny_model_dir(tmp_path_factory, "trie")


@pytest.fixture(scope="module")
def engine(model_dir):
    return F.build_engine(model_dir, dualkv=False)


def _packing(engine, packing: str) -> None:
    engine.engine_config.__dict__["dualkv_packing"] = packing


@pytest.fixture(autouse=True)
def _group_packing_after(engine):
    yield
    _packing(engine, "group")


def _batch(case: str):
    groups, system, meta = CASES[case]
    return F.engine_batch(groups, system_prompt=system, **meta)


def _packings(td):
    """The trie and the group packing of a whole batch (one micro-batch)."""
    from verl.utils import tensordict_utils as tu

    prompt_lens = prompt_lengths(td["prompts"], td.get("attention_mask", None))
    trie = pack_rows_as_trie(td["input_ids"], td["position_ids"], prompt_lens)
    group = pack_rows(td["input_ids"], td["position_ids"], prompt_lens,
                      group_ids_of(tu.get(td, "uid"), td.batch_size[0]))
    return trie.layout, group.layout


@pytest.mark.parametrize("case", list(CASES))
def test_trie_packing_matches_stock(engine, case, monkeypatch):
    import dualkv.integration.verl.engine as dk_engine

    tries = []
    original = dk_engine.pack_rows_as_trie
    monkeypatch.setattr(dk_engine, "pack_rows_as_trie", lambda *args: tries.append(original(*args)) or tries[-1])
    td = _batch(case)
    mask = _mask(td)
    lp_s, ent_s = _infer(engine, td, False)
    _packing(engine, "trie")
    lp_t, ent_t = _infer(engine, td, True)
    d_lp, d_ent = (lp_s - lp_t)[mask].abs().max().item(), (ent_s - ent_t)[mask].abs().max().item()
    assert d_lp <= TOL and d_ent <= TOL
    assert (lp_t[~mask] == 0).all() and (ent_t[~mask] == 0).all()

    _packing(engine, "group")
    out_s, g_s = _train(engine, td, False)
    _packing(engine, "trie")
    out_t, g_t = _train(engine, td, True)
    assert len(out_s["loss"]) == len(out_t["loss"]) or CASES[case][2].get("use_dynamic_bsz")
    loss_err = abs(sum(out_t["loss"]) - sum(out_s["loss"])) / abs(sum(out_s["loss"]))
    grad_err = {k: _rel(g_t[k], g_s[k]) for k in g_s}
    print(f"{case}: log-prob max|Δ| {d_lp:.2e}, entropy {d_ent:.2e}, loss rel {loss_err:.2e}, worst gradient "
          f"{max(grad_err.values()):.2e}")
    assert set(g_s) == set(g_t) and len(g_s) > 10
    assert loss_err <= TOL and max(grad_err.values()) <= TOL
    for key in ("log_probs", "entropy"):
        a = F.response_values(out_s["model_output"][key], td)
        b = F.response_values(out_t["model_output"][key], td)
        assert (a - b)[mask].abs().max() <= TOL
    assert tries and all(isinstance(t.layout, PrefixTreeLayout) for t in tries)     # the trie path ran
    if CASES[case][1]:      # some micro-batch holds two groups under one system-prompt node
        assert any(t.layout.node_lens[0] == SYSTEM and len(t.layout.children[0]) >= 2 for t in tries)


def test_trie_stores_the_system_prompt_once_and_is_the_group_packing_without_sharing():
    """Token counts of one micro-batch holding the whole test batch: with a shared 5-token system prompt the trie
    stores it once instead of once per group; without cross-group sharing the trie is the group packing."""
    F.setup_cpu_verl()
    trie, group = _packings(_batch("system"))
    saved = group.total_tokens - trie.total_tokens
    print(f"system prompt batch: group packing {group.total_tokens} tokens, trie {trie.total_tokens} "
          f"({saved} fewer, {saved / group.total_tokens:.1%}); N-copy rows {group.tokens_std}")
    assert saved == (len(GROUPS) - 1) * SYSTEM
    trie, group = _packings(_batch("no_sharing"))
    assert trie.total_tokens == group.total_tokens
    assert trie.node_lens == PrefixTreeLayout.from_group_layout(group).node_lens
    assert trie.parents == PrefixTreeLayout.from_group_layout(group).parents


def test_trie_packing_needs_no_adjacent_groups(engine):
    """A trie is exact for any rows: a group whose rows are split (which group packing refuses) still matches."""
    from verl.utils import tensordict_utils as tu

    td = tu.index_select_tensor_dict(_batch("system"), [0, 3, 1, 2, 4, 5, 6, 7])
    mask = _mask(td)
    lp_s, _ = _infer(engine, td, False)
    _packing(engine, "trie")
    lp_t, _ = _infer(engine, td, True)
    assert (lp_s - lp_t)[mask].abs().max() <= TOL


def _patch_trie(monkeypatch, change) -> None:
    import dualkv.integration.verl.engine as dk_engine

    original = dk_engine.pack_rows_as_trie
    monkeypatch.setattr(dk_engine, "pack_rows_as_trie", lambda ids, pos, prompt_lens:
                        change(original(ids, pos, prompt_lens), prompt_lens))


def test_a_trie_that_drops_the_shared_node_is_caught(engine, monkeypatch):
    """Known-wrong variant: the shared system-prompt node cut off its children (they become roots: they neither
    attend to it nor continue its positions)."""

    def drop_root(trie: TrieRows, prompt_lens) -> TrieRows:
        good, layout = trie.index, trie.layout
        assert len(layout.children[0]) == len(GROUPS) and layout.node_lens[0] == SYSTEM   # the system prompt
        bad = PrefixTreeLayout(layout.node_lens, tuple(-1 if p == 0 else p for p in layout.parents))
        index = TreeIndex(bad, good.packed_ids, good.end_nodes, good.token_rows, good.cu_seqlens)
        return TrieRows(index, trie.targets)      # same rows scored, from the model run on the wrong tree

    td = _batch("system")
    mask = _mask(td)
    lp_s, _ = _infer(engine, td, False)
    _patch_trie(monkeypatch, drop_root)
    _packing(engine, "trie")
    lp_t, _ = _infer(engine, td, True)
    assert (lp_s - lp_t)[mask].abs().max() > 1e-3


def test_unpacking_with_the_wrong_index_is_caught(engine, monkeypatch):
    """Known-wrong variant: each row's first response value read from its second packed token's slot."""

    def shifted(trie: TrieRows, prompt_lens) -> TrieRows:
        t = trie.targets
        gather = t.gather.clone()
        first = t.cu_seqlens[:-1]
        long = (t.cu_seqlens[1:] - first) >= 2
        gather[first[long]] = gather[first[long] + 1]
        return TrieRows(trie.index, TreeTargets(t.rows, t.predictor_index, t.target_ids, gather, t.cu_seqlens))

    td = _batch("system")
    lp_s, _ = _infer(engine, td, False)
    _patch_trie(monkeypatch, shifted)
    _packing(engine, "trie")
    lp_t, _ = _infer(engine, td, True)
    long = _mask(td).sum(-1) >= 2
    assert (lp_s - lp_t)[long, 0].abs().max() > 1e-3      # first tokens wrong ...
    assert (lp_s - lp_t)[:, 1:][_mask(td)[:, 1:]].abs().max() <= TOL     # ... the rest still right


def test_an_unknown_packing_is_refused_by_name(engine):
    td = _batch("system")
    _packing(engine, "tree")
    with pytest.raises(ValueError, match="dualkv_packing='tree': expected one of group, trie"):
        _infer(engine, td, True)


def test_trie_rows_with_wrong_positions_are_refused():
    """Rows whose position ids are not 0..L-1 would give RoPE other positions than stock: refused."""
    from dualkv.integration.verl import DualKVBatchError

    F.setup_cpu_verl()
    td = _batch("system")
    prompt_lens = prompt_lengths(td["prompts"], td["attention_mask"])
    ids, pos = td["input_ids"], td["position_ids"]
    shifted = torch.nested.nested_tensor_from_jagged(pos.values() + 1, pos.offsets())
    with pytest.raises(DualKVBatchError, match="position_ids are not 0..L-1"):
        pack_rows_as_trie(ids, shifted, prompt_lens)
    with pytest.raises(DualKVBatchError, match="row 0 has .* 0 prompt tokens"):
        pack_rows_as_trie(ids, pos, [0] + prompt_lens[1:])
    with pytest.raises(DualKVBatchError, match="nested"):
        pack_rows_as_trie(ids.to_padded_tensor(0), pos, prompt_lens)


@pytest.mark.parametrize("sp", [1, 2, 3])
def test_trie_head_plan_scores_every_target_once_on_any_slice(sp):
    """``HeadPlan.for_predictors``: the SP slices' plans score every packed target exactly once, from the rank
    holding its predictor row, so the summed per-rank head outputs equal the whole stream's (what the SP all-reduce
    computes); at SP = 1 that is ``token_logprobs`` on the targets."""
    from dualkv.integration.logprobs import token_logprobs
    from dualkv.integration.verl.head import HeadPlan, dualkv_row_kernel, head_logprobs

    gen = torch.Generator().manual_seed(0)
    system = [5, 6, 7, 8]
    seqs = [system + [9, 10, 11, 12], system + [9, 10, 13], system + [14, 15, 16, 12, 17], system + [14, 15, 16]]
    _, index = PrefixTreeLayout.from_sequences(seqs)
    targets = index.targets([6, 6, 7, 7])
    total = index.layout.total_tokens
    hidden = torch.randn(total, 8, generator=gen, dtype=torch.float64)
    weight = torch.randn(20, 8, generator=gen, dtype=torch.float64)
    part = -(-total // sp)
    plans = [HeadPlan.for_predictors(targets.predictor_index, targets.target_ids, rank=r, part=part, total=total)
             for r in range(sp)]
    slots = torch.cat([p.shifted_slots for p in plans])
    assert sorted(slots.tolist()) == list(range(targets.rows.shape[0]))
    for r, plan in enumerate(plans):
        assert torch.equal(targets.predictor_index[plan.shifted_slots], plan.shifted_rows + r * part)
        assert torch.equal(targets.target_ids[plan.shifted_slots], plan.shifted_targets)
    kernel = dualkv_row_kernel()
    parts = [head_logprobs(hidden[r * part:(r + 1) * part], weight, None, plan, kernel, temperature=0.8,
                           with_entropy=True) for r, plan in enumerate(plans)]
    logp = sum(p[0] for p in parts)
    entropy = sum(p[1] for p in parts)
    want_lp, want_ent = token_logprobs(hidden, weight, targets.predictor_index, targets.target_ids, temperature=0.8)
    torch.testing.assert_close(logp, want_lp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(entropy, want_ent, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="every predictor a packed row >= 0"):
        HeadPlan.for_predictors(torch.tensor([-1, 2]), torch.tensor([3, 4]))


@pytest.fixture(scope="module")
def sp1_stock(engine):
    """SP = 1 stock veRL on the system-prompt batch (the reference for SP = 2: stock's own SP path needs
    FlashAttention)."""
    from verl_fixtures import dist_cases

    return {"infer": dist_cases._run_both(engine, _batch("system"), N, train=False),
            "train": dist_cases._run_both(engine, _batch("system"), N, train=True)}


def test_trie_packing_under_sequence_parallel_2_matches_stock(model_dir, sp1_stock, tmp_path):
    """Ulysses SP = 2 (two processes, gloo): each rank holds half of the padded trie stream; the attention runs on
    the whole tree after the all-to-all and each target is scored on the rank holding its predictor row, summed over
    the SP group. Log-probs, entropy, loss and every gradient equal SP = 1 stock; without the head's all-reduce
    (known-wrong) they do not."""
    from verl_fixtures import dist_cases

    ref = sp1_stock
    ranks = dist_cases.spawn(dist_cases.sequence_parallel_trie, 2, model_dir, GROUPS, N, SYSTEM, False,
                             str(tmp_path))
    mask = _mask(_batch("system"))
    for rank in ranks:
        got, want = rank["infer"]["dualkv"], ref["infer"]["stock"]
        d_lp = (got["log_probs"] - want["log_probs"])[mask].abs().max().item()
        d_ent = (got["entropy"] - want["entropy"])[mask].abs().max().item()
        train, ref_train = rank["train"]["dualkv"], ref["train"]["stock"]
        loss_err = abs(train["loss"][0] - ref_train["loss"][0]) / abs(ref_train["loss"][0])
        grad_err = max(_rel(train["grads"][k], ref_train["grads"][k]) for k in ref_train["grads"])
        print(f"SP=2 trie vs SP=1 stock: log-prob {d_lp:.2e}, entropy {d_ent:.2e}, loss rel {loss_err:.2e}, "
              f"worst gradient {grad_err:.2e}")
        assert d_lp <= TOL and d_ent <= TOL and loss_err <= TOL and grad_err <= TOL
        assert set(train["grads"]) == set(ref_train["grads"])
        assert rank["trie_calls"] == 2          # one micro-batch each for inference and training
    mutant_dir = tmp_path / "mutant"
    mutant_dir.mkdir()
    ranks = dist_cases.spawn(dist_cases.sequence_parallel_trie, 2, model_dir, GROUPS, N, SYSTEM, True,
                             str(mutant_dir))
    wrong = max((r["infer"]["dualkv"]["log_probs"] - ref["infer"]["stock"]["log_probs"])[mask].abs().max().item()
                for r in ranks)
    assert wrong > 1e-3


def test_trie_packing_with_verls_fused_log_prob_kernels(tmp_path):
    """``use_fused_kernels=True`` (its own process: veRL patches the model class): the trie's predictor rows go
    through veRL's FusedLinearForPPO; log-probs, entropy and every gradient equal stock's (tied embeddings, as in
    test_verl_distributed's fused test)."""
    from verl_fixtures import dist_cases

    F.setup_cpu_verl()
    model_dir = F.build_model_dir(tmp_path / "tied", tie_word_embeddings=True)
    (rank,) = dist_cases.spawn(dist_cases.fused_kernels_trie, 1, model_dir, GROUPS, N, SYSTEM, str(tmp_path))
    assert rank["trie_calls"] == 2
    for phase in ("infer", "train"):
        s, d = rank[phase]["stock"], rank[phase]["dualkv"]
        assert (s["log_probs"] - d["log_probs"]).abs().max() <= TOL
        assert (s["entropy"] - d["entropy"]).abs().max() <= TOL
    grads_t, grads_s = rank["train"]["dualkv"]["grads"], rank["train"]["stock"]["grads"]
    assert set(grads_t) == set(grads_s)
    err = max(_rel(grads_t[k], grads_s[k]) for k in grads_s)
    print(f"fused kernels, trie: worst gradient rel {err:.2e}")
    assert err <= TOL


@pytest.mark.parametrize("mode", ["dp2", "sp2"])
def test_distributed_parity_program_with_trie_packing_cpu(mode, tmp_path):
    """``experiments/verl/distributed_parity.py --packing trie --system-prompt 2`` (torchrun, 2 gloo processes):
    DP = 2 and Ulysses SP = 2 with trie-packed micro-batches whose groups share a system prompt, fp32 relative
    error <= 1e-5 for every quantity (the program the lead runs on GPUs with bf16 and the CUDA tree kernels)."""
    from test_verl_distributed_parity import _assert_passed, fp32_rows_within, run_parity

    proc, record = run_parity(mode, 2, tmp_path, "--packing", "trie", "--system-prompt", "2", "--precisions", "fp32")
    _assert_passed(proc, record, mode, 2, ["fp32"])
    assert record["packing"] == "trie" and record["system_prompt"] == 2
    assert all(r["trie_packings"] > 0 for r in record["ranks"])       # the trie path ran on every rank
    assert fp32_rows_within(record["ranks"][0]["report"]["fp32"])


def test_actor_and_ref_workers_with_the_trie_override_match_stock(model_dir):
    """veRL's real ``ActorRolloutRefWorker`` (in process, FSDP2) from a Hydra-composed GRPO config plus the two
    overrides: the ref follows the actor's packing; ``compute_log_prob``, ``compute_ref_log_prob`` and
    ``update_actor`` give stock's log-probs, entropy, loss, grad norm and updated weights on groups sharing a system
    prompt."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    from test_verl_worker import _run, _worker
    from verl_fixtures.synthetic import rollout_batch

    groups = [(9, [3, 5, 2]), (7, [6, 1, 2]), (11, [1, 4, 2]), (8, [2, 2, 7])]

    def td(**meta):
        out = left_right_2_no_padding(rollout_batch(groups, vocab_size=F.VOCAB, seed=3,
                                                    system_prompt=SYSTEM).to_tensordict())
        tu.assign_non_tensor(out, **meta)
        return out

    td_log = td(calculate_entropy=True, compute_loss=False)
    rows = td_log.batch_size[0]
    td_update = td(calculate_entropy=True, global_batch_size=rows // 2, mini_batch_size=rows // 2, epochs=1, seed=1,
                   dataloader_kwargs={"shuffle": False}, compute_loss=True)
    extra = ["+actor_rollout_ref.actor.dualkv_packing=trie"]
    results = {}
    for dualkv in (False, True):
        actor = _worker(model_dir, "actor", dualkv=dualkv, strategy="fsdp2", extra=extra if dualkv else ())
        ref = _worker(model_dir, "ref", dualkv=dualkv, strategy="fsdp2", extra=extra if dualkv else ())
        if dualkv:
            assert actor.actor.engine.engine_config.dualkv_packing == "trie"
            assert ref.ref.engine.engine_config.dualkv_packing == "trie"
        results[dualkv] = _run(actor, ref, td_log, td_update)
    s, d = results[False], results[True]
    mask = _mask(td_log)
    for key in ("log_probs", "entropy", "ref"):
        assert (s[key] - d[key])[mask].abs().max().item() <= TOL, key
    for key in ("actor/pg_loss", "loss", "grad_norm", "actor/entropy_loss"):
        for a, b in zip(s["metrics"][key], d["metrics"][key]):
            assert abs(a - b) <= TOL * max(abs(a), 1e-6), key
    for name, p in s["params"].items():
        assert float((d["params"][name] - p).abs().max()) <= TOL, name
