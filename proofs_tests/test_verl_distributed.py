"""Two processes over gloo: Ulysses SP=2 and DP=2 (with dynamic batch size), and the fused-kernel head (its own
process: veRL patches the model class's forward for it). Each rank builds veRL's real FSDP engine (FSDP2; DP=2 also
FSDP1, veRL's default strategy)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")

import verl_fixtures as F  # noqa: E402
from verl_fixtures import dist_cases  # noqa: E402

#: Packs to 47 tokens (odd: SP pads it); the four shared last-prompt rows sit on both SP ranks.
GROUPS = [(7, [3, 5, 2]), (4, [6, 1, 2]), (9, [1, 4]), (2, [1])]
N = 3
TOL = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return F.tiny_model_dir(tmp_path_factory, "dist")


@pytest.fixture(scope="module")
def sp1(model_dir):
    """SP = 1 reference in this process: stock and dualkv, inference and training."""
    engine = F.build_engine(model_dir, dualkv=False)
    td = F.engine_batch(GROUPS)
    return {"infer": dist_cases._run_both(engine, td, N, train=False),
            "train": dist_cases._run_both(engine, td, N, train=True)}


def _grad_err(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-30)) for k in a)


def test_sequence_parallel_2_matches_sp1(model_dir, sp1, tmp_path):
    ranks = dist_cases.spawn(dist_cases.sequence_parallel, 2, model_dir, GROUPS, N, False, str(tmp_path))
    ref = sp1["infer"]["stock"]
    for rank in ranks:
        got = rank["infer"]["dualkv"]
        first = (got["log_probs"][:, 0] - sp1["infer"]["dualkv"]["log_probs"][:, 0]).abs().max().item()
        d_lp = (got["log_probs"] - ref["log_probs"]).abs().max().item()
        d_ent = (got["entropy"] - ref["entropy"]).abs().max().item()
        print(f"SP=2 vs SP=1: log-prob max|Δ| {d_lp:.2e}, entropy {d_ent:.2e}, first-token max|Δ| {first}")
        assert first == 0.0          # seed section 2.3: the shared row is the SP=1 row exactly
        assert d_lp <= TOL and d_ent <= TOL
        train, ref_train = rank["train"]["dualkv"], sp1["train"]["stock"]
        assert abs(train["loss"][0] - ref_train["loss"][0]) <= TOL * abs(ref_train["loss"][0])
        err = _grad_err(train["grads"], ref_train["grads"])
        print(f"SP=2 dualkv vs SP=1 stock: worst gradient rel {err:.2e}")
        assert err <= TOL
    assert torch.equal(ranks[0]["infer"]["dualkv"]["log_probs"], ranks[1]["infer"]["dualkv"]["log_probs"])


def test_sequence_parallel_without_collectives_is_caught(model_dir, sp1, tmp_path):
    """Known-wrong variant: no all-reduce of the shared rows / values (each rank keeps what it holds)."""
    ranks = dist_cases.spawn(dist_cases.sequence_parallel, 2, model_dir, GROUPS, N, True, str(tmp_path))
    ref = sp1["infer"]["stock"]["log_probs"]
    assert all((r["infer"]["dualkv"]["log_probs"] - ref).abs().max() > 1e-2 for r in ranks)


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp"])
def test_data_parallel_2_with_dynamic_batch_size(model_dir, tmp_path, strategy):
    """fsdp: FSDP1, veRL's default strategy."""
    per_rank = [[(7, [3, 5, 2]), (4, [6, 1, 2]), (9, [2, 2, 2])], [(5, [3, 3, 3]), (12, [8, 1, 4]), (3, [2, 2, 9])]]
    ranks = dist_cases.spawn(dist_cases.data_parallel, 2, model_dir, per_rank, N, True, strategy, str(tmp_path))
    for rank in ranks:
        for phase in ("infer", "train"):
            s, d = rank[phase]["stock"], rank[phase]["dualkv"]
            assert (s["log_probs"] - d["log_probs"]).abs().max() <= TOL
        s, d = rank["train"]["stock"], rank["train"]["dualkv"]
        assert len(d["loss"]) < len(s["loss"])                # P+ΣR counting: fewer, fuller micro-batches
        assert abs(sum(d["loss"]) - sum(s["loss"])) <= TOL * abs(sum(s["loss"]))
        err = _grad_err(d["grads"], s["grads"])                # gradients after FSDP's reduce over both ranks
        print(f"DP=2 worst gradient rel {err:.2e}")
        assert err <= TOL
    if strategy == "fsdp2":                                     # full gradients: the same on both ranks
        assert _grad_err(ranks[0]["train"]["dualkv"]["grads"], ranks[1]["train"]["dualkv"]["grads"]) == 0


def test_fused_kernels_head(tmp_path):
    """use_fused_kernels=True: the shared last-prompt hidden state expanded into veRL's FusedLinearForPPO.

    Tied embeddings: veRL's own fused forward reads ``lm_head.weight`` outside the lm_head's FSDP2 unit, which
    fails for untied models (a sharded DTensor); dualkv computes its head inside that unit and has no such limit."""
    model_dir = F.build_model_dir(tmp_path / "tied", tie_word_embeddings=True)
    (rank,) = dist_cases.spawn(dist_cases.fused_kernels, 1, model_dir, GROUPS, N, str(tmp_path))
    for phase in ("infer", "train"):
        s, d = rank[phase]["stock"], rank[phase]["dualkv"]
        assert (s["log_probs"] - d["log_probs"]).abs().max() <= TOL
        assert (s["entropy"] - d["entropy"]).abs().max() <= TOL
    err = _grad_err(rank["train"]["dualkv"]["grads"], rank["train"]["stock"]["grads"])
    print(f"fused kernels worst gradient rel {err:.2e}")
    assert err <= TOL
