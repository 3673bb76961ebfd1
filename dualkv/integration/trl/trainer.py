"""dualkv in TRL's ``GRPOTrainer``: every log-prob TRL computes runs on P+ΣR packed prompt groups.

One seam carries the whole change: ``GRPOTrainer._get_per_token_logps_and_entropies``, which TRL calls for the
policy (with entropy, under gradient), the old policy (``num_iterations > 1`` or misaligned steps), and the
reference (a separate ``ref_model``, or the policy with its PEFT adapter disabled). It returns (B, C) log-probs and
entropies in TRL's completion layout, so TRL's losses (every ``loss_type``), KL, entropy mask and bonus, importance
sampling, gradient accumulation and ``steps_per_generation`` run unchanged on the same numbers.

Around it:

* the model runs the ``"dualkv"`` attention only while dualkv needs it: a log-prob call switches it on (a call
  without gradient switches it back afterwards); generation (``_generate``) and the end of every
  ``training_step``/``prediction_step`` switch it off, so generation, callbacks and saving see the model's own
  attention, and a backward with gradient checkpointing recomputes under the attention its forward used;
* the generation batch is shuffled by prompt group instead of by row before TRL splits it into
  ``steps_per_generation`` micro-batches (``keep_groups=True``), drawing the same random numbers as TRL's shuffle;
* the per-layer attention casts its inputs to the autocast dtype under autocast (:mod:`.attention`), as stock
  sdpa and FlashAttention do, so float32 weights with ``bf16=True`` still run dualkv's CUDA kernels;
* what cannot be packed runs stock: a call whose rows all have empty completions (the whole call, with a warning).

Refused by name: vision-language inputs, the MoE router aux loss (``router_aux_loss_coef=0.0`` turns it off), PEFT
prompt learning, models that scale their logits or softcap their attention logits, models with token mixers outside
attention (all checked when dualkv is applied), TRL outside :data:`~.compat.SUPPORTED_TRL`. Warned: micro-batches
that split prompt groups, and loss terms computed per micro-batch that the group shuffle changes.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..hf import ATTN_NAME, check_token_mixers, disable_dualkv, enable_dualkv, register
from ..logprobs import logit_scaling
from .attention import autocast_packed_attention
from .compat import check_trl_version
from .forward import HEADS, packed_call_logps, row_kernel
from .rows import group_rows, group_shuffle

__all__ = ["DualKVTRLError", "DualKVGRPOMixin", "apply_dualkv", "dualkv_trainer_class", "innermost_model"]

#: Keyword inputs of TRL's log-prob call that only vision-language models pass.
_MULTIMODAL = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
               "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")
_STOCK_SHUFFLE = "shuffle_sequence_dict"


def _aux_loss_refusal(coef: float | None) -> str:
    """Why the MoE router aux loss is refused, and TRL's switch that turns it off."""
    here = "" if coef is None else f" (here {coef})"
    return ("the MoE router aux loss is not supported by dualkv (stock's load-balancing term counts each prompt "
            "token N times, a packed forward once); TRL 1.16 adds it for every MoE config that declares "
            f"router_aux_loss_coef{here}, whatever output_router_logits says: set "
            "GRPOConfig(router_aux_loss_coef=0.0) to train without it")


class DualKVTRLError(ValueError):
    """A GRPOTrainer setting or input dualkv does not support (named in the message)."""


def innermost_model(model: torch.nn.Module, accelerator: Any = None) -> torch.nn.Module:
    """The causal LM inside ``model``'s wrappers (accelerate/DDP, PEFT): the module whose attention is switched."""
    inner = accelerator.unwrap_model(model) if accelerator is not None else model
    if hasattr(inner, "peft_config") and hasattr(inner, "get_base_model"):
        config = getattr(inner, "active_peft_config", None)
        if config is not None and getattr(config, "is_prompt_learning", False):
            raise DualKVTRLError(f"PEFT prompt learning ({type(config).__name__}) prepends virtual tokens dualkv does "
                                 "not pack; use an adapter method such as LoRA")
        inner = inner.get_base_model()
    return inner


