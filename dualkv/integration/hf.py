"""HuggingFace ``transformers`` attention backend ``"dualkv"``.

A model whose attention implementation is ``"dualkv"`` runs on a P+ΣR packed micro-batch: pass
``input_ids``/``position_ids`` of shape (1, T) and ``dualkv_layout=packed.layout`` to its forward (see
:func:`packed_model_inputs`). Every attention layer then calls :func:`dualkv.shared_prefix_attention`, which picks
the CUDA kernels for CUDA fp16/bf16 tensors and the reference otherwise. Norms, projections, RoPE and MLP are the
model's own and simply run on the T = P+ΣR packed tokens.

Importing this module registers ``"dualkv"`` with ``transformers.AttentionInterface`` (and its mask function with
``AttentionMaskInterface``), so ``from_pretrained(..., attn_implementation="dualkv")`` works; :func:`enable_dualkv` /
:func:`disable_dualkv` (for trainers that build the model once) and the :func:`apply_dualkv` context manager switch
a built model.

A model built that way validates its inputs itself, without :func:`enable_dualkv`'s input hook: the attention
compares the ``position_ids`` it receives with the layout (RoPE is applied before it runs, so positions cannot be
derived there; omitted ones, which ``transformers`` numbers 0..T-1, are refused), and the mask function refuses a
padding ``attention_mask`` and a KV cache that holds earlier tokens (``transformers`` drops masks of custom
attentions otherwise). The position tensor is read once per forward (all layers share it).

Per layer the backend reads from what ``transformers`` passes: GQA from the key/value head count, the head dim
from the tensors (per-layer head dims, e.g. Gemma 4's 256/512), the ``scaling`` the layer uses, and the sliding
window. HF's window W means a query at position i sees keys in (i - W, i] (``masking_utils.sliding_window_overlay``
and its FlashAttention path ``window_size=(W - 1, W - 1)``), i.e. FlashAttention's left = W - 1. Attention logit
softcapping, attention dropout in training, attention sinks, non-causal layers, cross/cached attention and chunked
layers are refused with an error naming the feature.

Sequence parallelism wraps the packed attention: :func:`make_attention_forward` builds the interface function
around any ``(q, k, v, layout, softmax_scale=, window_size=) -> out`` callable, and :func:`register` installs it.
"""

from __future__ import annotations

import math
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol

import torch

from .. import shared_prefix_attention
from ..layout import GroupLayout
from ..tree import PrefixTreeLayout
from .packing import PackedBatch

ATTN_NAME = "dualkv"
LAYOUT_KWARG = "dualkv_layout"
#: What ``dualkv_layout`` may be: a shared-prompt packing or a prefix tree (dualkv.integration.tree).
LAYOUT_TYPES = (GroupLayout, PrefixTreeLayout)

__all__ = ["ATTN_NAME", "LAYOUT_KWARG", "PackedAttention", "apply_dualkv", "disable_dualkv",
           "dualkv_attention_forward", "enable_dualkv", "hf_window", "make_attention_forward",
           "packed_model_inputs", "register", "require_dualkv_attention"]


class PackedAttention(Protocol):
    """The packed attention a backend runs: q (T, H, d), k/v (T, H_k, d) -> out (T, H, d)."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: GroupLayout, *,
                 softmax_scale: float, window_size: tuple[int, int]) -> torch.Tensor: ...


def hf_window(sliding_window: int | None) -> tuple[int, int]:
    """FlashAttention-style (left, right) window of an HF ``sliding_window`` W: keys in (i - W, i] -> (W - 1, 0)."""
    if sliding_window is None or sliding_window is False:
        return (-1, -1)
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
        raise ValueError(f"sliding_window must be a positive int (HF semantics: keys in (i - W, i]); got "
                         f"{sliding_window!r}")
    return (sliding_window - 1, 0)


def _layer_name(module: torch.nn.Module) -> str:
    idx = getattr(module, "layer_idx", None)
    return f"{type(module).__name__}" + (f" (layer {idx})" if idx is not None else "")


#: ``config.layer_types`` entries the packed attention serves. Any other (``linear_attention``, ``chunked_attention``,
#: a mamba or conv block) mixes tokens outside the attention interface, across the packed rows.
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")


def _check_layer_type(module: torch.nn.Module, sliding_window: int | None) -> None:
    """Cross-check the window against the layer's declared type in its config (``config.layer_types``)."""
    config = getattr(module, "config", None)
    layer_types = getattr(config, "layer_types", None)
    idx = getattr(module, "layer_idx", None)
    if not layer_types or idx is None or idx >= len(layer_types):
        return
    kind = layer_types[idx]
    if kind == "sliding_attention" and not sliding_window:
        raise ValueError(f"{_layer_name(module)} is a sliding_attention layer but no sliding_window reached the "
                         f"'{ATTN_NAME}' attention; refusing to run it as full attention")
    if kind == "full_attention" and sliding_window:
        raise ValueError(f"{_layer_name(module)} is a full_attention layer but got sliding_window={sliding_window}")
    if kind not in ATTENTION_LAYER_TYPES:
        raise NotImplementedError(f"{_layer_name(module)} has layer type {kind!r}; the '{ATTN_NAME}' attention "
                                  "supports full_attention and sliding_attention layers")


