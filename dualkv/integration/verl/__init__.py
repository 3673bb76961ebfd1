"""dualkv for veRL 0.9.x: shared-prompt packing in the FSDP actor and ref (GRPO, DAPO, any recipe with N
responses per prompt), on either FSDP strategy (``fsdp``, veRL's default, and ``fsdp2``). See the README's "veRL"
section.

Add one Hydra override to a veRL recipe (the ref follows the actor; ``+actor_rollout_ref.ref.use_dualkv=false``
opts it out)::

    +actor_rollout_ref.actor.use_dualkv=true

With dualkv installed (``pip install -e '.[verl]'`` in a checkout of its repository), its ``verl.plugins`` entry
point installs the patches in every process that imports veRL, including the one that converts a role with
``use_dualkv`` to :class:`DualKVActorConfig`; :func:`enable` does the same explicitly. Modules:

* :mod:`.rows` — micro-batch rows <-> P+ΣR packing, and the run-time checks (:class:`DualKVBatchError`);
* :mod:`.trie` — the rows as one radix trie instead (``+actor_rollout_ref.actor.dualkv_packing=trie``: a prefix
  shared across groups, e.g. a system prompt, stored once; docs/trees.md);
* :mod:`.head` — response-token log-probs/entropy from hidden states, Ulysses-aware (seed Eq. 9);
* :mod:`.sequence_parallel` — the all-to-alls around the "dualkv" attention;
* :mod:`.micro_batches`, :mod:`.balance` — group-preserving dynamic micro-batches and DP balancing;
* :mod:`.engine`, :mod:`.trainers`, :mod:`.patches` — the veRL seams; :mod:`.config` — ``DualKVActorConfig``;
  :mod:`.switch` — the one-override switch.

Importing this package does not import veRL (``DualKVActorConfig`` loads it on first access).
"""

from __future__ import annotations

from typing import Any

from .compat import SUPPORTED_VERL, TESTED_VERL, UnsupportedVerlError, check_verl_version
from .patches import enable, is_enabled
from .rows import DualKVBatchError

__all__ = ["DualKVActorConfig", "DualKVBatchError", "SUPPORTED_VERL", "TESTED_VERL", "UnsupportedVerlError",
           "check_verl_version", "enable", "is_enabled"]


def __getattr__(name: str) -> Any:
    if name == "DualKVActorConfig":
        from .config import DualKVActorConfig

        return DualKVActorConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