def _check_model(inner: torch.nn.Module, what: str) -> None:
    config = getattr(inner, "config", None)
    if config is None or not hasattr(inner, "get_decoder") or not hasattr(inner, "set_attn_implementation"):
        raise DualKVTRLError(f"the {what} ({type(inner).__name__}) is not a transformers causal LM")
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text_config is not config:
        raise DualKVTRLError(f"the {what} is a multimodal model ({type(inner).__name__}); dualkv's TRL integration "
                             "supports text-only causal LMs")
    if not isinstance(inner.get_output_embeddings(), torch.nn.Linear):
        raise DualKVTRLError(f"the {what} ({type(inner).__name__}) has no nn.Linear output head")
    if scaled := logit_scaling(config):  # (TRL's fused head honours it; dualkv refuses rather than guess)
        raise DualKVTRLError(f"the {what} scales its logits ({scaled}); dualkv's packed head does not")
    if config._attn_implementation == ATTN_NAME:
        raise DualKVTRLError(f"the {what} was loaded with attn_implementation='{ATTN_NAME}'; load it with its own "
                             "attention (sdpa, flash_attention_2): dualkv switches to packed attention per call")
    # refused here, not by the first packed forward after a whole generation
    if softcap := getattr(text_config, "attn_logit_softcapping", None):
        raise DualKVTRLError(f"the {what} ({type(inner).__name__}) softcaps its attention logits "
                             f"(attn_logit_softcapping={softcap}); the '{ATTN_NAME}' attention does not")
    try:
        check_token_mixers(inner, f"the {what}")
    except NotImplementedError as exc:   # hybrid models (mamba, linear-attention, conv token mixers)
        raise DualKVTRLError(str(exc)) from None


def _micro_batch_terms(trainer: Any) -> list[str]:
    """The GRPO loss terms TRL computes per micro-batch (a normaliser, a quantile, a mean), named as set: which rows
    share a micro-batch changes them, so the group shuffle changes the optimizer step against TRL's row shuffle."""
    terms = []
    if getattr(trainer, "loss_type", None) == "bnpo":
        terms.append("loss_type='bnpo' (token count of the micro-batch)")
    quantile = getattr(trainer, "top_entropy_quantile", 1.0)
    if quantile < 1.0:
        terms.append(f"top_entropy_quantile={quantile} (entropy quantile of the micro-batch)")
    if getattr(trainer, "_entropy_bonus_enabled", False):
        terms.append("the entropy bonus (entropy_coef; mean entropy of the micro-batch)")
    return terms