def _refuse_unsupported(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                        attention_mask: Any, dropout: float, softcap: float | None, kwargs: dict) -> None:
    """Raise for every feature the packed attention would silently get wrong."""
    name = _layer_name(module)
    if query.dim() != 4 or key.dim() != 4:
        raise ValueError(f"{name}: expected query/key of shape (batch, heads, tokens, head_dim); got "
                         f"{tuple(query.shape)} and {tuple(key.shape)}")
    if query.shape[0] != 1:
        raise ValueError(f"the '{ATTN_NAME}' attention takes one packed sequence (batch size 1); got batch size "
                         f"{query.shape[0]}. Pack the rows with dualkv.integration.packing.pack_padded/pack_varlen")
    if key.shape[2] != query.shape[2]:
        raise NotImplementedError(f"{name}: {query.shape[2]} queries but {key.shape[2]} keys; the '{ATTN_NAME}' "
                                  "attention is self-attention over one packed micro-batch (no KV cache, no "
                                  "cross-attention). Call the model with use_cache=False")
    if attention_mask is not None:
        raise ValueError(f"the '{ATTN_NAME}' attention builds its mask from the layout; got an attention_mask "
                         f"({type(attention_mask).__name__}). Pass attention_mask=None (padding is removed by packing)")
    if dropout and module.training:
        raise NotImplementedError(f"{name}: attention dropout ({dropout}) in training is not supported by the "
                                  f"'{ATTN_NAME}' attention; set config.attention_dropout = 0")
    if softcap:
        raise NotImplementedError(f"{name}: attention logit softcapping ({softcap}) is not supported by the "
                                  f"'{ATTN_NAME}' attention")
    sinks = kwargs.get("s_aux", None)
    if sinks is None:
        sinks = getattr(module, "sinks", None)
    if sinks is not None:
        raise NotImplementedError(f"{name}: attention sinks are not supported by the '{ATTN_NAME}' attention")
    if getattr(module, "is_causal", True) is False:
        raise NotImplementedError(f"{name} is not causal (bidirectional attention); the '{ATTN_NAME}' attention is "
                                  "causal shared-prompt attention")


def _default_packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: GroupLayout, *,
                              softmax_scale: float, window_size: tuple[int, int]) -> torch.Tensor:
    return shared_prefix_attention(q, k, v, layout, softmax_scale=softmax_scale, window_size=window_size)


