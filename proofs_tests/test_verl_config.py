"""Config and loading: one Hydra override (``+actor_rollout_ref.actor.use_dualkv=true``) on veRL's defaults (FSDP1)
selects ``DualKVActorConfig`` for the actor and the ref, passes veRL's own validation, marks the engine config, and
every setting that conflicts with the packing is refused by name; naming the class explicitly still works; the
``verl.plugins`` entry point installs the patches on ``import verl`` in a fresh process; ``enable()`` and the
config do it without the plugin; an unsupported veRL is reported with how to install a supported one."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("verl")

import verl_fixtures as F  # noqa: E402

from dualkv.integration import verl as dv  # noqa: E402
from dualkv.integration.verl.switch import DUALKV_TARGET, install_dualkv_target  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    F.setup_cpu_verl()
    return F.build_model_dir(tmp_path_factory.mktemp("cfg"))


@pytest.mark.parametrize("lines", ["one", "explicit"])
def test_one_override_selects_the_dualkv_config_on_verls_defaults(model_dir, lines):
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import FSDPActorConfig

    extra = F.DUALKV_EXPLICIT_OVERRIDES if lines == "explicit" else []
    cfg = F.compose_grpo(model_dir, 4, dualkv=lines == "one", extra=extra)
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp" and cfg.actor_rollout_ref.ref.strategy == "fsdp"
    validate_config(cfg, use_reference_policy=True, use_critic=False)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert type(actor) is dv.DualKVActorConfig and isinstance(actor, FSDPActorConfig)
    assert actor.use_dualkv is True and actor.engine.use_dualkv is True and actor.strategy == "fsdp"
    # the ref follows (the worker converts it after renaming its log_prob_* keys; test_verl_worker runs that)
    assert install_dualkv_target(cfg.actor_rollout_ref.ref)
    assert cfg.actor_rollout_ref.ref._target_ == DUALKV_TARGET and cfg.actor_rollout_ref.ref.use_dualkv is True

    stock = F.compose_grpo(model_dir, 4, dualkv=False)
    actor = omega_conf_to_dataclass(stock.actor_rollout_ref.actor)
    assert type(actor) is FSDPActorConfig and not getattr(actor.engine, "use_dualkv", False)
    assert not install_dualkv_target(stock.actor_rollout_ref.ref)
    assert stock.actor_rollout_ref.ref._target_ != DUALKV_TARGET


def test_the_ref_can_opt_out(model_dir):
    from verl.utils.config import omega_conf_to_dataclass

    cfg = F.compose_grpo(model_dir, 4, dualkv=True, extra=["+actor_rollout_ref.ref.use_dualkv=false"])
    assert type(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)) is dv.DualKVActorConfig
    assert not install_dualkv_target(cfg.actor_rollout_ref.ref)
    assert cfg.actor_rollout_ref.ref.use_dualkv is False   # converts as DualKVActorConfig, switched off (below)


def test_an_explicit_off_switch_converts_as_stock(model_dir):
    """The ref's opt-out and an A/B script's ``actor.use_dualkv=false`` used to reach veRL's FSDPActorConfig with the
    key still in the config (TypeError: unexpected keyword argument 'use_dualkv', at worker start); such a role now
    converts as DualKVActorConfig with the switch off, whose engine flag keeps every patch out of the way."""
    from omegaconf import open_dict
    from verl.utils.config import omega_conf_to_dataclass

    def convert_ref(cfg):
        """What veRL 0.9.1's engine worker does before it converts the ref (engine_workers.py, init_model)."""
        ref = cfg.actor_rollout_ref.ref
        with open_dict(ref):
            ref.ppo_mini_batch_size = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
            ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
            ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
            ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
            ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
        return omega_conf_to_dataclass(ref)

    cfg = F.compose_grpo(model_dir, 4, dualkv=True, extra=["+actor_rollout_ref.ref.use_dualkv=false"])
    ref = convert_ref(cfg)
    assert type(ref) is dv.DualKVActorConfig and ref.use_dualkv is False and ref.engine.use_dualkv is False
    assert type(convert_ref(F.compose_grpo(model_dir, 4, dualkv=True))).__name__ == "DualKVActorConfig"
    for value in ("false", "off", "'False'", "0"):
        cfg = F.compose_grpo(model_dir, 4, dualkv=False, extra=[f"+actor_rollout_ref.actor.use_dualkv={value}"])
        actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        assert actor.use_dualkv is False and actor.engine.use_dualkv is False, value
        ref = convert_ref(cfg)   # follows the actor: off
        assert not getattr(ref, "use_dualkv", False), value
    for value in ("on", "'TRUE'", "1"):
        cfg = F.compose_grpo(model_dir, 4, dualkv=False, extra=[f"+actor_rollout_ref.actor.use_dualkv={value}"])
        assert omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).use_dualkv is True, value
    cfg = F.compose_grpo(model_dir, 4, dualkv=False, extra=["+actor_rollout_ref.actor.use_dualkv=maybe"])
    with pytest.raises(ValueError, match="use_dualkv='maybe': expected true or false"):
        install_dualkv_target(cfg.actor_rollout_ref.actor)