class DualKVGRPOMixin:
    """The dualkv overrides of ``GRPOTrainer`` (see the module docstring). Use :func:`apply_dualkv` or
    ``DualKVGRPOTrainer``; the state is set by :meth:`_dualkv_setup`."""

    def _dualkv_setup(self, head: str = "trl", keep_groups: bool = True) -> None:
        check_trl_version()
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}; got {head!r}")
        if not isinstance(keep_groups, bool):   # bool("false") is True
            raise TypeError(f"keep_groups must be True or False; got {keep_groups!r}")
        if getattr(self, "_is_vlm", False):
            raise DualKVTRLError("vision-language training (images in the dataset) is not supported by dualkv")
        policy = innermost_model(self.model, self.accelerator)
        _check_model(policy, "policy")
        if self.ref_model is not None:
            _check_model(innermost_model(self.ref_model, self.accelerator), "reference model")
        if getattr(self, "aux_loss_enabled", False):
            raise DualKVTRLError(_aux_loss_refusal(getattr(self, "router_aux_loss_coef", None)))
        softcap = getattr(policy.config.get_text_config(), "final_logit_softcapping", None)
        self._dualkv_kernel = row_kernel(head, softcap)
        self._dualkv_head = head
        self._dualkv_keep_groups = keep_groups
        self._dualkv_switched: list[torch.nn.Module] = []
        self._dualkv_warned: set[str] = set()
        self._dualkv_warn_batching()

    def _dualkv_warn_batching(self) -> None:
        """Warn where the micro-batches split groups, or where the group shuffle changes the optimizer step."""
        per_step, n = self.args.per_device_train_batch_size, self.num_generations
        if per_step % n != 0:
            self._dualkv_warn("split", f"per_device_train_batch_size ({per_step}) is not a multiple of "
                                       f"num_generations ({n}): some prompt groups are split across micro-batches; "
                                       "each part packs its own copy of the prompt (exact, smaller saving)")
        terms = _micro_batch_terms(self)
        if self._dualkv_keep_groups and self.args.steps_per_generation > 1 and terms:
            self._dualkv_warn("composition", f"{'; '.join(terms)} depend on which rows share a micro-batch, and the "
                                             "group shuffle (keep_groups=True) puts other rows together than TRL's "
                                             "row shuffle: the optimizer steps differ from stock TRL's. "
                                             "keep_groups=False keeps TRL's row shuffle (exact, smaller saving)")

    # ------------------------------------------------------------------ attention state
    def _dualkv_warn(self, key: str, message: str) -> None:
        if key not in self._dualkv_warned:
            self._dualkv_warned.add(key)
            warnings.warn(f"dualkv: {message}", stacklevel=3)

    def _dualkv_attention(self, inner: torch.nn.Module, on: bool) -> bool:
        """Switch ``inner`` to (or back from) the ``"dualkv"`` attention; returns whether it was on."""
        was_on = any(m is inner for m in self._dualkv_switched)
        if on and not was_on:
            register(packed_attention=autocast_packed_attention)   # (re)installed: another stack may swap it
            enable_dualkv(inner)
            self._dualkv_switched.append(inner)
        elif not on and was_on:
            disable_dualkv(inner)
            self._dualkv_switched = [m for m in self._dualkv_switched if m is not inner]
        return was_on

    def _dualkv_all_off(self) -> None:
        for inner in list(self._dualkv_switched):
            self._dualkv_attention(inner, False)

    # ------------------------------------------------------------------ GRPOTrainer seams
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **model_inputs):
        passed = sorted(k for k in _MULTIMODAL if model_inputs.get(k) is not None)
        unknown = sorted(k for k in model_inputs if k not in _MULTIMODAL)
        if passed or unknown:
            raise DualKVTRLError(f"dualkv packs text-only GRPO batches; this log-prob call carries {passed + unknown}")
        if compute_aux_loss:
            raise DualKVTRLError(_aux_loss_refusal(getattr(self, "router_aux_loss_coef", None)))
        inner = innermost_model(model, self.accelerator)
        groups = group_rows(attention_mask, input_ids, input_ids.shape[1] - logits_to_keep)
        if not groups.groups:
            self._dualkv_warn("empty", "a log-prob call whose completions are all empty ran stock TRL")
            self._dualkv_attention(inner, False)
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss)
        was_on = self._dualkv_attention(inner, True)
        try:
            with self.accelerator.autocast():
                logps, entropies = packed_call_logps(
                    model, inner, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                    kernel=self._dualkv_kernel, temperature=self.temperature, with_entropy=compute_entropy,
                    fp32_head=bool(self.args.cast_lm_head_to_fp32), row_groups=groups)
        finally:
            if not torch.is_grad_enabled() and not was_on:   # a backward may follow a grad call: keep it on
                self._dualkv_attention(inner, False)
        return logps, entropies, None

    def _generate(self, prompts):
        self._dualkv_all_off()
        return super()._generate(prompts)

    def _prepare_inputs(self, generation_batch):
        if not self._dualkv_keep_groups:
            return super()._prepare_inputs(generation_batch)
        import trl.trainer.grpo_trainer as grpo_module

        stock = getattr(grpo_module, _STOCK_SHUFFLE)
        setattr(grpo_module, _STOCK_SHUFFLE, group_shuffle)
        try:
            return super()._prepare_inputs(generation_batch)
        finally:
            setattr(grpo_module, _STOCK_SHUFFLE, stock)

    def training_step(self, *args, **kwargs):
        try:
            return super().training_step(*args, **kwargs)
        finally:
            self._dualkv_all_off()

    def prediction_step(self, *args, **kwargs):
        try:
            return super().prediction_step(*args, **kwargs)
        finally:
            self._dualkv_all_off()