def make_attention_forward(packed_attention: PackedAttention = _default_packed_attention) -> Callable:
    """An ``AttentionInterface`` function that validates what ``transformers`` passes and runs ``packed_attention``.

    The returned function takes query (1, H, T, d), key/value (1, H_k, T, d) and returns ((1, T, H, d), None).
    ``packed_attention`` receives (T, H, d)/(T, H_k, d) views, the layout from the forward kwargs, the layer's
    scale and its (left, right) window; a sequence-parallel wrapper may see T/sp tokens per rank and gather them.
    """

    def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: Any, scaling: float | None = None, dropout: float = 0.0,
                          sliding_window: int | None = None, softcap: float | None = None,
                          **kwargs) -> tuple[torch.Tensor, None]:
        layout = kwargs.get(LAYOUT_KWARG)
        if not isinstance(layout, LAYOUT_TYPES):
            raise ValueError(f"attn_implementation='{ATTN_NAME}' needs the packed layout: call the model with "
                             f"{LAYOUT_KWARG}=packed.layout (see dualkv.integration.hf.packed_model_inputs); got "
                             f"{type(layout).__name__}")
        _refuse_unsupported(module, query, key, attention_mask, dropout, softcap, kwargs)
        _check_layer_type(module, sliding_window)
        if query.shape[2] == layout.total_tokens and not torch.compiler.is_compiling():
            # The whole packed stream (a sequence-parallel rank holds a slice: its caller checks positions). RoPE
            # was applied already, so positions cannot be derived here: wrong ones are refused.
            _check_positions(kwargs.get("position_ids"), layout)
        window = hf_window(sliding_window)
        scale = (1.0 / math.sqrt(query.shape[-1])) if scaling is None else float(scaling)
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
        out = packed_attention(q, k, v, layout, softmax_scale=scale, window_size=window)
        return out.unsqueeze(0), None

    attention_forward.__doc__ = make_attention_forward.__doc__
    attention_forward._dualkv_packed = True  # what require_dualkv_attention looks for
    return attention_forward


#: The default ``"dualkv"`` interface function (``dualkv.shared_prefix_attention`` per layer).
dualkv_attention_forward = make_attention_forward()


def register(packed_attention: PackedAttention | None = None, name: str = ATTN_NAME) -> Callable:
    """Register ``name`` with ``transformers.AttentionInterface`` (idempotent); returns the registered function.

    With ``packed_attention`` (e.g. a Ulysses wrapper around :func:`dualkv.shared_prefix_attention`), that callable
    replaces the default per-layer attention for every model using ``name``.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    fn = dualkv_attention_forward if packed_attention is None else make_attention_forward(packed_attention)
    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, dualkv_mask)
    return fn


def _ensure_registered() -> None:
    """Register the default ``"dualkv"`` function unless one (possibly a wrapper from :func:`register`) is there."""
    from transformers import AttentionInterface

    if ATTN_NAME not in AttentionInterface._global_mapping:
        register()


#: Class-name fragments of token mixers that do not go through the attention interface (hybrid and recurrent models:
#: Jamba / Bamba / FalconH1 / Zamba mamba mixers, Qwen3-Next's gated delta net, LFM2's short convolutions, RWKV).
FOREIGN_MIXERS = ("Mamba", "Mixer", "DeltaNet", "LinearAttention", "ShortConv", "Rwkv")


def check_token_mixers(model: torch.nn.Module, what: str) -> None:
    """Raise when ``model`` mixes tokens anywhere but in its attention layers: such a layer would run over the whole
    packed stream, so a response would see the other responses' tokens (silently wrong values). A model that passed
    is remembered (the log-prob heads call this on every micro-batch; the module scan is done once)."""
    if model in _MIXERS_CHECKED:
        return
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None) or ()
    other = sorted({str(kind) for kind in layer_types} - set(ATTENTION_LAYER_TYPES))
    if other:
        raise NotImplementedError(f"{what}: {type(model).__name__} has {', '.join(other)} layers (config.layer_types); "
                                  f"the '{ATTN_NAME}' packing supports models whose only token mixers are "
                                  f"{' / '.join(ATTENTION_LAYER_TYPES)} layers")
    for name, module in model.named_modules():
        kind = type(module).__name__
        if any(fragment in kind for fragment in FOREIGN_MIXERS):
            raise NotImplementedError(f"{what}: {type(model).__name__} mixes tokens outside attention ({name}: {kind}); "
                                      f"the '{ATTN_NAME}' packing would let it run across the packed rows")
    _MIXERS_CHECKED.add(model)


_MIXERS_CHECKED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # models check_token_mixers passed


def require_dualkv_attention(model: torch.nn.Module, what: str) -> None:
    """Raise unless ``model``'s attention is a ``"dualkv"`` packed attention (the one :func:`enable_dualkv`
    installs, or any function :func:`register` made): another attention run on a packed micro-batch attends
    across its rows and gives silently wrong results."""
    config = getattr(model, "config", None)
    name = getattr(config, "_attn_implementation", None)
    fn = None
    if isinstance(name, str):
        try:
            from transformers import AttentionInterface

            fn = AttentionInterface._global_mapping.get(name)
        except ImportError:  # pragma: no cover - a model with a config is a transformers model
            fn = None
    if not getattr(fn, "_dualkv_packed", False):
        raise ValueError(f"{what} needs a model running the '{ATTN_NAME}' attention, but {type(model).__name__} runs "
                         f"{name!r}: on a packed micro-batch it would attend across the packed rows and return wrong "
                         "values. Call dualkv.integration.hf.enable_dualkv(model) first (or use apply_dualkv)")
    check_token_mixers(model, what)


# ---------------------------------------------------------------------------------------------- model switching
_HOOK_ATTR = "_dualkv_state"


def _hook_target(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose forward sees the token inputs (the decoder), so both ``model(...)`` and
    ``model.get_decoder()(...)`` are checked."""
    get_decoder = getattr(model, "get_decoder", None)
    if callable(get_decoder):
        try:
            decoder = get_decoder()
        except (AttributeError, NotImplementedError, ValueError):
            decoder = None
        if isinstance(decoder, torch.nn.Module):
            return decoder
    return model


