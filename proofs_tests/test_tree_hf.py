"""A tiny random float64 transformers model on a packed prefix tree (from_sequences) vs the stock model run on every
sequence on its own: log-probs, entropy, every parameter gradient and the hidden states of every token at every
layer. The batch has a shared system prompt, two prompts, a response that branches mid-way, a sequence that is a
prefix of another, a duplicate, single-token nodes and a second root. Known-wrong positions and predictors fail."""

import pytest
import torch

from dualkv import GroupLayout, PrefixTreeLayout
from dualkv.integration.hf import apply_dualkv, packed_model_inputs
from dualkv.integration.tree import model_tree_logprobs, tree_logprobs, tree_model_inputs
from dualkv.testing import rel_err, tiny_causal_lm
from dualkv.verify.model_checks import pack_rows, random_rows

BOUND = 1e-10


def tree_batch(vocab: int, seed: int = 0) -> tuple[list[torch.Tensor], list[int]]:
    """Sequences and the start of each one's scored part (its "response")."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(0, vocab, (n,), generator=gen)  # noqa: E731
    system, p1, p2, stem = rand(5), rand(4), rand(1), rand(2)
    seqs = [
        torch.cat([system, p1, rand(3)]),
        torch.cat([system, p1, rand(1)]),
        torch.cat([system, p1, stem, rand(4)]),        # two continuations of one response stem
        torch.cat([system, p1, stem, rand(2)]),
        torch.cat([system, p2, rand(6)]),
        torch.cat([system, p2]),                       # a prefix of the previous sequence
        None,                                          # a duplicate of sequence 0
        rand(7),                                       # another root
    ]
    seqs[6] = seqs[0].clone()
    starts = [9, 9, 9, 9, 6, 1, 9, 1]
    return seqs, starts


def _stats(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


def stock(model, seqs, starts):
    """Every sequence through the stock model on its own: scored log-probs/entropy, hidden states."""
    lps, ents, hidden = [], [], []
    for seq, a in zip(seqs, starts):
        out = model(input_ids=seq[None], output_hidden_states=True)
        lp, ent = _stats(out.logits[0, a - 1:-1], seq[a:])
        lps.append(lp)
        ents.append(ent)
        hidden.append([h[0] for h in out.hidden_states])
    return torch.cat(lps), torch.cat(ents), hidden


def packed(model, index, targets, *, position_ids=None, predictor=None):
    """The model on the packed tree: scored log-probs/entropy (per sequence) and hidden states."""
    inputs = tree_model_inputs(index)
    if position_ids is not None:
        inputs["position_ids"] = position_ids[None]
    out = model(**inputs, output_hidden_states=True)
    pred = targets.predictor_index if predictor is None else predictor
    lp, ent = _stats(out.logits[0, pred], targets.target_ids)
    return targets.unpack(lp), targets.unpack(ent), out.hidden_states


def run_check(arch="qwen3", seed=0, *, head="logits", check_inputs=True, **variant):
    model = tiny_causal_lm(arch, seed=seed)
    seqs, starts = tree_batch(model.config.vocab_size, seed)
    layout, index = PrefixTreeLayout.from_sequences(seqs)
    targets = index.targets(starts)
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(seed + 1)
    n = int(targets.cu_seqlens[-1])
    w_lp, w_ent = torch.randn(n, generator=gen, dtype=torch.float64), torch.randn(n, generator=gen,
                                                                                 dtype=torch.float64)

    lp_ref, ent_ref, hid_ref = stock(model, seqs, starts)
    grads_ref = torch.autograd.grad((lp_ref * w_lp).sum() + (ent_ref * w_ent).sum(), params)
    with apply_dualkv(model, check_inputs=check_inputs):
        if head == "logits":
            lp, ent, hid = packed(model, index, targets, **variant)
        else:
            lp, ent = model_tree_logprobs(model, index, targets=targets, fused=(head == "fused"), chunk_size=5)
            hid = None
        grads = torch.autograd.grad((lp * w_lp).sum() + (ent * w_ent).sum(), params)
    errors = {"logprobs": rel_err(lp, lp_ref), "entropy": rel_err(ent, ent_ref),
              "param grads": max(rel_err(g, r) for g, r in zip(grads, grads_ref))}
    if hid is not None:
        errors["hidden states"] = max(rel_err(hid[layer][0, index[s]], hid_ref[s][layer])
                                      for s in range(len(seqs)) for layer in range(len(hid)))
    return errors, layout


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_sliding", "llama"])
def test_tree_equals_every_sequence_on_its_own(arch):
    errors, layout = run_check(arch)
    assert layout.max_depth >= 3 and len(layout.roots) == 2 and min(layout.node_lens) == 1
    assert all(e <= BOUND for e in errors.values()), errors


@pytest.mark.parametrize("head", ["chunked", "fused"])
def test_tree_log_prob_head(head):
    errors, _ = run_check("qwen3", seed=1, head=head)
    assert all(e <= BOUND for e in errors.values()), errors


def _restart_positions(layout):
    """Positions numbered from 0 in every node (a plausible bug: node-local positions)."""
    return layout.position_ids() - torch.repeat_interleave(torch.tensor(layout.node_starts),
                                                           torch.tensor(layout.node_lens))


def _child_positions_off_by_one(layout):
    pos = layout.position_ids()
    for i, p in enumerate(layout.parents):
        if p >= 0:
            a, b = layout.node_range(i)
            pos[a:b] -= 1
    return pos


@pytest.mark.parametrize("wrong", [_restart_positions, _child_positions_off_by_one])
def test_wrong_positions_are_caught(wrong, monkeypatch):
    model = tiny_causal_lm("qwen3")
    seqs, _ = tree_batch(model.config.vocab_size)
    layout, index = PrefixTreeLayout.from_sequences(seqs)
    import dualkv.integration.hf as hf

    with monkeypatch.context() as patched:  # the numbers with every position check switched off
        patched.setattr(hf, "_check_positions", lambda position_ids, layout: None)
        errors, _ = run_check("qwen3", check_inputs=False, position_ids=wrong(layout))
    assert errors["logprobs"] > 1e-6 and errors["hidden states"] > 1e-6, errors
    inputs = tree_model_inputs(index)
    inputs["position_ids"] = wrong(layout)[None]
    with apply_dualkv(model), pytest.raises(ValueError, match="position_ids do not match"):
        model(**inputs)


def test_child_first_token_from_its_own_row_is_caught():
    model = tiny_causal_lm("qwen3")
    seqs, starts = tree_batch(model.config.vocab_size)
    layout, index = PrefixTreeLayout.from_sequences(seqs)
    targets = index.targets(starts)
    first = torch.tensor([layout.node_starts[i] for i in range(layout.num_nodes)])
    wrong = targets.predictor_index.clone()
    is_first = torch.isin(targets.rows, first)
    assert is_first.any()
    wrong[is_first] = targets.rows[is_first]
    errors, _ = run_check("qwen3", predictor=wrong)
    assert errors["logprobs"] > 1e-6 and errors["hidden states"] <= BOUND, errors


def test_grouped_batch_as_a_tree_matches_the_group_layout_bitwise():
    """A GRPO batch packed by from_sequences (no group ids) is the GroupLayout packing, and the model's logits on
    the tree equal those on the GroupLayout bit for bit."""
    model = tiny_causal_lm("qwen3")
    rows, groups = random_rows((6, 3), ((4, 1, 2), (5, 3)), model.config.vocab_size, 0)
    for i, (p, r) in enumerate(rows):                        # distinct first response tokens within a group
        r[0] = 90 + i % 5
    group_packed = pack_rows(rows, groups)
    layout, index = PrefixTreeLayout.from_sequences([torch.cat(pr) for pr in rows])
    assert isinstance(layout.to_group_layout(), GroupLayout)
    assert layout.to_group_layout().response_lens == group_packed.layout.response_lens
    assert torch.equal(index.packed_ids, group_packed.input_ids)
    with apply_dualkv(model), torch.no_grad():
        a = model(**tree_model_inputs(index)).logits
        b = model(**packed_model_inputs(group_packed)).logits
    assert torch.equal(a, b)


def test_bad_inputs_are_refused():
    model = tiny_causal_lm("qwen3")
    _, index = PrefixTreeLayout.from_sequences([[1, 2, 3], [1, 2, 4]])
    with pytest.raises(TypeError, match="TreeIndex"):
        tree_model_inputs(index.layout)
    with pytest.raises(TypeError, match="TreeTargets"):
        tree_logprobs(torch.zeros(5, 32, dtype=torch.float64), model.lm_head.weight, index)
    with apply_dualkv(model), pytest.raises(ValueError, match=r"start\[0\] = 4"):
        model_tree_logprobs(model, index, start=4)
    with pytest.raises(ValueError, match="model_tree_logprobs needs a model running the 'dualkv' attention"):
        model_tree_logprobs(model, index)   # stock sdpa on the packed tree would attend across its branches


def test_docs_example_runs():
    """The from_sequences example of docs/trees.md runs as written (on a tiny model) and scores what it says."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "trees.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    scope = {"model": tiny_causal_lm("qwen3")}
    exec(compile(code, "docs/trees.md", "exec"), scope)
    assert [t.shape[0] for t in scope["per_sequence"]] == [2, 1, 3, 2, 2]