_CLASSES: dict[type, type] = {}


def dualkv_trainer_class(cls: type) -> type:
    """The dualkv subclass of a ``GRPOTrainer`` class (itself if it already is one); one class per ``cls``."""
    if issubclass(cls, DualKVGRPOMixin):
        return cls
    if cls not in _CLASSES:
        from trl import GRPOTrainer

        if cls is GRPOTrainer:
            return _make_trainer_class()
        _CLASSES[cls] = type(f"DualKV{cls.__name__}", (DualKVGRPOMixin, cls), {"__module__": __name__})
    return _CLASSES[cls]


def apply_dualkv(trainer: Any, *, head: str = "trl", keep_groups: bool = True) -> Any:
    """Turn dualkv on for a built ``trl.GRPOTrainer`` (or subclass); call before ``trainer.train()``.

    Args:
        trainer: the trainer; its class becomes its dualkv subclass (``DualKV<Class>``).
        head: ``"trl"`` — TRL's own chunked log-prob kernel on the packed rows (stock numerics) — or ``"dualkv"``
            — :func:`dualkv.integration.logprobs.token_logprobs`.
        keep_groups: shuffle the generation batch by prompt group, not by row, so each of the
            ``steps_per_generation`` micro-batches holds whole groups (False: TRL's row shuffle; the packing stays
            exact, groups split over micro-batches just share less). Must be a bool. Changes the optimizer step
            where a loss term is computed per micro-batch (bnpo, ``top_entropy_quantile``, the entropy bonus; a
            warning names them).
    Raises:
        DualKVTRLError: a setting or model dualkv does not support (named); TypeError: ``keep_groups`` not a bool.
    Returns:
        the same trainer.
    """
    check_trl_version()
    from trl import GRPOTrainer

    if not isinstance(trainer, GRPOTrainer):
        raise TypeError(f"apply_dualkv takes a trl.GRPOTrainer; got {type(trainer).__name__} (for a transformers "
                        "model use dualkv.integration.hf.enable_dualkv)")
    if getattr(trainer, "_dualkv_kernel", None) is not None:
        raise RuntimeError("dualkv is already applied to this trainer")
    cls = dualkv_trainer_class(type(trainer))
    previous = trainer.__class__
    trainer.__class__ = cls
    try:
        trainer._dualkv_setup(head, keep_groups)
    except BaseException:
        trainer.__class__ = previous
        raise
    return trainer


def _make_trainer_class() -> type:
    from trl import GRPOTrainer

    class DualKVGRPOTrainer(DualKVGRPOMixin, GRPOTrainer):
        """``trl.GRPOTrainer`` with dualkv on: same arguments, plus ``dualkv_head`` and ``dualkv_keep_groups``
        (see :func:`apply_dualkv`)."""

        def __init__(self, *args, dualkv_head: str = "trl", dualkv_keep_groups: bool = True, **kwargs):
            check_trl_version()
            super().__init__(*args, **kwargs)
            self._dualkv_setup(dualkv_head, dualkv_keep_groups)

    DualKVGRPOTrainer.__module__ = "dualkv.integration.trl"
    DualKVGRPOTrainer.__qualname__ = "DualKVGRPOTrainer"
    _CLASSES[GRPOTrainer] = DualKVGRPOTrainer
    return DualKVGRPOTrainer
