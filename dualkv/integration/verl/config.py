"""``DualKVActorConfig``: veRL's FSDP actor/ref config plus ``use_dualkv`` (and ``dualkv_packing``).

A recipe turns dualkv on with one Hydra override, ``+actor_rollout_ref.actor.use_dualkv=true``: the plugin
(:mod:`.switch`) converts the actor's config — and the ref's, which follows the actor — as this class. Naming the
class in the recipe (``actor_rollout_ref.actor._target_=dualkv.integration.verl.config.DualKVActorConfig``, the
same for ``ref``, each with ``+...use_dualkv=true``) does the same without plugin discovery.

``+actor_rollout_ref.actor.dualkv_packing=trie`` (default ``group``) packs each micro-batch as the radix trie of
its rows instead of once per prompt group, so a prefix shared across groups is stored once (docs/trees.md).

The fields are copied onto the engine config (``fsdp_config``), which is all the FSDP engine receives, and building a
config with ``use_dualkv=true`` installs the patches in that process (:func:`dualkv.integration.verl.enable`), so a
Ray worker is patched even when plugin discovery is off (``VERL_USE_EXTERNAL_PLUGINS=none``). Both of veRL's FSDP
strategies run: ``fsdp`` (FSDP1, veRL's default) and ``fsdp2``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .compat import check_verl_version

check_verl_version()

from verl.workers.config import FSDPActorConfig  # noqa: E402

from .engine import ENGINE_FLAG, PACKING_FLAG, PACKINGS  # noqa: E402

__all__ = ["DualKVActorConfig"]


@dataclass
class DualKVActorConfig(FSDPActorConfig):
    """:class:`verl.workers.config.FSDPActorConfig` with ``use_dualkv`` (shared-prompt packing for this role).

    With ``use_dualkv`` the settings that would reorder or mix a prompt group's rows, or that the packed path
    does not implement, are refused here, at config time.
    """

    use_dualkv: bool = False
    #: How a micro-batch is packed: "group" (each prompt once, P+ΣR per uid group) or "trie" (the radix trie of the
    #: micro-batch's rows: a prefix shared across groups, e.g. a system prompt, is stored once too).
    dualkv_packing: str = "group"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dualkv_packing not in PACKINGS:
            raise ValueError(f"dualkv_packing={self.dualkv_packing!r}: expected one of {', '.join(PACKINGS)}")
        if self.dualkv_packing != "group" and not self.use_dualkv:
            raise ValueError(f"dualkv_packing={self.dualkv_packing!r} needs use_dualkv=true (it chooses how dualkv "
                             "packs micro-batches)")
        object.__setattr__(self.engine, ENGINE_FLAG, bool(self.use_dualkv))
        object.__setattr__(self.engine, PACKING_FLAG, self.dualkv_packing)
        if not self.use_dualkv:
            return
        problems = []
        if self.strategy not in ("fsdp", "fsdp2"):
            problems.append(f"strategy={self.strategy!r} (dualkv runs on veRL's FSDP engine: fsdp or fsdp2)")
        if self.shuffle:
            problems.append("shuffle=True (it mixes prompt groups inside mini-batches; set shuffle=False)")
        if self.use_prefix_grouper:
            problems.append("use_prefix_grouper=True (veRL's own shared-prefix path; use one or the other)")
        if self.pad_to_length or getattr(self.fsdp_config, "pad_to_length", False):
            problems.append("pad_to_length=True (static packed-length padding is not supported)")
        if self.calculate_sum_pi_squared:
            problems.append("calculate_sum_pi_squared=True (needs the full (T, V) logits, which dualkv never forms)")
        if problems:
            raise ValueError("use_dualkv=True conflicts with: " + "; ".join(problems))
        from .patches import enable

        enable()
