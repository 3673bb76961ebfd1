"""Log-prob head of a packed micro-batch: per-response-token log-probs and entropy, chunk by chunk.

Response token k of row b is predicted by the packed position ``packed.predictor_index``: for k = 0 the group's
last prompt position (one hidden state shared by the N responses of the group), else the previous response token.
The head gathers those M = ΣR hidden states once and computes, ``chunk_size`` rows at a time,

    z = softcap(h W^T + b) / temperature          (softcap(l) = c tanh(l / c), only when ``logit_softcap`` is set)
    logp = z[target] - logsumexp(z),   entropy = logsumexp(z) - Σ_j p_j z_j

so at most (chunk_size × V) logits exist at once, also in the backward:

* ``fused=False``: each chunk runs under activation checkpointing (autograd recomputes the chunk's logits in the
  backward, one chunk at a time);
* ``fused=True``: one autograd.Function whose backward recomputes each chunk's logits and forms
  d/dz = g_lp (onehot - p) - g_ent p (log p + H) directly; W's gradient is accumulated in float32, each chunk's
  product included (not rounded to bf16 first).

Logits are made in the hidden states' dtype (as ``lm_head`` does) and the softmax runs in float32 (float64 for
float64 inputs). Values come back in row order, (M,); :func:`to_padded` and :func:`to_sequence_layout` put them
into the caller's layouts.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from .._checks import check_head_inputs
from .._gather import gather_rows
from .packing import PackedBatch, unpack_token_values

__all__ = ["DEFAULT_CHUNK", "model_response_logprobs", "packed_logprobs", "to_padded", "to_sequence_layout",
           "token_logprobs"]

#: Rows per chunk: 2048 x 152K-vocab float32 logits is 1.2 GiB.
DEFAULT_CHUNK = 2048


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float,
            softcap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(rows, V) scaled logits z in the statistics dtype, and tanh(l / c) when softcapping (for the backward)."""
    logits = torch.nn.functional.linear(h, weight, bias).to(_stat_dtype(h.dtype))
    tanh = None
    if softcap is not None:
        tanh = torch.tanh(logits / softcap)
        logits = tanh * softcap
    return logits / temperature, tanh


def _chunk_stats(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                 temperature: float, softcap: float | None, with_entropy: bool):
    z, _ = _logits(h, weight, bias, temperature, softcap)
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets[:, None])[:, 0]
    if not with_entropy:
        return logp, None
    return logp, -(logp_all.exp() * logp_all).sum(-1)


# ---------------------------------------------------------------------------------------------- fused path
def _grad_z(z: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor | None, targets: torch.Tensor,
            g_logp: torch.Tensor | None, g_ent: torch.Tensor | None) -> torch.Tensor:
    """d loss / d z for one chunk: g_logp (onehot(target) - p) - g_ent p (log p + H). z (rows, V) is consumed
    (overwritten) so that at most two (rows × V) buffers exist."""
    logp = z.sub_(lse[:, None])
    p = torch.exp(logp)
    if g_ent is not None and entropy is not None:
        grad = logp.add_(entropy[:, None]).mul_(p).mul_(-g_ent[:, None])
        if g_logp is not None:
            grad.sub_(p.mul_(g_logp[:, None]))
    else:
        grad = p.mul_(-g_logp[:, None]) if g_logp is not None else p.zero_()
    if g_logp is not None:
        grad.scatter_add_(-1, targets[:, None], g_logp[:, None])
    return grad


def _accumulate_weight_grad(grad_w: torch.Tensor, grad_rows: torch.Tensor, h_rows: torch.Tensor) -> torch.Tensor:
    """grad_w + grad_rows^T h_rows, with the chunk's product kept at grad_w's precision (float32 for bf16/fp16
    heads): a product rounded to bf16 before the sum would add a 2^-9 relative error per chunk.

    Args:
        grad_w: (V, D) float32 (float64) accumulator; grad_rows: (rows, V) d loss/d logits in the head's dtype;
        h_rows: (rows, D) hidden states in the head's dtype.
    Returns:
        the updated accumulator (in place where the backend allows it).
    """
    if grad_rows.dtype == grad_w.dtype:
        return grad_w.add_(grad_rows.t() @ h_rows)
    if grad_w.is_cuda:  # tensor-core GEMM of the low-precision inputs with a float32 result
        return torch.addmm(grad_w, grad_rows.t(), h_rows, out_dtype=grad_w.dtype)
    return grad_w.addmm_(grad_rows.t().to(grad_w.dtype), h_rows.to(grad_w.dtype))