def test_trie_packing_is_one_more_override_and_the_ref_follows(model_dir):
    from verl.utils.config import omega_conf_to_dataclass

    cfg = F.compose_grpo(model_dir, 4, dualkv=True)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert actor.dualkv_packing == "group" and actor.engine.dualkv_packing == "group"      # the default
    cfg = F.compose_grpo(model_dir, 4, dualkv=True, extra=["+actor_rollout_ref.actor.dualkv_packing=trie"])
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert type(actor) is dv.DualKVActorConfig
    assert actor.dualkv_packing == "trie" and actor.engine.dualkv_packing == "trie"
    assert install_dualkv_target(cfg.actor_rollout_ref.ref) and cfg.actor_rollout_ref.ref.dualkv_packing == "trie"
    cfg = F.compose_grpo(model_dir, 4, dualkv=True, extra=["+actor_rollout_ref.actor.dualkv_packing=trie",
                                                           "+actor_rollout_ref.ref.dualkv_packing=group"])
    assert install_dualkv_target(cfg.actor_rollout_ref.ref) and cfg.actor_rollout_ref.ref.dualkv_packing == "group"


@pytest.mark.parametrize("dualkv, packing, message", [
    (True, "tree", "dualkv_packing='tree': expected one of group, trie"),
    (False, "trie", "dualkv_packing='trie' needs use_dualkv=true"),
])
def test_a_bad_packing_is_refused_by_name(model_dir, dualkv, packing, message):
    from hydra.errors import InstantiationException
    from verl.utils.config import omega_conf_to_dataclass

    cfg = F.compose_grpo(model_dir, 4, dualkv=dualkv, extra=[f"+actor_rollout_ref.actor.dualkv_packing={packing}"])
    with pytest.raises((ValueError, InstantiationException), match=message):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    with pytest.raises(ValueError, match=message):
        dv.DualKVActorConfig(strategy="fsdp2", rollout_n=2, ppo_micro_batch_size_per_gpu=1, use_dualkv=dualkv,
                             dualkv_packing=packing)


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.actor.shuffle=true", "shuffle=True"),
    ("actor_rollout_ref.actor.strategy=megatron", "strategy='megatron'"),
    ("actor_rollout_ref.actor.use_prefix_grouper=true", "use_prefix_grouper"),
    ("actor_rollout_ref.actor.pad_to_length=true", "pad_to_length"),
    ("actor_rollout_ref.actor.calculate_sum_pi_squared=true", "calculate_sum_pi_squared"),
])
def test_conflicting_settings_are_refused(model_dir, override, message):
    from hydra.errors import InstantiationException
    from verl.utils.config import omega_conf_to_dataclass

    cfg = F.compose_grpo(model_dir, 4, dualkv=True, extra=[override])
    with pytest.raises((ValueError, InstantiationException), match=message):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def test_an_engine_dualkv_does_not_patch_is_refused():
    """Megatron's recipe (``ppo_megatron_trainer``) with the one line: refused by name, not a Hydra kwarg error."""
    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_megatron_trainer", overrides=F.DUALKV_OVERRIDES)
    with pytest.raises(ValueError, match="needs veRL's FSDP engine.*McoreActorConfig"):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def test_unsupported_verl_says_how_to_install_from_the_repository():
    with pytest.raises(dv.UnsupportedVerlError, match=r"pip install -e '\.\[verl\]'.*checkout"):
        dv.check_verl_version("0.8.0")


def test_entry_point_is_declared():
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="verl.plugins")}
    assert eps.get("dualkv") == "dualkv.integration.verl.plugin"


_PROBE = """
import json, os
import verl
import verl.workers.engine.fsdp.transformer_impl as ti
import verl.trainer.ppo.ray_trainer as rt
import verl.utils.config as vc
def patched():
    return {"engine": hasattr(ti.FSDPEngineWithLMHead.forward_step, "__dualkv_original__"),
            "micro_batches": hasattr(ti.prepare_micro_batches, "__dualkv_original__"),
            "trainer": hasattr(rt.RayPPOTrainer._balance_batch, "__dualkv_original__"),
            "config": hasattr(vc.omega_conf_to_dataclass, "__dualkv_original__")}
out = {"after_import": patched()}
from dualkv.integration.verl.config import DualKVActorConfig
DualKVActorConfig(strategy="fsdp2", rollout_n=2, ppo_micro_batch_size_per_gpu=1, use_dualkv=True)
out["after_config"] = patched()
print("PROBE" + json.dumps(out))
"""


@pytest.mark.parametrize("plugins", ["auto", "none"])
def test_fresh_process_gets_the_patches(plugins):
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE")}
    env.update(VERL_USE_EXTERNAL_PLUGINS=plugins, VERL_LOGGING_LEVEL="ERROR")
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    out = json.loads(line[0][5:])
    expected = plugins == "auto"   # the plugin patches on import; without it the config does
    assert out["after_import"] == {"engine": expected, "micro_batches": expected, "trainer": expected,
                                   "config": expected}
    assert out["after_config"] == {"engine": True, "micro_batches": True, "trainer": True, "config": True}


def test_enable_is_idempotent_and_patches_once():
    from verl.workers.engine.fsdp import transformer_impl as ti

    dv.enable()
    dv.enable()
    assert dv.is_enabled()
    step = ti.FSDPEngineWithLMHead.forward_step
    assert step.__dualkv_original__ is not None
    assert not hasattr(step.__dualkv_original__, "__dualkv_original__")


def test_unsupported_verl_is_reported_by_the_plugin(monkeypatch):
    from dualkv.integration.verl import compat, patches, plugin

    monkeypatch.setattr(compat, "installed_verl_version", lambda: "0.8.0")
    monkeypatch.setattr(patches, "_enabled", False)
    with pytest.warns(RuntimeWarning, match=r"supports verl>=0\.9\.1,<0\.10.*found verl 0\.8\.0"):
        importlib.reload(plugin)
    assert not patches.is_enabled()
