"""A veRL platform for CPU-only machines, for tests and smoke runs (veRL 0.9 ships only nvidia/huawei/amd).

Without it veRL picks "nvidia" and fails in ``get_device_id()``. :func:`register` adds it as "cpu" and selects it
(``VERL_PLATFORM=cpu``); ``VERL_ENGINE_DEVICE=cuda`` makes the engine registry hand out the FSDP engines, which
are registered for cuda/npu only. Collectives use gloo. Not for training: nothing here is fast.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any, Optional

import torch


__all__ = ["register"]


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus the memory-statistics functions veRL calls on its device module (all zero on CPU)."""
    mod = types.ModuleType("verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(mod, name, getattr(torch.cpu, name))
    zero = lambda *args, **kwargs: 0  # noqa: E731
    none = lambda *args, **kwargs: None  # noqa: E731
    for name in ("max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved"):
        setattr(mod, name, zero)
    for name in ("empty_cache", "reset_peak_memory_stats", "manual_seed", "manual_seed_all", "set_device",
                 "ipc_collect"):
        setattr(mod, name, none)
    mod.mem_get_info = lambda *args, **kwargs: (1 << 34, 1 << 34)
    mod.is_available = lambda: True
    mod.device_count = lambda: 1
    mod.current_device = lambda: "cpu"
    mod.synchronize = none
    mod.get_device_name = lambda *args, **kwargs: "CPU"
    return mod


def _unpinned_offload() -> None:
    """The forward-only (ref) engine always offloads with ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an
    accelerator, so on CPU the policy is built unpinned."""
    from torch.distributed.fsdp import CPUOffloadPolicy
    from verl.workers.engine.fsdp import transformer_impl

    transformer_impl.CPUOffloadPolicy = lambda pin_memory=True: CPUOffloadPolicy(pin_memory=False)


def _fsdp1_on_cpu() -> None:
    """veRL builds FSDP1 (``strategy=fsdp``) with ``sync_module_states=True`` (ranks > 0 start on the meta device and
    receive rank 0's weights), which torch refuses for CPU parameters — only a check: the broadcast itself runs on
    gloo — and the ref with ``CPUOffload(offload_params=True)``, which pins memory (needs an accelerator; the
    parameters live on the CPU anyway). On CPU the check is skipped and the ref built without offloading (a
    subclass of the wrapper, so veRL's ``fsdp_version`` still sees FSDP1)."""
    from torch.distributed.fsdp import _init_utils
    from verl.workers.engine.fsdp import transformer_impl

    _init_utils._check_module_states_for_sync_module_states = lambda module_states: None
    stock = transformer_impl.FSDP
    if getattr(stock, "_dualkv_cpu_shim", False):
        return

    class CPUFullyShardedDataParallel(stock):
        _dualkv_cpu_shim = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["cpu_offload"] = None
            super().__init__(*args, **kwargs)

    transformer_impl.FSDP = CPUFullyShardedDataParallel


def register() -> None:
    """Register the "cpu" platform with veRL and select it (idempotent)."""
    os.environ["VERL_PLATFORM"] = "cpu"
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    if PlatformRegistry.get("cpu") is not None:
        return

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        _module = _device_module()

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> types.ModuleType:
            return self._module

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: Optional[int] = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    _unpinned_offload()
    _fsdp1_on_cpu()