class _FusedLinearLogprobs(torch.autograd.Function):
    """h (M, D), W (V, D), b (V,) or None -> logp (M,), entropy (M,); never keeps (M × V) logits."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, temperature, softcap, chunk_size, with_entropy):
        stat = _stat_dtype(h.dtype)
        m = h.shape[0]
        logp = torch.empty(m, dtype=stat, device=h.device)
        lse = torch.empty(m, dtype=stat, device=h.device)
        entropy = torch.empty(m, dtype=stat, device=h.device) if with_entropy else None
        for a in range(0, m, chunk_size):
            b = min(m, a + chunk_size)
            z, _ = _logits(h[a:b], weight, bias, temperature, softcap)
            lse[a:b] = torch.logsumexp(z, dim=-1)
            logp[a:b] = z.gather(-1, targets[a:b, None])[:, 0] - lse[a:b]
            if with_entropy:
                entropy[a:b] = lse[a:b] - torch.softmax(z, dim=-1).mul_(z).sum(-1)
            del z
        ctx.save_for_backward(h, weight, bias, targets, lse, entropy)
        ctx.config = (temperature, softcap, chunk_size)
        ctx.set_materialize_grads(False)   # an output the loss does not use gets None: its term is skipped
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        h, weight, bias, targets, lse, entropy = ctx.saved_tensors
        temperature, softcap, chunk_size = ctx.config
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        acc = _stat_dtype(weight.dtype)  # W and b gradients accumulate over chunks in float32 (float64)
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_b and bias is not None else None
        for a in range(0, h.shape[0], chunk_size):
            b = min(h.shape[0], a + chunk_size)
            z, tanh = _logits(h[a:b], weight, bias, temperature, softcap)
            grad = _grad_z(z, lse[a:b], None if entropy is None else entropy[a:b], targets[a:b],
                           None if g_logp is None else g_logp[a:b],
                           None if g_ent is None else g_ent[a:b]).div_(temperature)
            if tanh is not None:
                grad.mul_(tanh.square_().neg_().add_(1.0))
            grad_l = grad.to(h.dtype)
            if grad_h is not None:
                grad_h[a:b] = grad_l @ weight
            if grad_w is not None:
                grad_w = _accumulate_weight_grad(grad_w, grad_l, h[a:b])
            if grad_b is not None:
                grad_b += grad.sum(0).to(grad_b.dtype)
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None, None)


# ---------------------------------------------------------------------------------------------- entry points
def token_logprobs(hidden_states: torch.Tensor, weight: torch.Tensor, predictor_index: torch.Tensor,
                   targets: torch.Tensor, *, temperature: float = 1.0, bias: torch.Tensor | None = None,
                   logit_softcap: float | None = None, chunk_size: int = DEFAULT_CHUNK, with_entropy: bool = True,
                   fused: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob (and entropy) of ``targets[m]`` under the logits of hidden row ``predictor_index[m]``.

    Args:
        hidden_states: (T, D) final hidden states (after the final norm), or (1, T, D).
        weight: (V, D) ``lm_head`` weight; ``bias`` (V,) if the head has one.
        predictor_index: (M,) int64 rows of ``hidden_states``; targets: (M,) token ids.
        temperature: logits are divided by it (veRL's ``logits.div_(temperature)``).
        logit_softcap: the model's final-logit softcapping c (Gemma), applied before the temperature.
        chunk_size: rows per chunk; at most (chunk_size × V) logits exist at once.
        fused: the custom backward that recomputes logits per chunk instead of autograd checkpointing.
    Returns:
        logp (M,), entropy (M,) or None — float32 (float64 for float64 inputs).
    """
    if isinstance(hidden_states, torch.Tensor) and hidden_states.dim() == 3 and hidden_states.shape[0] == 1:
        hidden_states = hidden_states[0]
    check_head_inputs(hidden_states, weight, bias, predictor_index, targets, temperature, chunk_size, logit_softcap)
    h = gather_rows(hidden_states, predictor_index)  # (repeated rows: a group's last prompt position)
    targets = targets.to(torch.int64)
    if fused:
        return _FusedLinearLogprobs.apply(h, weight, bias, targets, float(temperature), logit_softcap, chunk_size,
                                          with_entropy)
    need_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, weight, bias))
    logps, ents = [], []
    for a in range(0, h.shape[0], chunk_size):
        args = (h[a:a + chunk_size], weight, bias, targets[a:a + chunk_size], float(temperature), logit_softcap,
                with_entropy)
        lp, ent = checkpoint(_chunk_stats, *args, use_reentrant=False) if need_grad else _chunk_stats(*args)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)