class _PositionCheck:
    """Checks packed ``position_ids`` against a layout, reading the (T,) tensor once per (tensor, version, layout):
    the model-input hook and every attention layer of one forward see the same tensor, so only the first check
    reads it (one host sync per forward)."""

    def __init__(self) -> None:
        self._last: tuple[weakref.ref, int, weakref.ref] | None = None  # (positions, their version, layout)
        self._lock = threading.Lock()

    def __call__(self, position_ids: Any, layout: GroupLayout) -> None:
        if position_ids is None:
            raise ValueError(f"a '{ATTN_NAME}' forward needs position_ids=packed.position_ids[None] (each response "
                             "continues its prompt's positions); without them RoPE would number the packed stream "
                             "0..T-1")
        if not isinstance(position_ids, torch.Tensor):
            raise TypeError(f"position_ids must be a tensor; got {type(position_ids).__name__}")
        with self._lock:
            last = self._last
        if last is not None and last[0]() is position_ids and last[1] == position_ids._version \
                and last[2]() is layout:
            return
        expected = layout.device_tensors(position_ids.device)["position_ids"]
        flat = position_ids.reshape(-1)
        if flat.shape != expected.shape or not torch.equal(flat.to(expected.dtype), expected):
            raise ValueError(f"position_ids do not match the packed layout {layout!r}: expected the layout's "
                             "logical positions (layout.position_ids(): prompt 0..P-1 and each response P..P+R-1; "
                             "in a prefix tree each node continues its parent's positions)")
        with self._lock:
            self._last = (weakref.ref(position_ids), position_ids._version, weakref.ref(layout))


_check_positions = _PositionCheck()


