"""Tree attention equals running every root-to-leaf path as its own causal sequence (float64, <= 1e-10 relative):
outputs, LSE and dQ/dK/dV, with every copy getting its own upstream gradient (a shared token's packed dO is the sum
over the paths through it, as the residual stream delivers it). The oracle is PyTorch's SDPA on the N-copy rows
(:func:`dualkv.testing.n_copy_oracle`), independent of dualkv's attention code. Known-wrong variants must fail."""

import os
import random
import types
import warnings

import pytest
import torch

import dualkv
from dualkv import GroupLayout, PrefixTreeLayout
from dualkv.reference import tree as ref_tree
from dualkv.reference.attention import shared_prefix_attention as group_attention
from dualkv.testing import compare, n_copy_oracle, rel_err

BOUND = 1e-10


def random_forest(rng: random.Random, nodes: int, lens=(1, 2, 3, 5, 9, 17)) -> PrefixTreeLayout:
    """Random parents (a new root now and then) and awkward lengths."""
    parents = [-1] + [-1 if rng.random() < 0.1 else rng.randrange(i) for i in range(1, nodes)]
    return PrefixTreeLayout([rng.choice(lens) for _ in range(nodes)], parents)


SHAPES = {
    "single-token nodes": PrefixTreeLayout([1] * 9, [-1, 0, 1, 1, 0, 4, -1, 6, 6]),
    "chain": PrefixTreeLayout([3, 1, 4, 1, 5, 9, 2], [-1, 0, 1, 2, 3, 4, 5]),
    "wide fan": PrefixTreeLayout([7] + [1, 2, 3, 4] * 4, [-1] + [0] * 16),
    "several roots": PrefixTreeLayout([4, 2, 3, 1, 6, 2, 5], [-1, 0, -1, 2, 2, -1, 5]),
    "one node": PrefixTreeLayout([11], [-1]),
    "fans of fans": PrefixTreeLayout([5, 3, 3, 2, 2, 2, 2, 1, 1], [-1, 0, 0, 1, 1, 2, 2, 3, 3]),
}


def qkv(layout, heads=4, kv_heads=2, d=16, dtype=torch.float64, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(layout.total_tokens, h, d, generator=gen, dtype=torch.float64)  # noqa: E731
    return [make(h).to(device=device, dtype=dtype).requires_grad_() for h in (heads, kv_heads, kv_heads)]


def tree_check(layout, attention=ref_tree.tree_attention, *, heads=4, kv_heads=2, d=16, window=(-1, -1),
               scale=None, seed=0) -> dict[str, float]:
    """Relative error of out, lse, dq, dk, dv of ``attention`` against SDPA on the root-to-leaf paths."""
    q, k, v = qkv(layout, heads, kv_heads, d, seed=seed)
    expand = torch.from_numpy(layout.copy_token_index)
    cu = layout.copy_cu_seqlens.tolist()
    gen = torch.Generator().manual_seed(seed + 1)
    g_std = torch.randn(layout.tokens_std, heads, d, generator=gen, dtype=torch.float64)
    out_std = n_copy_oracle(q[expand], k[expand], v[expand], cu, scale=scale, window=window)
    ref_grads = torch.autograd.grad((out_std * g_std).sum(), (q, k, v))
    _, lse_std = ref_tree.n_copy_tree_attention(q, k, v, layout, softmax_scale=scale, window_size=window,
                                                return_lse=True)

    out, lse = attention(q, k, v, layout, softmax_scale=scale, window_size=window, return_lse=True)
    g_packed = torch.zeros_like(out).index_add_(0, expand, g_std)
    grads = torch.autograd.grad((out * g_packed).sum(), (q, k, v))
    errors = {"out": rel_err(out[expand], out_std), "lse": rel_err(lse, lse_std)}
    errors.update({name: rel_err(g, r) for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads)})
    return errors


def assert_exact(errors):
    bad = {k: e for k, e in errors.items() if not e <= BOUND}
    assert not bad, f"errors above {BOUND}: {bad}"


@pytest.mark.parametrize("name", list(SHAPES))
def test_shapes(name):
    assert_exact(tree_check(SHAPES[name]))


@pytest.mark.parametrize("seed", range(8))
def test_random_forests(seed):
    rng = random.Random(seed)
    layout = random_forest(rng, rng.randint(2, 24))
    assert_exact(tree_check(layout, seed=seed))


