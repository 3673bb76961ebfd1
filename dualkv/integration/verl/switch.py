"""The one Hydra override that turns dualkv on: ``+actor_rollout_ref.actor.use_dualkv=true``.

veRL converts each role's config with ``verl.utils.config.omega_conf_to_dataclass`` (Hydra ``instantiate`` of its
``_target_``, stock ``verl.workers.config.FSDPActorConfig``, which has no ``use_dualkv`` field). The plugin wraps
that function (:func:`wrap_omega_conf_to_dataclass`): an actor or ref config whose switch is on gets
:class:`~.config.DualKVActorConfig` as its ``_target_`` — rewritten in place, so every later reader (the ref's
conversion, the trainer's group-preserving balancing) sees the same — and is converted as that class, which checks
the settings that conflict with the packing.

The ref follows the actor (it computes log-probs of the same rows with the same model) unless it sets its own
``use_dualkv``; likewise for ``dualkv_packing`` (``group``, the default, or ``trie``). A role on an engine other
than veRL's FSDP one (megatron, veomni, torchtitan) is refused by name.
A recipe may still name the class itself (``_target_=dualkv.integration.verl.config.DualKVActorConfig`` with
``use_dualkv=true``); that works with plugin discovery off (``VERL_USE_EXTERNAL_PLUGINS=none``) too.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["FLAG", "PACKING", "DUALKV_TARGET", "FSDP_TARGETS", "role_switch", "install_dualkv_target",
           "wrap_omega_conf_to_dataclass"]

#: The switch, on ``actor_rollout_ref.actor`` (and optionally ``actor_rollout_ref.ref``).
FLAG = "use_dualkv"
#: How dualkv packs micro-batches ("group" or "trie"), next to the switch; the ref follows the actor's too.
PACKING = "dualkv_packing"
DUALKV_TARGET = "dualkv.integration.verl.config.DualKVActorConfig"
#: How veRL 0.9's FSDP actor/ref configs name their class.
FSDP_TARGETS = ("verl.workers.config.FSDPActorConfig", "verl.workers.config.actor.FSDPActorConfig")


def _role_setting(config: Any, key: str) -> Any:
    """An actor/ref ``DictConfig``'s own ``key``, else, for the ref (the ``ref`` child of ``actor_rollout_ref``), the
    actor's; None when neither sets it (or for any other config)."""
    from omegaconf import DictConfig

    if not isinstance(config, DictConfig):
        return None
    own = config.get(key, None)
    if own is not None:
        return own
    parent = config._get_parent()
    actor = parent.get("actor", None) if isinstance(parent, DictConfig) and config._key() == "ref" else None
    return actor.get(key, None) if isinstance(actor, DictConfig) else None


#: What ``use_dualkv`` may be set to besides a bool (an ``${oc.env:...}`` interpolation gives a string).
_SWITCH_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def switch_value(value: Any) -> bool | None:
    """``use_dualkv`` as a bool (None: not set). Bools, 0 / 1 and the words true / false, yes / no, on / off (any
    case); anything else raises ValueError naming it (``bool("off")`` would have switched dualkv on)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _SWITCH_WORDS:
        return _SWITCH_WORDS[value.strip().lower()]
    raise ValueError(f"{FLAG}={value!r}: expected true or false")


def role_switch(config: Any) -> bool:
    """Whether an actor/ref ``DictConfig`` asks for dualkv: its own ``use_dualkv``, else, for the ref, the actor's.
    Any other config: False. A value other than a bool or a true / false word raises ValueError."""
    return bool(switch_value(_role_setting(config, FLAG)))


def install_dualkv_target(config: Any) -> bool:
    """Point a switched-on actor/ref config at ``DualKVActorConfig`` (in place); return whether it is switched on.

    Raises:
        ValueError: the role runs on an engine dualkv does not patch, or sets ``dualkv_packing`` without the switch.
    """
    from omegaconf import DictConfig, open_dict, read_write

    if not role_switch(config):
        own = config.get(PACKING, None) if hasattr(config, "get") else None
        if own not in (None, "group"):
            raise ValueError(f"{PACKING}={own!r} needs {FLAG}=true (it chooses how dualkv packs micro-batches)")
        own_switch = config.get(FLAG, None) if hasattr(config, "get") else None
        if not isinstance(config, DictConfig) or (own_switch is None and own is None):
            return False  # nothing of dualkv's in this config: it converts as it is
        # Switched off explicitly (the ref's opt-out, an A/B script's use_dualkv=false): the stock class has no such
        # fields, so an FSDP role converts as DualKVActorConfig with the switch off (stock behaviour: every patch
        # checks the flag); another engine's role drops them.
        with read_write(config), open_dict(config):
            if config.get("_target_", None) in FSDP_TARGETS + (DUALKV_TARGET,):
                config["_target_"] = DUALKV_TARGET
                config[FLAG] = False
            else:
                config.pop(FLAG, None)
                config.pop(PACKING, None)
        return False

    target = config.get("_target_", None)
    if target not in FSDP_TARGETS + (DUALKV_TARGET,):
        raise ValueError(f"use_dualkv=true needs veRL's FSDP engine (strategy fsdp or fsdp2); this role's config is "
                         f"{target!r} (strategy={config.get('strategy', None)!r})")
    packing = _role_setting(config, PACKING)
    with read_write(config), open_dict(config):
        config["_target_"] = DUALKV_TARGET
        config[FLAG] = True
        if packing is not None:
            config[PACKING] = packing
    return True


def wrap_omega_conf_to_dataclass(original: Callable) -> Callable:
    """``omega_conf_to_dataclass`` that first applies :func:`install_dualkv_target` to target-based conversions."""

    def omega_conf_to_dataclass(config, dataclass_type=None):
        if dataclass_type is None:
            install_dualkv_target(config)
        return original(config, dataclass_type)

    return omega_conf_to_dataclass
