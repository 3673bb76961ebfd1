"""dualkv in TRL 1.16's GRPOTrainer against stock TRL on a tiny random Qwen3 (float32, CPU, nothing downloaded).

Two trainers from the same saved model and seed run the same steps; every log-prob call TRL makes (policy with
entropy, old, reference), every loss and the accumulated gradient of every parameter before each optimizer step
must agree to 1e-5 relative. Generation runs stock in both, so the completions are the same tokens (checked).

Micro-batch composition: with ``keep_groups=False`` dualkv keeps TRL's row shuffle, so both trainers see the same
rows in every micro-batch (split groups included); with ``keep_groups=True`` (the default) the reference is stock
TRL with the same group shuffle, or — where only the optimizer step is compared — stock TRL itself.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("datasets")

from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from dualkv.integration import trl as dkv_trl  # noqa: E402
from dualkv.integration.trl import DualKVTRLError, apply_dualkv  # noqa: E402
from dualkv.integration.trl.rows import group_shuffle  # noqa: E402

VOCAB = 16          # small: EOS (1 of 16) ends many completions, so lengths and padding vary
RTOL = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from proofs_tests.verl_fixtures.synthetic import save_random_model
    from dualkv.testing import tiny_causal_lm

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return save_random_model(tmp_path_factory.mktemp("trl_qwen3"),
                             tiny_causal_lm("qwen3", dtype=torch.float32, vocab=VOCAB, tie_word_embeddings=False))


def _dataset(count=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 10, (count,), generator=gen).tolist()
    return Dataset.from_dict({"prompt": [" ".join(f"t{int(t)}" for t in torch.randint(3, VOCAB, (n,), generator=gen))
                                         for n in lengths]})


def even_token_reward(completions, **kwargs):
    """Fraction of completion tokens with an even id: varies across a group, so advantages are non-zero."""
    return [sum(int(t[1:]) % 2 == 0 for t in c.split()) / max(1, len(c.split())) for c in completions]


class GroupShuffleGRPOTrainer(GRPOTrainer):
    """Stock TRL with only dualkv's group-preserving shuffle: the reference for keep_groups=True micro-batches."""

    def _prepare_inputs(self, generation_batch):
        import trl.trainer.grpo_trainer as module

        stock, module.shuffle_sequence_dict = module.shuffle_sequence_dict, group_shuffle
        try:
            return super()._prepare_inputs(generation_batch)
        finally:
            module.shuffle_sequence_dict = stock


class Recorder(TrainerCallback):
    """Per log-prob call: (row keys, logps, entropies) sorted by row content; per optimizer step: all gradients."""

    def __init__(self, trainer):
        self.calls, self.grads, self.losses = [], [], []
        self.attention_in_generation = []
        logps, loss, generate = (trainer._get_per_token_logps_and_entropies, trainer.compute_loss,
                                 trainer._generate_single_turn)
        inner = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model

        def spy_logps(model, input_ids, attention_mask, *args, **kwargs):
            out = logps(model, input_ids, attention_mask, *args, **kwargs)
            keys = [tuple((ids * m).tolist()) for ids, m in zip(input_ids, attention_mask)]
            order = sorted(range(len(keys)), key=keys.__getitem__)
            ent = None if out[1] is None else out[1].detach()[order].clone()
            self.calls.append(([keys[i] for i in order], out[0].detach()[order].clone(), ent))
            return out

        def spy_loss(*args, **kwargs):
            value = loss(*args, **kwargs)
            self.losses.append(value.detach().clone())
            return value

        def spy_generate(*args, **kwargs):
            self.attention_in_generation.append(inner.config._attn_implementation)
            return generate(*args, **kwargs)

        trainer._get_per_token_logps_and_entropies = spy_logps
        trainer.compute_loss = spy_loss
        trainer._generate_single_turn = spy_generate
        trainer.add_callback(self)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})


