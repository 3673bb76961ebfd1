"""GPU checks of the transformers integration and the benchmark systems (marked ``gpu``; skipped without CUDA).

* A tiny bf16 model on CUDA with the "dualkv" attention (the CUDA kernels when present) against the float64 CPU
  oracle, judged by FlashAttention's criterion relative to the stock bf16 model on the same GPU.
* Every benchmark system computes the same bf16 layer on CUDA (FlashAttention varlen, the padded two-call
  baseline with bottom-right alignment, compiled FlexAttention, cuDNN on the padded copies and the cuDNN cascade),
  forward and backward against the float64 CPU layer, and the tiny GPU smoke runs write ok rows.
"""

import json

import pytest
import torch

from dualkv.bench.harness import synthetic_packed
from dualkv.bench.layer import layer_forward
from dualkv.bench.qwen3 import build_layer, qwen3_config
from dualkv.bench.systems import SYSTEMS, build_batch, register_attention
from dualkv.cli import main
from dualkv.integration.hf import apply_dualkv
from dualkv.integration.logprobs import model_response_logprobs
from dualkv.testing import compare, max_abs_err, rel_err, tiny_causal_lm
from dualkv.verify.model_checks import pack_rows, random_rows
from proofs_tests.test_hf_logprob_head import stock_rows

pytestmark = pytest.mark.gpu


def _run(model, rows, packed, dualkv: bool):
    params = [p for p in model.parameters()]
    if dualkv:
        with apply_dualkv(model):
            lp, ent = model_response_logprobs(model, packed.to(model.device), fused=True)
            grads = torch.autograd.grad(lp.sum() + ent.sum(), params)
    else:
        lp, ent = stock_rows(model, [(p.to(model.device), r.to(model.device)) for p, r in rows], 1.0)
        grads = torch.autograd.grad(lp.sum() + ent.sum(), params)
    return lp, ent, grads


@pytest.mark.parametrize("arch", ["qwen3", "gemma4"])
def test_bf16_model_on_cuda_matches_the_oracle(arch):
    # head dims the CUDA kernels take (>= 32); the tiny qwen3 default is 8
    dims = {"head_dim": 32} if arch == "qwen3" else {}
    oracle = tiny_causal_lm(arch, dtype=torch.float64, seed=11, **dims)
    rows, groups = random_rows((40, 17), ((9, 1, 30), (5, 12)), oracle.config.vocab_size, 11)
    packed = pack_rows(rows, groups)
    lp64, ent64, g64 = _run(oracle, rows, packed, dualkv=False)
    model = tiny_causal_lm(arch, dtype=torch.bfloat16, seed=11, **dims).cuda()
    lp_s, ent_s, g_s = _run(model, rows, packed, dualkv=False)
    lp, ent, g = _run(model, rows, packed, dualkv=True)
    for out, ref_lowp, ref in ((lp, lp_s, lp64), (ent, ent_s, ent64)):
        c = compare(out.cpu(), ref, dtype=torch.bfloat16, ref_lowp=ref_lowp.cpu())
        assert c.passed, (c.error, c.bound)
    worst = max(rel_err(a.cpu(), b) for a, b in zip(g, g64))
    worst_stock = max(rel_err(a.cpu(), b) for a, b in zip(g_s, g64))
    assert worst <= 3 * worst_stock + 1e-3, (worst, worst_stock)


def test_bench_systems_agree_on_cuda():
    register_attention()
    config = qwen3_config("tiny", max_positions=4096)
    packed = synthetic_packed(300, [70, 1, 129], config.vocab_size, 0)
    layer, rotary = build_layer(config, torch.device("cuda"), torch.bfloat16, seed=0)
    x = torch.randn(packed.layout.total_tokens, config.hidden_size, device="cuda", dtype=torch.bfloat16)
    outs = {}
    with torch.no_grad():
        for system in SYSTEMS:
            batch = build_batch(system, packed, "cuda")
            hidden = x[batch.gather].view(*batch.grid, -1)
            outs[system] = layer_forward(layer, rotary, batch, hidden).reshape(-1, config.hidden_size)[batch.to_packed]
    for system, out in outs.items():
        assert max_abs_err(out, outs["dualkv"]) < 0.1 and rel_err(out, outs["dualkv"]) < 2e-2, system


def _layer_grads(system, packed, layer, rotary, x, g):
    """The layer's output rows (packed order) and the gradients of sum(out * g) in its input and parameters, on the
    layer's device and dtype, returned as float64 CPU tensors."""
    param = next(layer.parameters())
    batch = build_batch(system, packed, param.device)
    x = x.to(param.device, param.dtype).requires_grad_()
    hidden = x[batch.gather].view(*batch.grid, -1)
    out = layer_forward(layer, rotary, batch, hidden).reshape(-1, x.shape[-1])[batch.to_packed]
    grads = torch.autograd.grad((out * g.to(param.device, param.dtype)).sum(), [x, *layer.parameters()])
    return [t.detach().double().cpu() for t in (out, *grads)]


def test_bench_systems_fwd_bwd_match_the_fp64_layer_on_cuda():
    """Each system's bf16 layer output and gradients (input, parameters) on CUDA, against the same weights' float64
    CPU layer: within 3x FA2 N-copy's error (the stock path) plus 1e-3; catches a system whose backward is wired
    wrong."""
    import copy

    from dualkv.testing import fp64_clean_norms

    register_attention()
    config = qwen3_config("tiny", max_positions=4096)
    packed = synthetic_packed(300, [70, 1, 129, 64], config.vocab_size, 0)
    layer64, rotary64 = build_layer(config, torch.device("cpu"), torch.float64, seed=0)
    layer = copy.deepcopy(layer64).to("cuda", torch.bfloat16)
    _, rotary = build_layer(config, torch.device("cuda"), torch.bfloat16, seed=0)
    fp64_clean_norms(layer64)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(packed.layout.total_tokens, config.hidden_size, generator=gen, dtype=torch.float64)
    g = torch.randn(packed.layout.total_tokens, config.hidden_size, generator=gen, dtype=torch.float64)
    ref = _layer_grads("dualkv", packed, layer64, rotary64, x, g)
    errors = {system: max(rel_err(a, b) for a, b in zip(_layer_grads(system, packed, layer, rotary, x, g), ref))
              for system in SYSTEMS}
    assert errors["fa2_ncopy"] < 5e-2, errors
    for system, err in errors.items():
        assert err <= 3 * errors["fa2_ncopy"] + 1e-3, (system, errors)


@pytest.mark.parametrize("kind", ["layer", "model"])
def test_bench_tiny_on_cuda(kind, tmp_path):
    assert main(["bench", kind, "--device", "cuda", "--tiny", "--P", "200", "--mb", "3", "--warmup", "1",
                 "--reps", "2", "--out", str(tmp_path), "--no-plot"]) == 0
    (path,) = tmp_path.glob(f"{kind}-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok"] * len(SYSTEMS), rows
    assert all(r["peak_mem_gib"] > 0 for r in rows)