@pytest.mark.parametrize("gqa", [1, 2, 4])
def test_gqa_and_scale(gqa):
    assert_exact(tree_check(SHAPES["fans of fans"], heads=2 * gqa, kv_heads=2, d=8, scale=0.3))


@pytest.mark.parametrize("left", [0, 1, 4, 7, 30])
def test_sliding_window_in_logical_positions(left):
    """A window reaches back over node boundaries into ancestors by logical position (not by packed row)."""
    for name in ("chain", "fans of fans", "several roots"):
        assert_exact(tree_check(SHAPES[name], window=(left, 0)))


def test_sequences_with_duplicates_and_prefixes():
    seqs = [[1, 2, 3, 4, 5], [1, 2, 3, 6], [1, 2], [1, 2, 3, 4, 5], [7], [1, 2, 3, 6, 8, 9, 9]]
    layout, _ = PrefixTreeLayout.from_sequences(seqs)
    assert_exact(tree_check(layout))


# ---------------------------------------------------------------------------------------------- depth 1
@pytest.mark.parametrize("prompts,responses", [([9], [[4, 1, 7]]), ([3, 1, 12], [[2, 5], [1], [3, 3, 1]])])
@pytest.mark.parametrize("window", [(-1, -1), (4, 0)])
def test_depth_one_tree_equals_group_layout_bitwise(prompts, responses, window):
    group = GroupLayout.from_lengths(prompts, responses)
    tree = PrefixTreeLayout.from_group_layout(group)
    q, k, v = qkv(group)
    g = torch.randn(group.total_tokens, 4, 16, dtype=torch.float64)
    results = []
    for layout in (group, tree):
        out, lse = dualkv.shared_prefix_attention(q, k, v, layout, window_size=window, return_lse=True)
        results.append((out, lse, *torch.autograd.grad((out * g).sum(), (q, k, v))))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert torch.equal(a, b), f"{name} of the depth-1 tree differs from GroupLayout's"


# ---------------------------------------------------------------------------------------------- known-wrong variants
def _parent_only_kv(node, k, v, layout):
    """Keys of the parent and the node only: every ancestor above the parent is missing."""
    runs = [layout.node_range(i) for i in layout.path(node)[-2:]]
    return torch.cat([k[a:b] for a, b in runs]), torch.cat([v[a:b] for a, b in runs])


def _first_child_gradient_kv(node, k, v, layout):
    """Ancestor K/V get gradient only from nodes that are their parent's first child (not summed over every
    descendant)."""
    parent = layout.parents[node]
    if parent >= 0 and layout.children[parent][0] != node:
        a, b = layout.node_range(node)
        anc = [layout.node_range(i) for i in layout.ancestors(node)]
        return (torch.cat([k[s:e].detach() for s, e in anc] + [k[a:b]]),
                torch.cat([v[s:e].detach() for s, e in anc] + [v[a:b]]))
    return ref_tree.path_kv(node, k, v, layout)


def _variant(keys=ref_tree.path_kv, query_shift=0):
    def attention(q, k, v, layout, softmax_scale=None, window_size=(-1, -1), return_lse=False):
        scale = softmax_scale or q.shape[-1] ** -0.5
        out, lse = ref_tree.per_node_attention(q, k, v, layout, scale, (window_size[0], 0), keys=keys,
                                               query_shift=query_shift)
        return (out, lse) if return_lse else out
    return attention


def test_variant_harness_is_exact_with_defaults():
    assert_exact(tree_check(SHAPES["fans of fans"], _variant()))


def test_missing_ancestor_is_caught():
    errors = tree_check(SHAPES["chain"], _variant(keys=_parent_only_kv))
    assert errors["out"] > 1e-3


def test_ancestor_gradient_not_summed_is_caught():
    errors = tree_check(SHAPES["fans of fans"], _variant(keys=_first_child_gradient_kv))
    assert errors["out"] <= BOUND and errors["dq"] <= BOUND            # forward and dQ untouched ...
    assert errors["dk"] > 1e-3 and errors["dv"] > 1e-3                  # ... the unsummed ancestor dK/dV caught
    assert_exact(tree_check(SHAPES["chain"], _variant(keys=_first_child_gradient_kv)))   # no fan: nothing to sum


@pytest.mark.parametrize("shift", [1, -1])
def test_off_by_one_positions_are_caught(shift):
    errors = tree_check(SHAPES["several roots"], _variant(query_shift=shift))
    assert errors["out"] > 1e-3


