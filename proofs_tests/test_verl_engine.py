"""Engine-level parity: veRL's real FSDP2 engine (gloo, CPU, float32) on a tiny random Qwen3/Qwen2, stock vs dualkv
on the same weights — log-probs, entropy, the PPO loss (clip + entropy bonus + KL) and every parameter gradient —
plus dynamic batch size, micro-batches that cut groups, the run-time errors, and known-wrong variants that the
same comparison must catch."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")

import verl_fixtures as F  # noqa: E402

from dualkv.integration.verl import DualKVBatchError  # noqa: E402

#: Several groups: different P, N, R (R = 1 included).
GROUPS = [(7, [3, 5, 2]), (4, [6, 1, 2]), (9, [1, 4])]
N = 3
TOL = 1e-5   # float32: max |Δ| of log-probs/entropy; relative error of loss and of every gradient


@pytest.fixture(scope="module", params=["qwen3", "qwen2"])
def engine(request, tmp_path_factory):
    return F.build_engine(F.tiny_model_dir(tmp_path_factory, request.param, arch=request.param), dualkv=False)


def _set(engine, dualkv: bool) -> None:
    engine.engine_config.__dict__["use_dualkv"] = dualkv


def _infer(engine, td, dualkv: bool):
    _set(engine, dualkv)
    with engine.eval_mode():
        out = engine.infer_batch(td.clone(), loss_function=None)["model_output"]
    return F.response_values(out["log_probs"], td), F.response_values(out["entropy"], td)


def _train(engine, td, dualkv: bool, **loss_overrides):
    from verl.utils import tensordict_utils as tu

    _set(engine, dualkv)
    td = td.clone()
    tu.assign_non_tensor(td, return_model_output=True)
    with engine.train_mode():
        out = engine.forward_backward_batch(td, F.loss_fn(N, **loss_overrides), forward_only=False)
        grads = F.full_grads(engine.module)
        engine.optimizer_zero_grad()
    return out, grads


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _mask(td):
    from verl.utils.tensordict_utils import get

    return td["response_mask"].to_padded_tensor(0).bool() if td["response_mask"].is_nested \
        else get(td, "response_mask").bool()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_and_entropy_match_stock(engine, temperature):
    td = F.engine_batch(GROUPS, temperature=temperature)
    mask = _mask(td)
    lp_s, ent_s = _infer(engine, td, False)
    lp_d, ent_d = _infer(engine, td, True)
    d_lp, d_ent = (lp_s - lp_d)[mask].abs().max().item(), (ent_s - ent_d)[mask].abs().max().item()
    print(f"log-prob max|Δ| {d_lp:.2e}, entropy max|Δ| {d_ent:.2e}")
    assert d_lp <= TOL and d_ent <= TOL
    assert (lp_d[~mask] == 0).all()


@pytest.mark.parametrize("micro_batch", [8, 2])
def test_loss_and_every_gradient_match_stock(engine, micro_batch):
    """micro_batch=2 cuts groups of 3 at chunk boundaries (the paper's mb < N): still exact."""
    td = F.engine_batch(GROUPS, micro_batch_size_per_gpu=micro_batch)
    out_s, g_s = _train(engine, td, False)
    out_d, g_d = _train(engine, td, True)
    assert len(out_s["loss"]) == len(out_d["loss"])
    loss_err = max(abs(a - b) / abs(a) for a, b in zip(out_s["loss"], out_d["loss"]))
    grad_err = {name: _rel(g_d[name], g_s[name]) for name in g_s}
    print(f"loss rel {loss_err:.2e}; worst gradient {max(grad_err, key=grad_err.get)} {max(grad_err.values()):.2e}")
    assert set(g_s) == set(g_d) and len(g_s) > 10
    assert loss_err <= TOL and max(grad_err.values()) <= TOL
    for key in ("log_probs", "entropy"):
        a = F.response_values(out_s["model_output"][key], td)
        b = F.response_values(out_d["model_output"][key], td)
        assert (a - b).abs().max() <= TOL


def test_dynamic_batch_size_keeps_groups_and_fits_more(engine, monkeypatch):
    """Dynamic batch size: dualkv counts a group as P+ΣR (here 17/13/14 tokens vs 31/21/23 N-copy), so a budget of
    32 holds two groups where stock veRL needs a micro-batch per 32 N-copy tokens. Results stay exact."""
    import dualkv.integration.verl.engine as dk_engine

    groups = [(7, [3, 5, 2]), (4, [6, 1, 2]), (9, [1, 4]), (8, [2, 2, 2])]
    layouts = []
    original = dk_engine.pack_rows

    def recording(*args):
        packed = original(*args)
        layouts.append(packed.layout)
        return packed

    monkeypatch.setattr(dk_engine, "pack_rows", recording)
    td = F.engine_batch(groups, use_dynamic_bsz=True, max_token_len_per_gpu=32)
    out_s, g_s = _train(engine, td, False)
    out_d, g_d = _train(engine, td, True)
    assert len(out_d["loss"]) < len(out_s["loss"])
    assert abs(sum(out_d["loss"]) - sum(out_s["loss"])) <= TOL * abs(sum(out_s["loss"]))
    assert max(_rel(g_d[k], g_s[k]) for k in g_s) <= TOL
    seen = [gs for lay in layouts for gs in zip(lay.prompt_lens, lay.group_sizes)]
    assert sorted(seen) == sorted((p, len(rs)) for p, rs in groups)      # every group whole, once
    assert all(lay.total_tokens <= 32 for lay in layouts)
    assert any(lay.tokens_std > 32 for lay in layouts)
    lp_s = F.response_values(out_s["model_output"]["log_probs"], td)     # restore_dynamic_batch order
    lp_d = F.response_values(out_d["model_output"]["log_probs"], td)
    assert (lp_s - lp_d).abs().max() <= TOL


def _reorder(td, order):
    from verl.utils import tensordict_utils as tu

    return tu.index_select_tensor_dict(td, order)


def test_reinitialised_engine_is_switched_again(engine):
    """``engine.initialize()`` builds a new module: dualkv must switch that one too (else a stock attention would
    read the packed stream as plain sequences)."""
    from dualkv.integration.verl.engine import run_packed_model

    td = F.engine_batch(GROUPS)
    lp_s, _ = _infer(engine, td, False)
    _infer(engine, td, True)
    engine.initialize()
    lp_d, _ = _infer(engine, td, True)
    assert (lp_s - lp_d).abs().max() <= TOL
    _set(engine, False)
    _infer(engine, td, False)                      # switched back: the packed path now refuses to run
    with pytest.raises(RuntimeError, match="not 'dualkv'"):
        run_packed_model(engine.module, None, None, None, None)


def test_split_group_fails_with_named_error(engine):
    td = _reorder(F.engine_batch(GROUPS), [0, 3, 1, 2, 4, 5, 6, 7])      # group 0's rows around a row of group 1
    _set(engine, True)
    with engine.eval_mode(), pytest.raises(DualKVBatchError, match="not adjacent"):
        engine.infer_batch(td, loss_function=None)


def test_different_prompts_under_one_uid_fail_with_named_error(engine):
    td = F.engine_batch(GROUPS, uids=["same", "same", "other"])
    _set(engine, True)
    with engine.eval_mode(), pytest.raises(DualKVBatchError, match="prompts differ"):
        engine.infer_batch(td, loss_function=None)


def test_first_token_from_wrong_row_is_caught(engine, monkeypatch):
    """Known-wrong variant: the shared row taken one position early (the second-to-last prompt token)."""
    from dualkv.integration.verl import head

    td = F.engine_batch(GROUPS)
    lp_s, _ = _infer(engine, td, False)
    build = head.HeadPlan.build

    def wrong(packed, **kw):
        plan = build(packed, **kw)
        return head.HeadPlan(**{**plan.__dict__, "owned_rows": plan.owned_rows - 1})

    monkeypatch.setattr(head.HeadPlan, "build", staticmethod(wrong))
    lp_d, _ = _infer(engine, td, True)
    assert (lp_s - lp_d)[:, 0].abs().max() > 1e-3          # first tokens wrong ...
    assert (lp_s - lp_d)[:, 1:].abs().max() <= TOL          # ... the rest still right


def test_ignoring_the_layout_positions_is_caught(engine, monkeypatch):
    """Known-wrong variant: responses numbered as if packed right after each other (RoPE off)."""
    import dualkv.integration.verl.engine as dk_engine

    td = F.engine_batch(GROUPS)
    original = dk_engine.pack_rows

    def shifted(*args):
        packed = original(*args)
        object.__setattr__(packed, "position_ids", torch.arange(packed.layout.total_tokens))
        return packed

    monkeypatch.setattr(dk_engine, "pack_rows", shifted)
    _set(engine, True)
    with engine.eval_mode(), pytest.raises(ValueError, match="position_ids"):
        engine.infer_batch(td.clone(), loss_function=None)   # the model's input check refuses it


def test_stock_engines_take_the_stock_path(engine, monkeypatch):
    """Engines without use_dualkv (every critic, every non-dualkv actor) never enter the dualkv code."""
    import dualkv.integration.verl.engine as dk_engine

    def boom(*a, **k):
        raise AssertionError("dualkv path used by a stock engine")

    monkeypatch.setattr(dk_engine, "dualkv_forward_step", boom)
    monkeypatch.setattr(dk_engine, "group_prepare_micro_batches", boom)
    td = F.engine_batch(GROUPS, use_dynamic_bsz=True, max_token_len_per_gpu=32)
    _infer(engine, td, False)
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine, FSDPEngineWithValueHead

    assert not hasattr(FSDPEngine.forward_backward_batch, "__dualkv_original__")
    for name in ("prepare_model_inputs", "prepare_model_outputs"):
        assert not hasattr(getattr(FSDPEngineWithValueHead, name), "__dualkv_original__")


#: Empty responses (no valid token; stock veRL accepts them): inside a group, at a group's end, a whole group of
#: them, and (micro_batch=3: rows 3-5) a micro-batch where every row is empty.
EMPTY_GROUPS = [(7, [3, 0, 2]), (5, [0, 0, 0]), (9, [1, 4, 0])]


@pytest.mark.parametrize("micro_batch,dynamic", [(9, False), (3, False), (9, True)])
def test_empty_responses_contribute_exactly_what_stock_gives(engine, micro_batch, dynamic):
    """Rows without a response token contribute nothing: log-probs/entropy of every other row, the loss terms and
    every gradient as stock veRL computes them, also when a whole group (or a whole micro-batch) is empty."""
    meta = dict(micro_batch_size_per_gpu=micro_batch, use_dynamic_bsz=dynamic, max_token_len_per_gpu=24)
    td = F.engine_batch(EMPTY_GROUPS, **meta)
    mask = _mask(td)
    assert int((mask.sum(-1) == 0).sum()) == 5
    lp_s, ent_s = _infer(engine, td, False)
    lp_d, ent_d = _infer(engine, td, True)
    assert (lp_s - lp_d)[mask].abs().max() <= TOL and (ent_s - ent_d)[mask].abs().max() <= TOL
    assert (lp_d[~mask] == 0).all() and (ent_d[~mask] == 0).all()
    out_s, g_s = _train(engine, td, False)
    out_d, g_d = _train(engine, td, True)
    assert len(out_s["loss"]) == len(out_d["loss"]) or dynamic
    assert abs(sum(out_d["loss"]) - sum(out_s["loss"])) <= TOL * abs(sum(out_s["loss"]))
    for key in ("actor/pg_loss", "actor/entropy_loss", "kl_loss"):
        a, b = (sum(out["metrics"][key].values) for out in (out_s, out_d))
        assert abs(a - b) <= TOL * max(abs(a), 1e-6), key
    assert set(g_s) == set(g_d) and max(_rel(g_d[k], g_s[k]) for k in g_s) <= TOL


def test_skipping_the_model_for_empty_micro_batches_is_caught(engine, monkeypatch):
    """Known-wrong variant: a micro-batch of empty responses answered with constants instead of running the model.
    Its loss then does not reach the parameters and the backward fails (under FSDP every rank must run it)."""
    import dualkv.integration.verl.engine as dk_engine

    original = dk_engine.to_nested_rows

    def constant_when_all_empty(values, packed, offsets):
        prompt_lens = torch.tensor([packed.layout.prompt_lens[g] for g in packed.layout.response_group])
        all_empty = bool((offsets.diff() == prompt_lens).all())
        return original(values.detach() if all_empty else values, packed, offsets)

    monkeypatch.setattr(dk_engine, "to_nested_rows", constant_when_all_empty)
    _train(engine, F.engine_batch(EMPTY_GROUPS[:1], micro_batch_size_per_gpu=3), True)     # one empty row: fine
    with pytest.raises(RuntimeError, match="does not require grad"):
        _train(engine, F.engine_batch(EMPTY_GROUPS, micro_batch_size_per_gpu=3), True)


@pytest.fixture(scope="module")
def fsdp1_engine(tmp_path_factory):
    return F.build_engine(F.tiny_model_dir(tmp_path_factory, "fsdp1"), dualkv=False, strategy="fsdp")


@pytest.mark.parametrize("groups, micro_batch", [(EMPTY_GROUPS, 3), (GROUPS, 2)], ids=["empty", "cut"])
def test_fsdp1_veRLs_default_strategy_matches_stock(fsdp1_engine, groups, micro_batch):
    """``strategy=fsdp`` (FSDP1, veRL 0.9.1's default): the engine wraps the model, whose forward dualkv replaces
    inside the wrapper. Log-probs, entropy, loss and every gradient match stock FSDP1 (with empty responses; with
    micro-batches that cut groups)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    engine = fsdp1_engine
    assert isinstance(engine.module, FullyShardedDataParallel)
    td = F.engine_batch(groups, micro_batch_size_per_gpu=micro_batch)
    mask = _mask(td)
    lp_s, ent_s = _infer(engine, td, False)
    lp_d, ent_d = _infer(engine, td, True)
    assert (lp_s - lp_d)[mask].abs().max() <= TOL and (ent_s - ent_d)[mask].abs().max() <= TOL
    out_s, g_s = _train(engine, td, False)
    out_d, g_d = _train(engine, td, True)
    assert abs(sum(out_d["loss"]) - sum(out_s["loss"])) <= TOL * abs(sum(out_s["loss"]))
    assert len(g_s) >= 1 and set(g_s) == set(g_d) and max(_rel(g_d[k], g_s[k]) for k in g_s) <= TOL
