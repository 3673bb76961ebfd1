"""Prefix trees in a ``transformers`` model: model inputs and the log-prob head for a packed tree.

A batch of token sequences (a system prompt shared by several prompts, rollouts that branch mid-response, a
multi-turn trace) is packed as its radix trie::

    layout, index = dualkv.PrefixTreeLayout.from_sequences(seqs)
    with apply_dualkv(model):
        logp, entropy = model_tree_logprobs(model, index, start=prompt_lens)

The model runs on the T packed tokens with ``position_ids`` = logical positions (a token of node i continues its
ancestors' positions) and ``dualkv_layout=layout``, so every attention layer calls
:func:`dualkv.shared_prefix_attention` on the tree. The head scores packed token x from the row
``layout.predictor_index[x]``: the previous token of x's node or, for a node's first token, the parent's last token
(one row shared by all of its children). Each packed token is scored once; :meth:`dualkv.tree.TreeTargets.unpack`
reads the values back per sequence, so a token shared by several sequences contributes (and gets gradient) once
per sequence, as in running every sequence on its own.
"""

from __future__ import annotations

import torch

from ..tree import TreeIndex, TreeTargets
from .hf import LAYOUT_KWARG, require_dualkv_attention
from .logprobs import DEFAULT_CHUNK, _head_of, token_logprobs

__all__ = ["tree_model_inputs", "tree_logprobs", "model_tree_logprobs"]


def _check_index(index: object) -> TreeIndex:
    if not isinstance(index, TreeIndex):
        raise TypeError(f"index must be the dualkv.tree.TreeIndex of PrefixTreeLayout.from_sequences, got "
                        f"{type(index).__name__}")
    return index


def tree_model_inputs(index: TreeIndex) -> dict:
    """Forward kwargs for a ``"dualkv"`` model on a packed tree: (1, T) input ids and logical position ids, the
    layout, no cache."""
    index = _check_index(index)
    return {"input_ids": index.packed_ids.unsqueeze(0), "position_ids": index.position_ids.unsqueeze(0),
            LAYOUT_KWARG: index.layout, "use_cache": False}


def tree_logprobs(hidden_states: torch.Tensor, weight: torch.Tensor, targets: TreeTargets, *,
                  temperature: float = 1.0, bias: torch.Tensor | None = None, logit_softcap: float | None = None,
                  chunk_size: int = DEFAULT_CHUNK, with_entropy: bool = True,
                  fused: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the targeted tokens of every sequence of a packed tree.

    Args:
        hidden_states: (T, D) or (1, T, D) final hidden states of the packed tree forward.
        weight: (V, D) ``lm_head`` weight; the other arguments as :func:`dualkv.integration.logprobs.token_logprobs`.
        targets: ``index.targets(start)``: which tokens of which sequences.
    Returns:
        logp, entropy (or None): (sum_s (L_s - start_s),) each, sequence after sequence (``targets.cu_seqlens``
        splits them; ``targets.split`` does).
    """
    if not isinstance(targets, TreeTargets):
        raise TypeError(f"targets must be a dualkv.tree.TreeTargets (index.targets(...)), got "
                        f"{type(targets).__name__}")
    device = hidden_states.device
    logp, entropy = token_logprobs(hidden_states, weight, targets.predictor_index.to(device),
                                   targets.target_ids.to(device), temperature=temperature, bias=bias,
                                   logit_softcap=logit_softcap, chunk_size=chunk_size, with_entropy=with_entropy,
                                   fused=fused)
    return targets.unpack(logp), (targets.unpack(entropy) if entropy is not None else None)


def model_tree_logprobs(model: torch.nn.Module, index: TreeIndex, *, start: "int | list[int]" = 1,
                        targets: TreeTargets | None = None, temperature: float = 1.0,
                        chunk_size: int = DEFAULT_CHUNK, with_entropy: bool = True, fused: bool = False,
                        **forward_kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run a ``"dualkv"`` causal LM's decoder on a packed tree and its head chunk by chunk (no (T x V) logits).

    The model must already run the ``"dualkv"`` attention (:func:`dualkv.integration.hf.enable_dualkv`).
    ``start``: score tokens t >= start[s] of sequence s (e.g. the prompt lengths); or pass ``targets``.
    Returns logp, entropy: (sum_s (L_s - start_s),) sequence after sequence.
    """
    require_dualkv_attention(model, "model_tree_logprobs")
    index = _check_index(index).to(model.device)
    targets = index.targets(start) if targets is None else targets
    out = model.get_decoder()(**tree_model_inputs(index), **forward_kwargs)
    weight, bias, softcap = _head_of(model)
    return tree_logprobs(out.last_hidden_state, weight, targets, temperature=temperature, bias=bias,
                         logit_softcap=softcap, chunk_size=chunk_size, with_entropy=with_entropy, fused=fused)