def _check_padding_mask(mask: Any) -> None:
    """A 2-D mask is accepted only when it masks nothing (packing removed the padding)."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or not bool(mask.bool().all()):
        raise ValueError(f"a '{ATTN_NAME}' forward takes no padding mask (packing removed the padding); pass "
                         "attention_mask=None")


def dualkv_mask(*, batch_size: int = 1, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
                attention_mask: torch.Tensor | None = None, **_: Any) -> None:
    """The ``AttentionMaskInterface`` entry of ``"dualkv"``: the attention builds its mask from the layout, so this
    returns None; it refuses what ``transformers`` would otherwise drop silently for a custom attention — a padding
    mask (a 2-D ``attention_mask`` with zeros) and a KV cache holding earlier tokens."""
    if kv_length != q_length or (isinstance(kv_offset, int) and kv_offset != 0):
        raise NotImplementedError(f"the '{ATTN_NAME}' attention runs one packed micro-batch without a KV cache "
                                  f"({q_length} new tokens but {kv_length} keys: the cache holds earlier tokens). "
                                  "Call the model with use_cache=False / past_key_values=None")
    _check_padding_mask(attention_mask)
    return None


class _InputCheck:
    """Forward pre-hook: the token inputs of a ``"dualkv"`` forward must match the layout it carries.

    Catches at the model's input what would otherwise be silently wrong: missing or non-packed ``position_ids``
    (RoPE would see 0..T-1), a padding ``attention_mask``, a token count that is not the layout's. The attention
    layers check positions as well (:func:`make_attention_forward`); the shared :data:`_check_positions` reads the
    tensor once per forward.
    """

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        layout = kwargs.get(LAYOUT_KWARG)
        if layout is None:
            raise ValueError(f"this model runs the '{ATTN_NAME}' attention: call it with {LAYOUT_KWARG}=packed.layout "
                             "and the packed input/position ids (dualkv.integration.hf.packed_model_inputs(packed)), "
                             "or disable_dualkv(model) first")
        if not isinstance(layout, LAYOUT_TYPES):
            raise TypeError(f"{LAYOUT_KWARG} must be a dualkv.GroupLayout or PrefixTreeLayout; got "
                            f"{type(layout).__name__}")
        tokens = kwargs.get("input_ids", args[0] if args else None)
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")
        if tokens is not None:
            if tokens.dim() < 2 or tokens.shape[0] != 1 or tokens.shape[1] != layout.total_tokens:
                raise ValueError(f"packed inputs must have shape (1, {layout.total_tokens}, ...) for {layout!r}; got "
                                 f"{tuple(tokens.shape)}")
        _check_padding_mask(kwargs.get("attention_mask"))
        _check_positions(kwargs.get("position_ids"), layout)


def enable_dualkv(model: torch.nn.Module, *, check_inputs: bool = True) -> torch.nn.Module:
    """Switch a built ``transformers`` model to the ``"dualkv"`` attention until :func:`disable_dualkv`.

    Args:
        model: a ``PreTrainedModel`` whose attention goes through ``AttentionInterface``.
        check_inputs: install a forward pre-hook that checks every forward's packed inputs against its layout
            (token count, position ids, no padding mask). Turn off only where the caller slices the inputs itself
            (sequence parallelism).
    Returns:
        the model (switched in place).
    """
    if getattr(model, _HOOK_ATTR, None) is not None:
        raise RuntimeError("dualkv is already enabled on this model")
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_attn_implementation"):
        raise TypeError(f"enable_dualkv needs a transformers PreTrainedModel; got {type(model).__name__}")
    check_token_mixers(model, "enable_dualkv")
    _ensure_registered()
    previous = config._attn_implementation
    model.set_attn_implementation(ATTN_NAME)
    if config._attn_implementation != ATTN_NAME:
        raise NotImplementedError(f"{type(model).__name__} does not let transformers switch its attention "
                                  f"implementation (still {config._attn_implementation!r})")
    handle = None
    if check_inputs:
        handle = _hook_target(model).register_forward_pre_hook(_InputCheck(), with_kwargs=True)
    setattr(model, _HOOK_ATTR, (previous, handle))
    return model


def disable_dualkv(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`enable_dualkv`: restore the model's previous attention implementation and remove the check."""
    state = getattr(model, _HOOK_ATTR, None)
    if state is None:
        raise RuntimeError("dualkv is not enabled on this model (enable_dualkv was not called)")
    previous, handle = state
    if handle is not None:
        handle.remove()
    model.set_attn_implementation(previous)
    setattr(model, _HOOK_ATTR, None)
    return model


@contextmanager
def apply_dualkv(model: torch.nn.Module, *, check_inputs: bool = True) -> Iterator[torch.nn.Module]:
    """Run an already built model with the ``"dualkv"`` attention inside the block, then restore its own.

    Keep the backward inside the block too when gradient checkpointing is on: it re-runs the attention.
    """
    enable_dualkv(model, check_inputs=check_inputs)
    try:
        yield model
    finally:
        disable_dualkv(model)


def packed_model_inputs(packed: PackedBatch) -> dict:
    """Forward kwargs for a ``"dualkv"`` model: (1, T) input and position ids, the layout, no cache."""
    return {"input_ids": packed.input_ids.unsqueeze(0), "position_ids": packed.position_ids.unsqueeze(0),
            LAYOUT_KWARG: packed.layout, "use_cache": False}


try:  # importing this module makes attn_implementation="dualkv" available (transformers is an optional extra)
    register()
except ImportError:
    pass