def make_trainer(model_dir, tmp_path, kind, *, peft=False, steps=2, dualkv_options=None, **config):
    """kind: "stock", "group-stock" (stock + group shuffle), "dualkv" (apply_dualkv) or "subclass"."""
    settings = dict(output_dir=str(tmp_path / kind), per_device_train_batch_size=4, num_generations=2,
                    max_completion_length=6, max_steps=steps, learning_rate=1e-3, max_grad_norm=0.0, use_cpu=True,
                    bf16=False, report_to=[], logging_steps=1, seed=0, save_strategy="no", disable_tqdm=True,
                    model_init_kwargs={"dtype": torch.float32})
    settings.update(config)
    kwargs = dict(model=model_dir, reward_funcs=even_token_reward, args=GRPOConfig(**settings),
                  train_dataset=_dataset())
    if peft:
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                                           lora_dropout=0.0)
    options = dualkv_options or {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "subclass":
            trainer = dkv_trl.DualKVGRPOTrainer(**kwargs, **{f"dualkv_{k}": v for k, v in options.items()})
        else:
            trainer = (GroupShuffleGRPOTrainer if kind == "group-stock" else GRPOTrainer)(**kwargs)
            if kind == "dualkv":
                apply_dualkv(trainer, **options)
    return trainer, Recorder(trainer)


def _assert_rel(actual, expected, what):
    scale = expected.abs().max().clamp_min(1e-12)
    err = (actual - expected).abs().max()
    assert err <= RTOL * scale, f"{what}: max |diff| {err.item():.3e} > {RTOL} x {scale.item():.3e}"


def assert_parity(got: Recorder, ref: Recorder, *, calls=True):
    assert len(got.grads) == len(ref.grads) > 0
    if calls:
        assert len(got.calls) == len(ref.calls) > 0 and len(got.losses) == len(ref.losses)
        for i, ((keys, lp, ent), (ref_keys, ref_lp, ref_ent)) in enumerate(zip(got.calls, ref.calls)):
            assert keys == ref_keys, f"call {i}: the two runs scored different rows (generations diverged)"
            _assert_rel(lp, ref_lp, f"call {i} log-probs")
            assert (ent is None) == (ref_ent is None)
            if ent is not None:
                _assert_rel(ent, ref_ent, f"call {i} entropies")
        for i, (loss, ref_loss) in enumerate(zip(got.losses, ref.losses)):
            # on-policy the loss is O(1) terms that cancel (advantages sum to 0 per group): fp32 floor ~1e-7 absolute
            torch.testing.assert_close(loss, ref_loss, rtol=RTOL, atol=1e-6, msg=f"loss {i}")
    nonzero = 0
    for step, (grads, ref_grads) in enumerate(zip(got.grads, ref.grads)):
        assert grads.keys() == ref_grads.keys()
        for name, g in grads.items():
            ref_g = ref_grads[name]
            err = (g - ref_g).norm()
            assert err <= RTOL * ref_g.norm() + 1e-12, \
                f"step {step} grad {name}: |diff| {err.item():.3e} vs |grad| {ref_g.norm().item():.3e}"
            nonzero += bool(ref_g.norm() > 0)
    assert nonzero > 0, "every gradient is zero: the comparison would be vacuous"


def _run_pair(model_dir, tmp_path, ref_kind="stock", *, dualkv_kind="dualkv", dualkv_options=None, **config):
    ref_trainer, ref = make_trainer(model_dir, tmp_path, ref_kind, **config)
    ref_trainer.train()
    trainer, got = make_trainer(model_dir, tmp_path, dualkv_kind, dualkv_options=dualkv_options, **config)
    trainer.train()
    return trainer, got, ref


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo", "luspo"])
def test_every_loss_type_matches_stock(model_dir, tmp_path, loss_type):
    extra = {"importance_sampling_level": "sequence"} if loss_type == "luspo" else {}
    trainer, got, ref = _run_pair(model_dir, tmp_path, loss_type=loss_type, **extra)
    assert_parity(got, ref)
    assert type(trainer).__name__ == "DualKVGRPOTrainer"
    assert got.attention_in_generation == ["sdpa", "sdpa"]          # generation runs the model's own attention
    assert trainer.model.config._attn_implementation == "sdpa"       # and so does everything after a step


def test_old_and_ref_logps_split_groups_gradient_accumulation(model_dir, tmp_path):
    """num_iterations=2 (old log-probs), beta>0 with a reference model, 2 micro-batches per generation and per
    optimizer step, 3 rows per micro-batch with N=2 (groups split between micro-batches), TRL's row shuffle."""
    plain, _ = make_trainer(model_dir, tmp_path, "stock", per_device_train_batch_size=3, steps_per_generation=2)
    with pytest.warns(UserWarning, match="not a multiple of num_generations"):
        apply_dualkv(plain)
    trainer, got, ref = _run_pair(model_dir, tmp_path, per_device_train_batch_size=3, num_iterations=2, beta=0.04,
                                  gradient_accumulation_steps=2, steps_per_generation=2, loss_type="grpo",
                                  temperature=0.7, dualkv_options={"keep_groups": False})
    assert trainer.ref_model is not None
    assert_parity(got, ref)


def test_group_shuffle_with_steps_per_generation(model_dir, tmp_path):
    """keep_groups=True: whole groups per micro-batch; reference: stock TRL with the same shuffle."""
    _, got, ref = _run_pair(model_dir, tmp_path, "group-stock", dualkv_kind="subclass", num_iterations=2, beta=0.04,
                            gradient_accumulation_steps=2, steps_per_generation=2, steps=3)
    assert_parity(got, ref)


def test_group_shuffle_optimizer_steps_match_plain_stock(model_dir, tmp_path):
    """The group shuffle changes which rows share a micro-batch, not the accumulated gradient of a dapo step
    (steps_per_generation = gradient_accumulation_steps): the optimizer steps match stock TRL itself."""
    _, got, ref = _run_pair(model_dir, tmp_path, gradient_accumulation_steps=2, steps_per_generation=2)
    assert_parity(got, ref, calls=False)


def test_peft_reference_truncated_completions_entropy_terms(model_dir, tmp_path):
    """LoRA policy, reference = adapter disabled (beta > 0), truncated completions masked (rows with no completion
    token), high-entropy token mask and entropy bonus, fp32 head, no gradient checkpointing; dualkv's own head."""
    config = dict(peft=True, beta=0.1, mask_truncated_completions=True, top_entropy_quantile=0.5, entropy_coef=0.01,
                  cast_lm_head_to_fp32=True, gradient_checkpointing=False, per_device_train_batch_size=8,
                  learning_rate=1e-2)
    trainer, got, ref = _run_pair(model_dir, tmp_path, dualkv_options={"head": "dualkv"}, **config)
    assert trainer.ref_model is None
    assert_parity(got, ref)
    assert any((lp == 0).all(dim=1).any() for _, lp, _ in ref.calls), "no masked (empty) completion was exercised"


# ---------------------------------------------------------------------------------------------- the seam directly
def _rows(prompts, completions, prompt_width=7, completion_width=5):
    ids = torch.zeros(len(prompts), prompt_width + completion_width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, (p, c) in enumerate(zip(prompts, completions)):
        ids[b, prompt_width - len(p):prompt_width], mask[b, prompt_width - len(p):prompt_width] = torch.tensor(p), 1
        if c:
            ids[b, prompt_width:prompt_width + len(c)], mask[b, prompt_width:prompt_width + len(c)] = \
                torch.tensor(c), 1
    return ids, mask


def _call_and_grads(trainer, ids, mask, batch_size=None):
    trainer.model.zero_grad()
    logps, ent, aux = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, ids.shape[1] - 7,
                                                                 batch_size=batch_size, compute_entropy=True)
    assert aux is None
    weights = torch.linspace(0.5, 1.5, logps.numel()).view_as(logps)
    (logps * weights).sum().add((ent * weights.flip(0)).sum()).backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer._dualkv_all_off() if hasattr(trainer, "_dualkv_all_off") else None
    return logps.detach(), ent.detach(), grads


@pytest.fixture(scope="module")
def trainers(model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seam")
    stock, _ = make_trainer(model_dir, tmp, "stock")
    dual, _ = make_trainer(model_dir, tmp, "dualkv")
    return stock, dual


@pytest.mark.parametrize("batch_size", [None, 2])
def test_seam_on_unordered_groups_and_empty_rows(trainers, batch_size):
    """Groups out of order (a prompt coming back after others), a prompt that is a prefix of another, an empty
    completion, a group larger than the chunk budget: stock's numbers and gradients."""
    stock, dual = trainers
    a, b, c = [3, 4, 5, 6], [3, 4, 5], [9]
    ids, mask = _rows([a, b, a, c, a, b, a], [[7, 8], [5, 5, 5, 1], [9], [4, 4, 4, 4, 4], [], [2], [3, 3, 3]])
    lp_ref, ent_ref, g_ref = _call_and_grads(stock, ids, mask, batch_size)
    lp, ent, g = _call_and_grads(dual, ids, mask, batch_size)
    _assert_rel(lp, lp_ref, "log-probs")
    _assert_rel(ent, ent_ref, "entropies")
    assert (lp[4] == 0).all() and (ent[4] == 0).all() and (lp[mask[:, 7:] == 0] == 0).all()
    for name, grad in g_ref.items():
        assert (g[name] - grad).norm() <= RTOL * grad.norm() + 1e-12, name
    assert dual.model.config._attn_implementation == "sdpa"


def test_seam_all_empty_completions_run_stock(trainers):
    stock, dual = trainers
    ids, mask = _rows([[3, 4], [3, 4]], [[], []])
    lp_ref, _, _ = _call_and_grads(stock, ids, mask)
    with pytest.warns(UserWarning, match="all empty ran stock"):
        lp, _, grads = _call_and_grads(dual, ids, mask)
    assert torch.equal(lp, lp_ref) and (lp == 0).all()
    assert grads, "the stock path keeps an all-empty micro-batch differentiable"


def test_known_wrong_packings_are_caught(trainers, monkeypatch):
    """Wrong packings must not pass: responses numbered from 0 (RoPE without the prompt offset) are refused by the
    "dualkv" input check; first response tokens predicted from the second-to-last prompt row fail the parity check."""
    import dataclasses

    from dualkv.integration.trl import forward

    stock, dual = trainers
    ids, mask = _rows([[3, 4, 5], [3, 4, 5]], [[6, 7, 8], [9, 9]])
    lp_ref, _, _ = _call_and_grads(stock, ids, mask)
    real = forward.pack_padded

    def from_zero(*args, **kwargs):
        packed = real(*args, **kwargs)
        return dataclasses.replace(packed, position_ids=torch.arange(packed.position_ids.numel()))

    monkeypatch.setattr(forward, "pack_padded", from_zero)
    with pytest.raises(ValueError, match="position_ids do not match"):
        _call_and_grads(dual, ids, mask)
    dual._dualkv_all_off()

    def shared_row_off_by_one(*args, **kwargs):
        packed = real(*args, **kwargs)
        first = packed.response_cu_seqlens[:-1]
        return dataclasses.replace(packed, predictor_index=packed.predictor_index.index_add(
            0, first, -torch.ones_like(first)))

    monkeypatch.setattr(forward, "pack_padded", shared_row_off_by_one)
    lp, _, _ = _call_and_grads(dual, ids, mask)
    _assert_rel(lp[:, 1:], lp_ref[:, 1:], "later tokens")          # only the first tokens are wrong
    with pytest.raises(AssertionError, match="log-probs"):
        _assert_rel(lp, lp_ref, "log-probs")


def test_refusals(trainers, model_dir, tmp_path):
    stock, dual = trainers
    ids, mask = _rows([[3, 4]], [[5]])
    with pytest.raises(DualKVTRLError, match="pixel_values"):
        dual._get_per_token_logps_and_entropies(dual.model, ids, mask, 5, pixel_values=torch.zeros(1))
    with pytest.raises(DualKVTRLError, match="aux loss"):
        dual._get_per_token_logps_and_entropies(dual.model, ids, mask, 5, compute_aux_loss=True)
    with pytest.raises(TypeError, match="GRPOTrainer"):
        apply_dualkv(stock.model)
    with pytest.raises(RuntimeError, match="already applied"):
        apply_dualkv(dual)
    with pytest.raises(ValueError, match="head"):
        make_trainer(model_dir, tmp_path, "dualkv", dualkv_options={"head": "liger"})
    with pytest.raises(DualKVTRLError, match="attn_implementation='dualkv'"):
        make_trainer(model_dir, tmp_path, "dualkv",
                     model_init_kwargs={"dtype": torch.float32, "attn_implementation": "dualkv"})
    from dualkv.integration.trl import UnsupportedTRLError, check_trl_version

    assert str(check_trl_version()) .startswith("1.16")
    with pytest.raises(UnsupportedTRLError, match="1.16"):
        check_trl_version("1.15.2")
    assert type(stock).__name__ == "GRPOTrainer"          # a failed apply leaves the class alone


# ------------------------------------------------------------------------------------------ walkthrough findings
def test_moe_refusal_names_trls_switch_and_the_switch_works(tmp_path):
    """TRL 1.16 turns the router aux loss on for every MoE config that declares ``router_aux_loss_coef`` (Qwen3-MoE:
    0.001), whatever ``output_router_logits`` says; the refusal blamed ``output_router_logits=True`` (which the user
    never set) and did not name the way out. It names ``router_aux_loss_coef=0.0`` now, which runs as stock."""
    from proofs_tests.verl_fixtures.synthetic import save_random_model
    from dualkv.testing import tiny_causal_lm

    moe_dir = save_random_model(tmp_path / "moe", tiny_causal_lm("qwen3_moe", dtype=torch.float32, vocab=VOCAB,
                                                                 tie_word_embeddings=False))
    plain, _ = make_trainer(moe_dir, tmp_path, "stock")
    assert plain.aux_loss_enabled and not plain.model.config.output_router_logits
    with pytest.raises(DualKVTRLError, match=r"router_aux_loss_coef=0\.0") as exc:
        apply_dualkv(plain)
    assert "output_router_logits=True" not in str(exc.value)
    assert type(plain).__name__ == "GRPOTrainer"
    _, got, ref = _run_pair(moe_dir, tmp_path, router_aux_loss_coef=0.0, optim="sgd")
    assert_parity(got, ref)


@pytest.mark.parametrize("config", [{"loss_type": "bnpo"}, {"top_entropy_quantile": 0.5}, {"entropy_coef": 0.1}])
def test_group_shuffle_warns_where_it_changes_the_optimizer_step(model_dir, tmp_path, config):
    """With several micro-batches per generation, bnpo's token normaliser, the high-entropy quantile and the entropy
    bonus are computed per micro-batch, so the group shuffle (the default) changes the optimizer step against stock
    TRL (measured: the first step's gradients differ by 1e-3 to 50% relative). It said so for bnpo in the docs only;
    it now warns, naming keep_groups=False (stock's row shuffle, exact)."""
    trainer, _ = make_trainer(model_dir, tmp_path, "stock", gradient_accumulation_steps=2, steps_per_generation=2,
                              **config)
    with pytest.warns(UserWarning, match="keep_groups=False"):
        apply_dualkv(trainer)
    for options, extra in (({"keep_groups": False}, config), ({}, {})):   # row shuffle, or dapo: nothing to say
        trainer, _ = make_trainer(model_dir, tmp_path, "stock", gradient_accumulation_steps=2,
                                  steps_per_generation=2, **extra)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            apply_dualkv(trainer, **options)


def test_hybrid_models_are_refused_when_dualkv_is_applied(tmp_path):
    """A model with token mixers outside attention (here LFM2's short convolutions) was accepted by apply_dualkv and
    refused only by the first log-prob call, after a whole generation; it is refused up front now, by name."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    from proofs_tests.verl_fixtures.synthetic import save_random_model

    config = Lfm2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention"])
    torch.manual_seed(0)
    hybrid_dir = save_random_model(tmp_path / "lfm2", Lfm2ForCausalLM(config).float())
    plain, _ = make_trainer(hybrid_dir, tmp_path, "stock")
    with pytest.raises(DualKVTRLError, match="conv"):
        apply_dualkv(plain)
    assert type(plain).__name__ == "GRPOTrainer"
    with pytest.raises(DualKVTRLError, match="conv"):
        make_trainer(hybrid_dir, tmp_path, "subclass")


@pytest.mark.parametrize("value", ["false", 0, None])
def test_keep_groups_must_be_a_bool(model_dir, tmp_path, value):
    """``dualkv_keep_groups="false"`` (a config file's string) switched the group shuffle on (bool("false") is True)."""
    with pytest.raises(TypeError, match="keep_groups must be True or False"):
        make_trainer(model_dir, tmp_path, "subclass", dualkv_options={"keep_groups": value})


def test_attention_softcapping_is_refused_when_dualkv_is_applied(tmp_path):
    """Gemma 2's default attention logit softcapping (50) was accepted by apply_dualkv and refused by the first
    packed forward, after a whole generation; it is refused up front now, by name."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from proofs_tests.verl_fixtures.synthetic import save_tokenizer

    tokenizer = save_tokenizer(tmp_path / "tok", VOCAB)
    config = Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    assert config.attn_logit_softcapping == 50.0
    args = GRPOConfig(output_dir=str(tmp_path / "gemma2"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=4, use_cpu=True, report_to=[], save_strategy="no")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = GRPOTrainer(model=Gemma2ForCausalLM(config).float(), processing_class=tokenizer,
                            reward_funcs=even_token_reward, args=args, train_dataset=_dataset())
    with pytest.raises(DualKVTRLError, match="softcapping"):
        apply_dualkv(plain)
    assert type(plain).__name__ == "GRPOTrainer"
