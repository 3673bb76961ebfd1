"""Synthetic inputs for running veRL's workers without a dataset, a tokenizer download or a rollout server (the
CPU tests and ``experiments/policy_update_bench.py``).

* :func:`save_tokenizer` — a word-level tokenizer built offline from its vocabulary list;
* :func:`save_random_model` — a randomly initialised causal LM from a ``transformers`` config, saved where veRL's
  ``HFModelConfig(path=...)`` can load it;
* :func:`rollout_batch` — a veRL ``DataProto`` shaped like the trainer's after rollout: left-padded prompts,
  right-padded responses, masks, position ids, one ``uid`` per prompt group, and (optionally) old/ref log-probs and
  advantages for the loss.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

__all__ = ["SPECIAL_TOKENS", "save_tokenizer", "save_random_model", "rollout_batch"]

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")


def save_tokenizer(path: str | Path, vocab_size: int):
    """Save a word-level fast tokenizer over "<pad> <eos> <unk> t3 ... t{vocab_size-1}" to ``path``; return it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed {len(SPECIAL_TOKENS)}; got {vocab_size}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"t{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(str(path))
    return fast


def save_random_model(path: str | Path, model: torch.nn.Module, tokenizer_vocab: int | None = None) -> str:
    """Save ``model`` (a randomly initialised ``PreTrainedModel``) and a matching tokenizer to ``path``.

    The tokenizer covers ``tokenizer_vocab`` ids (default: the model's vocabulary, capped at 4096 — a veRL run only
    needs its special tokens); its pad/eos ids are written into the model config.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = tokenizer_vocab or min(int(model.config.vocab_size), 4096)
    tokenizer = save_tokenizer(path, vocab)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.bos_token_id = None
    model.save_pretrained(str(path))
    return str(path)


def rollout_batch(groups: Sequence[tuple[int, Sequence[int]]], *, vocab_size: int, seed: int = 0,
                  temperature: float = 1.0, loss_fields: bool = True, uids: Sequence[str] | None = None,
                  system_prompt: int = 0):
    """A veRL ``DataProto`` of prompt groups ``(P, [R_1, ..., R_N])`` with random token ids.

    Every row of a group carries the group's prompt (left-padded to the widest prompt) and its own response
    (right-padded); ``uid`` is one id per group (``uids`` or deterministic UUIDs). With ``loss_fields``,
    ``old_log_probs``, ``ref_log_prob`` (random, <= 0) and ``advantages`` (random) are added for veRL's PPO loss.
    ``system_prompt``: the first min(system_prompt, P) tokens of every prompt are one shared (random) sequence, as a
    system prompt common to every prompt of the batch.
    """
    from verl import DataProto

    g = torch.Generator().manual_seed(seed)
    low = len(SPECIAL_TOKENS)
    # drawn only when asked for, so the other batches keep their tokens
    system = torch.randint(low, vocab_size, (system_prompt,), generator=g) if system_prompt > 0 else None
    p_width = max(p for p, _ in groups)
    r_width = max(max(rs) for _, rs in groups)
    prompts, responses, p_mask, r_mask, row_uids = [], [], [], [], []
    for gi, (p, rs) in enumerate(groups):
        prompt = torch.randint(low, vocab_size, (p,), generator=g)
        if system is not None:
            prompt[:system_prompt] = system[:p]
        uid = uids[gi] if uids is not None else str(uuid.UUID(int=seed * 100_003 + gi))
        for r in rs:
            prompts.append(torch.cat([torch.zeros(p_width - p, dtype=torch.long), prompt]))
            p_mask.append(torch.cat([torch.zeros(p_width - p), torch.ones(p)]))
            responses.append(torch.cat([torch.randint(low, vocab_size, (r,), generator=g),
                                        torch.zeros(r_width - r, dtype=torch.long)]))
            r_mask.append(torch.cat([torch.ones(r), torch.zeros(r_width - r)]))
            row_uids.append(uid)
    prompt_ids, response_ids = torch.stack(prompts), torch.stack(responses)
    attention_mask = torch.cat([torch.stack(p_mask), torch.stack(r_mask)], dim=1).long()
    response_mask = torch.stack(r_mask).long()
    tensors = dict(prompts=prompt_ids, responses=response_ids, input_ids=torch.cat([prompt_ids, response_ids], 1),
                   attention_mask=attention_mask, position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0),
                   response_mask=response_mask)
    if loss_fields:
        rows = prompt_ids.shape[0]
        tensors["old_log_probs"] = -torch.rand(rows, r_width, generator=g) * 4 * response_mask
        tensors["ref_log_prob"] = -torch.rand(rows, r_width, generator=g) * 4 * response_mask
        tensors["advantages"] = torch.randn(rows, r_width, generator=g) * response_mask
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.array(row_uids, dtype=object)},
                               meta_info={"temperature": temperature})
