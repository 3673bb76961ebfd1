"""dualkv for TRL's ``GRPOTrainer`` (TRL 1.16): every log-prob TRL computes — policy, old, reference — runs on
P+ΣR packed prompt groups with the ``"dualkv"`` attention. See docs/trl.md.

One line on a built trainer::

    from dualkv.integration.trl import apply_dualkv
    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)
    apply_dualkv(trainer)
    trainer.train()

or the drop-in subclass ``DualKVGRPOTrainer`` (same arguments). Modules:

* :mod:`.rows` — TRL's padded rows grouped by prompt, chunk planning, the group-preserving shuffle;
* :mod:`.forward` — one log-prob call on packed chunks, through the model's wrappers;
* :mod:`.trainer` — the GRPOTrainer overrides, :func:`apply_dualkv`; :mod:`.compat` — supported TRL versions.

Importing this package does not import TRL (``DualKVGRPOTrainer`` loads it on first access).
"""

from __future__ import annotations

from typing import Any

from .compat import SUPPORTED_TRL, TESTED_TRL, UnsupportedTRLError, check_trl_version
from .trainer import DualKVTRLError, apply_dualkv

__all__ = ["DualKVGRPOTrainer", "DualKVTRLError", "SUPPORTED_TRL", "TESTED_TRL", "UnsupportedTRLError",
           "apply_dualkv", "check_trl_version"]


def __getattr__(name: str) -> Any:
    if name == "DualKVGRPOTrainer":
        check_trl_version()  # TRL missing or unsupported: UnsupportedTRLError naming the range, not ModuleNotFoundError
        from trl import GRPOTrainer

        from .trainer import dualkv_trainer_class

        return dualkv_trainer_class(GRPOTrainer)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