def test_copy_without_summed_upstream_gradient_is_caught():
    """The check itself: feeding the packed output only the first copy's dO (not the sum over paths) must fail."""
    layout = SHAPES["fans of fans"]
    q, k, v = qkv(layout)
    expand = torch.from_numpy(layout.copy_token_index)
    g_std = torch.randn(layout.tokens_std, 4, 16, dtype=torch.float64)
    ref = torch.autograd.grad((n_copy_oracle(q[expand], k[expand], v[expand], layout.copy_cu_seqlens.tolist())
                               * g_std).sum(), k)[0]
    out = ref_tree.tree_attention(q, k, v, layout)
    first_only = g_std[torch.from_numpy(layout.first_copy_index)]
    got = torch.autograd.grad((out * first_only).sum(), k)[0]
    assert rel_err(got, ref) > 1e-3


# ---------------------------------------------------------------------------------------------- entry points, errors
def test_dispatch_routes_trees_to_the_reference():
    layout = SHAPES["several roots"]
    q, k, v = qkv(layout)
    assert torch.equal(dualkv.shared_prefix_attention(q, k, v, layout), ref_tree.tree_attention(q, k, v, layout))
    assert torch.equal(dualkv.reference.tree_attention(q, k, v, layout), ref_tree.shared_prefix_attention(q, k, v,
                                                                                                           layout))
    group = GroupLayout.single(5, [2, 3])
    qg, kg, vg = qkv(group)
    assert torch.equal(ref_tree.shared_prefix_attention(qg, kg, vg, group), group_attention(qg, kg, vg, group))


def test_trees_dispatch_like_group_layouts(monkeypatch):
    """CUDA fp16/bf16 trees go to the CUDA tree kernels where they can run; where they cannot, to the tree reference
    with the same FallbackWarning as a GroupLayout; DUALKV_BACKEND=reference and CPU tensors take the reference
    silently."""
    from dualkv import _warnings, cuda as cuda_backend

    fake_cuda = types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, device=torch.device("cuda", 0))
    layout = SHAPES["chain"]
    _warnings.reset()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(_warnings.FallbackWarning, match="PyTorch sees no CUDA device"):
        assert dualkv.backend_for(fake_cuda, layout) is ref_tree
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dualkv.backend_for(fake_cuda, layout) is cuda_backend
    monkeypatch.setitem(os.environ, "DUALKV_BACKEND", "reference")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dualkv.backend_for(fake_cuda, layout) is ref_tree
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dualkv.backend_for(torch.zeros(1), layout) is ref_tree


def test_bad_inputs_are_refused_by_name():
    layout = SHAPES["chain"]
    q, k, v = qkv(layout)
    with pytest.raises(ValueError, match=r"k has 24 tokens but the tree packs 25"):
        ref_tree.tree_attention(q, k[:-1], v, layout)
    with pytest.raises(TypeError, match="layout must be a dualkv.PrefixTreeLayout"):
        ref_tree.tree_attention(q, k, v, GroupLayout.single(20, [5]))
    with pytest.raises(ValueError, match="not a multiple"):
        ref_tree.tree_attention(q[:, :3], k, v, layout)
    with pytest.raises(ValueError, match="softmax_scale"):
        ref_tree.tree_attention(q, k, v, layout, softmax_scale=-1.0)


@pytest.mark.gpu
def test_cuda_bf16_tree_through_the_reference_meets_the_rule(monkeypatch):
    """On a GPU with DUALKV_BACKEND=reference the tree runs the reference and meets FlashAttention's criterion at
    bf16 (the kernels' own tests: test_tree_cuda.py)."""
    monkeypatch.setenv("DUALKV_BACKEND", "reference")
    layout = SHAPES["fans of fans"]
    q64, k64, v64 = qkv(layout)
    expand = torch.from_numpy(layout.copy_token_index)
    ref = n_copy_oracle(q64[expand], k64[expand], v64[expand], layout.copy_cu_seqlens.tolist())[
        torch.from_numpy(layout.first_copy_index)]
    lowp = [t.detach().to("cuda", torch.bfloat16) for t in (q64, k64, v64)]
    out = dualkv.shared_prefix_attention(*lowp, layout)
    ref_lowp = n_copy_oracle(*(t[expand.cuda()] for t in lowp), layout.copy_cu_seqlens.tolist())[
        torch.from_numpy(layout.first_copy_index).cuda()]
    assert compare(out, ref, dtype=torch.bfloat16, ref_lowp=ref_lowp).passed
