"""The paper-run launch scripts (``experiments/verl/*.sh``, DRY_RUN=1) compose with veRL's Hydra config, select
``DualKVActorConfig`` for dualkv runs and pass veRL's own ``validate_config``; the synthetic long-prompt dataset and
its reward behave."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

EXP = Path(__file__).resolve().parents[1] / "experiments" / "verl"
SCRIPTS = {"grpo_longreason_qwen3_8b.sh": 1, "dapo_longreason_qwen3_8b.sh": 1, "grpo_moe_qwen3_30b_a3b.sh": 1,
           "sweep_llama31_8b_prompts.sh": 18}


def _dry_run(script: str, system: str) -> list[list[str]]:
    env = {**os.environ, "MODEL": "/models/m", "DATA": "/data", "SYSTEM": system, "DRY_RUN": "1"}
    out = subprocess.run(["bash", str(EXP / script)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    blocks = [b.strip().splitlines() for b in out.stdout.split("---") if b.strip()]
    return blocks


@pytest.mark.parametrize("system", ["dualkv", "fa2"])
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_launch_script_composes_and_validates(script, system):
    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    blocks = _dry_run(script, system)
    assert len(blocks) == SCRIPTS[script]
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=blocks[0])
    use_ref = bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)
    validate_config(cfg, use_reference_policy=use_ref, use_critic=False)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert (type(actor).__name__ == "DualKVActorConfig") == (system == "dualkv")
    assert actor.shuffle is False and cfg.actor_rollout_ref.rollout.n == 32
    if script.startswith("dapo"):
        assert not use_ref and cfg.actor_rollout_ref.actor.clip_ratio_high == 0.28


def test_longprompt_dataset_and_reward(tmp_path):
    sys.path.insert(0, str(EXP))
    try:
        import build_longprompt_dataset as builder
        import reward
    finally:
        sys.path.remove(str(EXP))
    import pandas as pd

    train, test = builder.build(tmp_path, num_train=6, num_val=2, prompt_tokens=400, tokenizer=None, seed=1)
    df = pd.read_parquet(train)
    assert len(df) == 6 and len(pd.read_parquet(test)) == 2
    assert set(df.columns) >= {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    for _, row in df.iterrows():
        text = row["prompt"][0]["content"]
        assert len(text.split()) * 1.3 >= 400 and "\\boxed{N}" in text
        truth = row["reward_model"]["ground_truth"]
        assert reward.compute_score(row["data_source"], f"so the total is \\boxed{{{truth}}}", truth) == 1.0
        assert reward.compute_score(row["data_source"], f"\\boxed{{{int(truth) + 1}}}", truth) == 0.0
    again = pd.read_parquet(builder.build(tmp_path / "again", 6, 2, 400, None, 1)[0])
    assert again["prompt"].tolist() == df["prompt"].tolist()       # deterministic for a seed
