"""Install (once per process) the few veRL patches dualkv needs.

Each patch wraps one veRL function and changes nothing unless the engine or trainer has ``use_dualkv`` on, so
installing them is harmless for every other run (critic engines, non-dualkv actors, other recipes):

* ``FSDPEngineWithLMHead.forward_step`` -> :func:`.engine.dualkv_forward_step` for dualkv engines;
* ``FSDPEngineWithLMHead.forward_backward_batch`` marks the batch so that
  ``transformer_impl.prepare_micro_batches`` (imported there by name) keeps prompt groups whole with dynamic
  batch size (:func:`.engine.group_prepare_micro_batches`);
* ``RayPPOTrainer._balance_batch`` and the v1 ``PPOTrainer._balance_batch`` -> :mod:`.trainers`;
* ``omega_conf_to_dataclass`` (in ``verl.utils.config`` and, imported by name, ``verl.workers.engine_workers``)
  converts a role with ``use_dualkv=true`` as ``DualKVActorConfig`` (:mod:`.switch`), so enabling dualkv is one
  Hydra override.

Patches attach to their module's import (:mod:`._hooks`), so enabling from ``import verl`` (the plugin entry
point) pulls in nothing heavy.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, Callable

from ._hooks import when_imported
from .compat import check_verl_version

__all__ = ["enable", "is_enabled", "PATCHED_ATTR", "ENGINE_MODULE", "LEGACY_TRAINER_MODULE", "V1_TRAINER_MODULE",
           "CONFIG_MODULES"]

ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"
#: Modules whose ``omega_conf_to_dataclass`` converts actor/ref configs.
CONFIG_MODULES = ("verl.utils.config", "verl.workers.engine_workers")
LEGACY_TRAINER_MODULE = "verl.trainer.ppo.ray_trainer"
V1_TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"
#: Set on every wrapper; holds the wrapped original.
PATCHED_ATTR = "__dualkv_original__"

_enabled = False


def _wrap(owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``owner.name`` by ``make(original)`` unless it is already a dualkv wrapper."""
    original = getattr(owner, name)
    if getattr(original, PATCHED_ATTR, None) is not None:
        return
    wrapper = make(original)
    functools.update_wrapper(wrapper, original)
    setattr(wrapper, PATCHED_ATTR, original)
    setattr(owner, name, wrapper)


def _patch_engine(module: ModuleType) -> None:
    from verl.utils import tensordict_utils as tu

    from . import engine as dk

    cls = module.FSDPEngineWithLMHead

    def forward_step(original):
        def wrapper(self, micro_batch, loss_function, forward_only):
            if dk.dualkv_enabled(self):
                return dk.dualkv_forward_step(self, micro_batch, loss_function, forward_only)
            dk.set_dualkv_attention(self, False)
            return original(self, micro_batch, loss_function, forward_only)
        return wrapper

    def forward_backward_batch(original):
        def wrapper(self, data, loss_function, forward_only=False):
            if dk.dualkv_enabled(self):
                tu.assign_non_tensor(data, **{dk.MICRO_BATCH_FLAG: True})
            return original(self, data, loss_function, forward_only)
        return wrapper

    def prepare_micro_batches(original):
        def wrapper(data, *args, **kwargs):
            grouped = tu.get_non_tensor_data(data=data, key=dk.MICRO_BATCH_FLAG, default=False)
            dynamic = tu.get_non_tensor_data(data=data, key="use_dynamic_bsz", default=True)
            if grouped and dynamic:
                return dk.group_prepare_micro_batches(data, *args, **kwargs)
            return original(data, *args, **kwargs)
        return wrapper

    _wrap(cls, "forward_step", forward_step)
    _wrap(cls, "forward_backward_batch", forward_backward_batch)
    _wrap(module, "prepare_micro_batches", prepare_micro_batches)


def _balance_patch(balance: Callable) -> Callable[[Callable], Callable]:
    from .trainers import uses_dualkv, warn_micro_batches

    def make(original):
        def wrapper(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
            if uses_dualkv(self.config):
                warn_micro_batches(self.config)
                return balance(self, batch, metrics, logging_prefix, keep_minibatch)
            return original(self, batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)
        return wrapper

    return make


def _patch_legacy_trainer(module: ModuleType) -> None:
    from .trainers import balance_legacy

    _wrap(module.RayPPOTrainer, "_balance_batch", _balance_patch(balance_legacy))


def _patch_v1_trainer(module: ModuleType) -> None:
    from .trainers import balance_v1

    _wrap(module.PPOTrainer, "_balance_batch", _balance_patch(balance_v1))


def _patch_config_loader(module: ModuleType) -> None:
    from .switch import wrap_omega_conf_to_dataclass

    _wrap(module, "omega_conf_to_dataclass", wrap_omega_conf_to_dataclass)


def enable() -> None:
    """Install the dualkv patches in this process (idempotent). Raises ``UnsupportedVerlError`` on a veRL outside
    the supported range."""
    global _enabled
    if _enabled:
        return
    check_verl_version()
    when_imported(ENGINE_MODULE, _patch_engine)
    when_imported(LEGACY_TRAINER_MODULE, _patch_legacy_trainer)
    when_imported(V1_TRAINER_MODULE, _patch_v1_trainer)
    for name in CONFIG_MODULES:
        when_imported(name, _patch_config_loader)
    _enabled = True


def is_enabled() -> bool:
    """Whether :func:`enable` ran in this process."""
    return _enabled
