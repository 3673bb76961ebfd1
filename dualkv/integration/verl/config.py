"""``DualKVActorConfig``: veRL's FSDP actor/ref config plus ``use_dualkv``.

A recipe turns dualkv on with one Hydra override, ``+actor_rollout_ref.actor.use_dualkv=true``: the plugin
(:mod:`.switch`) converts the actor's config — and the ref's, which follows the actor — as this class. Naming the
class in the recipe (``actor_rollout_ref.actor._target_=dualkv.integration.verl.config.DualKVActorConfig``, the
same for ``ref``, each with ``+...use_dualkv=true``) does the same without plugin discovery.

The field is copied onto the engine config (``fsdp_config``), which is all the FSDP engine receives, and building a
config with ``use_dualkv=true`` installs the patches in that process (:func:`dualkv.integration.verl.enable`), so a
Ray worker is patched even when plugin discovery is off (``VERL_USE_EXTERNAL_PLUGINS=none``). Both of veRL's FSDP
strategies run: ``fsdp`` (FSDP1, veRL's default) and ``fsdp2``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .compat import check_verl_version

check_verl_version()

from verl.workers.config import FSDPActorConfig  # noqa: E402

from .engine import ENGINE_FLAG  # noqa: E402

__all__ = ["DualKVActorConfig"]


@dataclass
class DualKVActorConfig(FSDPActorConfig):
    """:class:`verl.workers.config.FSDPActorConfig` with ``use_dualkv`` (shared-prompt packing for this role).

    With ``use_dualkv`` the settings that would reorder or mix a prompt group's rows, or that the packed path
    does not implement, are refused here, at config time.
    """

    use_dualkv: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self.engine, ENGINE_FLAG, bool(self.use_dualkv))
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
