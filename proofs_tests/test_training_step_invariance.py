"""Appendix B: the training step's summed gradient does not depend on how rows are ordered or split into
micro-batches, as long as each micro-batch keeps its groups whole."""

import random

import torch

from dualkv.integration.hf import apply_dualkv, packed_model_inputs
from dualkv.testing import rel_err, tiny_causal_lm
from dualkv.verify.model_checks import pack_rows, random_rows


def _summed_grad(model, micro_batches, advantages):
    """GRPO-style surrogate sum_b A_b * sum_t logp_bt, accumulated over micro-batches."""
    params = [p for p in model.parameters()]
    total = [torch.zeros_like(p) for p in params]
    with apply_dualkv(model):
        for rows, groups, adv in micro_batches:
            packed = pack_rows(rows, groups)
            logits = model(**packed_model_inputs(packed)).logits[0]
            logp = torch.log_softmax(logits[packed.predictor_index], -1)
            logp = logp.gather(-1, packed.response_ids[:, None])[:, 0]
            weights = torch.repeat_interleave(torch.tensor(adv, dtype=logp.dtype),
                                              torch.tensor(packed.layout.flat_response_lens))
            for acc, g in zip(total, torch.autograd.grad((weights * logp).sum(), params)):
                acc += g
    return total


def test_permuted_and_resplit_batches_give_the_same_gradient():
    model = tiny_causal_lm("qwen3", dtype=torch.float64)
    rows, groups = random_rows((6, 3, 9), ((2, 4, 1), (3, 3), (1, 2, 5, 2)), model.config.vocab_size, seed=5)
    rng = random.Random(0)
    adv = [rng.uniform(-1, 1) for _ in rows]
    items = list(zip(rows, groups, adv))
    by_group = {}
    for item in items:
        by_group.setdefault(item[1], []).append(item)

    def batch(order_of_groups, shuffle_within=False):
        out = []
        for g in order_of_groups:
            members = list(by_group[g])
            if shuffle_within:
                rng.shuffle(members)
            out.extend(members)
        return [m[0] for m in out], [m[1] for m in out], [m[2] for m in out]

    keys = list(by_group)
    reference = _summed_grad(model, [batch(keys)], adv)
    permuted = _summed_grad(model, [batch(keys[::-1], shuffle_within=True)], adv)
    split = _summed_grad(model, [batch(keys[1:2]), batch([keys[2], keys[0]], shuffle_within=True)], adv)
    for a, b, c in zip(reference, permuted, split):
        assert rel_err(b, a) <= 1e-12
        assert rel_err(c, a) <= 1e-12
