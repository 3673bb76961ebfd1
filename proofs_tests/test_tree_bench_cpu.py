"""CPU checks of the tree benchmark's baselines: the stock-parts tree cascade is exact in float64 (outputs and
gradients against the tree reference), the FlexAttention tree mask is the tree's visibility, and the script runs
its argument parsing and refuses to run without a GPU (exit 2) rather than pretending."""

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from dualkv import PrefixTreeLayout
from dualkv.bench.tree_cascade import tree_cascade_attention
from dualkv.cuda.tree_schedule import preorder_permutation
from dualkv.reference.tree import tree_attention
from dualkv.testing import rel_err
from experiment_scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "gpu" / "tree_bench.py"


def _bench_module():
    return load_script(SCRIPT, "tree_bench")


def _forest(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 12)
    parents = [-1] + [-1 if rng.random() < 0.15 else rng.randrange(i) for i in range(1, n)]
    lens = [rng.choice((1, 2, 3, 3, 5, 8)) for _ in range(n)]
    return preorder_permutation(PrefixTreeLayout(lens, parents))[0]


@pytest.mark.parametrize("seed", range(5))
def test_tree_cascade_is_exact_in_float64(seed):
    layout = _forest(seed)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(layout.total_tokens, h, 8, generator=gen, dtype=torch.float64).requires_grad_()
               for h in (4, 2, 2))
    g = torch.randn(layout.total_tokens, 4, 8, generator=gen, dtype=torch.float64)
    results = []
    for fn in (tree_attention, tree_cascade_attention):
        out, lse = fn(q, k, v, layout, return_lse=True)
        results.append((out, lse, *torch.autograd.grad((out * g).sum(), (q, k, v))))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert rel_err(b, a) <= 1e-10, name


def test_flex_tree_mask_is_the_tree_visibility():
    pytest.importorskip("torch.nn.attention.flex_attention")
    layout = _forest(3)
    bench = _bench_module()
    mask_mod = None

    def capture(mm, *a, **kw):
        nonlocal mask_mod
        mask_mod = mm

    import torch.nn.attention.flex_attention as fa

    original = fa.create_block_mask
    fa.create_block_mask = capture
    try:
        bench.flex_tree_mask(layout, "cpu")()
    finally:
        fa.create_block_mask = original
    t = layout.total_tokens
    qi, ki = torch.arange(t)[:, None], torch.arange(t)[None, :]
    got = mask_mod(0, 0, qi, ki).numpy()
    expected = np.zeros((t, t), dtype=bool)
    pos = layout.position_ids().numpy()
    for node in range(layout.num_nodes):
        rows = layout.path_rows(node)
        a, b = layout.node_range(node)
        for r in range(a, b):
            expected[r, rows[:pos[r] + 1]] = True
    assert (got == expected).all()


def test_bench_script_refuses_without_a_gpu(monkeypatch):
    bench = _bench_module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--reps", "1"]) == 2
    assert set(bench.WORKLOADS) == {"a", "b", "c"}
    assert bench.table([{"workload": "a", "system": "flex", "error": "RuntimeError: x"}]).count("FAILED") == 1


@pytest.mark.parametrize("system", ["dualkv", "dualkv_bwd_v1", "cudnn_cascade"])
def test_runner_step_and_forward_match_the_tree_reference(system):
    """The benchmark's Runner (what it times): ``forward()`` is the system's output and ``step()`` its gradients, in
    float64 on the CPU (the dualkv systems on the reference path, the cascade on PyTorch's CPU attention), so a
    wrong upstream gradient or a dropped leaf in the refactored runner cannot go unseen."""
    bench = _bench_module()
    layout = _forest(3)
    gen = torch.Generator().manual_seed(0)
    t = layout.total_tokens
    q, k, v, dout = (torch.randn(t, h, 8, generator=gen, dtype=torch.float64) for h in (4, 2, 2, 4))
    runner = bench.Runner(system, layout, q, k, v, dout)
    qr, kr, vr = (x.detach().requires_grad_() for x in (q, k, v))
    ref = tree_attention(qr, kr, vr, layout)
    ref.backward(dout)
    out, dq, dk, dv = runner.result()
    assert rel_err(runner.forward()[0], ref) <= 1e-10 and rel_err(out, ref) <= 1e-10
    for got, want in ((dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        assert rel_err(got, want) <= 1e-10