def packed_logprobs(hidden_states: torch.Tensor, weight: torch.Tensor, packed: PackedBatch, *,
                    temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK, bias: torch.Tensor | None = None,
                    logit_softcap: float | None = None, with_entropy: bool = True,
                    fused: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs/entropy of every response token of a packed micro-batch, in row order: (ΣR,) each.

    ``hidden_states`` (T, D) or (1, T, D) are the final hidden states of the packed forward; this is the entry for
    a fused-kernel path that has hidden states and the ``lm_head`` weight but no logits (veRL's
    ``use_fused_kernels``). Each row's first response token uses its group's shared last-prompt hidden state.
    """
    t = hidden_states.shape[-2] if hidden_states.dim() == 3 else hidden_states.shape[0]
    if t != packed.layout.total_tokens:
        raise ValueError(f"hidden_states have {t} tokens but the packed batch has {packed.layout.total_tokens}")
    device = hidden_states.device
    return token_logprobs(hidden_states, weight, packed.predictor_index.to(device), packed.response_ids.to(device),
                          temperature=temperature, bias=bias, logit_softcap=logit_softcap, chunk_size=chunk_size,
                          with_entropy=with_entropy, fused=fused)


#: Config fields with which a model multiplies its logits (Cohere's logit_scale, Granite's logits_scaling, FalconH1's
#: lm_head_multiplier, ...): the packed head computes plain ``hidden @ W^T``, so any value but 1 is refused.
UNSUPPORTED_LOGIT_SCALES = ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling",
                            "output_multiplier_scale")


def logit_scaling(config: object) -> str | None:
    """``"name=value"`` of the first :data:`UNSUPPORTED_LOGIT_SCALES` field ``config`` sets to anything but 1; None
    when it sets none."""
    for name in UNSUPPORTED_LOGIT_SCALES:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            return f"{name}={value}"
    return None


def _head_of(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, float | None]:
    """(weight, bias, final-logit softcap) of a causal LM's output head; refuses heads it would get wrong."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        raise NotImplementedError(f"{type(model).__name__} has no nn.Linear output head (get_output_embeddings())")
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if scaled := logit_scaling(config):
        raise NotImplementedError(f"{type(model).__name__} scales its logits ({scaled}); the dualkv log-prob head "
                                  "does not")
    return head.weight, head.bias, getattr(config, "final_logit_softcapping", None)


def model_response_logprobs(model: torch.nn.Module, packed: PackedBatch, *, temperature: float = 1.0,
                            chunk_size: int = DEFAULT_CHUNK, with_entropy: bool = True, fused: bool = False,
                            **forward_kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run a ``"dualkv"`` causal LM's decoder on ``packed`` and its head chunk by chunk (no (T × V) logits).

    The model must already run the ``"dualkv"`` attention (:func:`dualkv.integration.hf.enable_dualkv`); any other
    attention is refused (it would attend across the packed rows).
    Returns logp, entropy: (ΣR,) in row order (see :func:`to_padded`).
    """
    from .hf import packed_model_inputs, require_dualkv_attention

    require_dualkv_attention(model, "model_response_logprobs")
    decoder = model.get_decoder()
    out = decoder(**packed_model_inputs(packed.to(model.device)), **forward_kwargs)
    weight, bias, softcap = _head_of(model)
    return packed_logprobs(out.last_hidden_state, weight, packed, temperature=temperature, chunk_size=chunk_size,
                           bias=bias, logit_softcap=softcap, with_entropy=with_entropy, fused=fused)


# ---------------------------------------------------------------------------------------------- layouts back
def to_padded(values: torch.Tensor, packed: PackedBatch, pad_value: float = 0.0) -> torch.Tensor:
    """(ΣR,) row-order values -> (B, response_width) right-padded, entry [b, k] for row b's response token k."""
    return unpack_token_values(values, packed, pad_value)


def to_sequence_layout(values: torch.Tensor, packed: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(ΣR,) row-order values -> (Σ_b (P_b + R_b),) in the N-copy row layout, and its (B + 1,) cu_seqlens.

    Row b's value for response token k sits at offset P_b - 1 + k of its row (the position whose output predicts
    that token — veRL's ``values[off - R - 1 : off - 1]``); the other positions are 0.
    """
    layout = packed.layout
    cu = layout.copy_cu_seqlens
    if not isinstance(values, torch.Tensor) or values.dim() < 1 or values.shape[0] != layout.total_response_tokens:
        raise ValueError(f"values must have {layout.total_response_tokens} rows (one per response token, row order); "
                         f"got {tuple(getattr(values, 'shape', ()))}")
    starts = [int(cu[b]) + layout.prompt_lens[g] - 1 for b, g in enumerate(layout.response_group)]
    index = np.concatenate([np.arange(s, s + r) for s, r in zip(starts, layout.flat_response_lens)])
    out = values.new_zeros((int(cu[-1]), *values.shape[1:]))
    out[torch.from_numpy(index).to(values.device)] = values
    return out, torch.from_numpy(cu).to(values.device)
