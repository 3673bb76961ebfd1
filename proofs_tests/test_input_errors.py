"""Every public entry point refuses bad input with an error that names the problem."""

import pytest
import torch

import dualkv
from dualkv import GroupLayout
from dualkv.reference import standard_varlen_attention


def _call2_args(r=(3, 2), p=4, h=4, hk=2, d=8, dtype=torch.float32):
    t = sum(r)
    cu = torch.tensor([0, *torch.tensor(r).cumsum(0).tolist()], dtype=torch.int32)
    return dict(q=torch.randn(t, h, d, dtype=dtype), k_context=torch.randn(p, hk, d, dtype=dtype),
                v_context=torch.randn(p, hk, d, dtype=dtype), k_decoded=torch.randn(t, hk, d, dtype=dtype),
                v_decoded=torch.randn(t, hk, d, dtype=dtype), cu_seqlens_q=cu, cu_seqlens_k_decoded=cu.clone(),
                max_seqlen_q=max(r), context_seqlen=p, max_seqlen_k_decoded=max(r))


def test_call2_accepts_good_input():
    out = dualkv.flash_attn_dualkv_varlen_func(**_call2_args())
    assert out.shape == (5, 4, 8)


def test_call2_accepts_numpy_integers_for_its_lengths():
    import numpy as np

    args = _call2_args()
    ref = dualkv.flash_attn_dualkv_varlen_func(**args)
    for name in ("max_seqlen_q", "context_seqlen", "max_seqlen_k_decoded"):
        args[name] = np.int64(args[name])
    assert torch.equal(dualkv.flash_attn_dualkv_varlen_func(**args), ref)


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a: a.update(cu_seqlens_q=torch.tensor([1, 3, 5], dtype=torch.int32)), ValueError, "must start at 0"),
    (lambda a: a.update(cu_seqlens_q=torch.tensor([0, 4, 3, 5], dtype=torch.int32)), ValueError, "decreases"),
    (lambda a: a.update(cu_seqlens_q=torch.tensor([0, 3, 6], dtype=torch.int32)), ValueError, "hold 5 tokens"),
    (lambda a: a.update(cu_seqlens_q=torch.tensor([0, 3, 5.0])), TypeError, "int32"),
    (lambda a: a.update(cu_seqlens_q=torch.tensor([[0, 3, 5]], dtype=torch.int32)), ValueError, "1-D"),
    (lambda a: a.update(q=torch.randn(11, 4, 8), cu_seqlens_q=torch.tensor([0, 8, 11], dtype=torch.int32),
                        max_seqlen_q=8), ValueError, "sequence 0 has 8 query rows but only 4 \\+ 3 keys"),
    (lambda a: a.update(cu_seqlens_k_decoded=torch.tensor([0, 5], dtype=torch.int32)), ValueError,
     "cu_seqlens_q has 2 sequences but cu_seqlens_k_decoded has 1"),
    (lambda a: a.update(max_seqlen_k_decoded=2), ValueError, "max_seqlen_k_decoded = 2 is smaller"),
    (lambda a: a.update(max_seqlen_q=2), ValueError, "max_seqlen_q = 2 is smaller"),
    (lambda a: a.update(context_seqlen=3), ValueError, "k_context has 4 tokens but context_seqlen = 3"),
    (lambda a: a.update(q=torch.randn(5, 3, 8)), ValueError, "not a multiple"),
    (lambda a: a.update(k_decoded=torch.randn(5, 2, 8, dtype=torch.float64)), TypeError, "share one dtype"),
    (lambda a: a.update(v_context=torch.randn(4, 2, 16)), ValueError, "head_dim 16"),
    (lambda a: a.update(q=torch.randn(5, 4 * 8)), ValueError, "shape \\(tokens, heads, head_dim\\)"),
    (lambda a: a.update(k_decoded=torch.randn(6, 2, 8)), ValueError, "v_decoded has 5 tokens but k_decoded has 6"),
    (lambda a: a.update(k_decoded=torch.randn(6, 2, 8), v_decoded=torch.randn(6, 2, 8)), ValueError,
     "cu_seqlens_k_decoded\\[-1\\] = 5 but the packed tensors hold 6"),
    (lambda a: a.update(q=torch.randn(5, 4, 8).int()), TypeError, "dtype torch.int32"),
    (lambda a: a.update(softmax_scale=-1.0), ValueError, "softmax_scale"),
    (lambda a: a.update(window_size=(-2, 0)), ValueError, "window_size"),
    (lambda a: a.update(window_size=3), ValueError, "window_size"),
    (lambda a: a.update(v_decoded=torch.randn(5, 1, 8)), ValueError, "v_decoded has 1 heads"),
    (lambda a: a.update(window_size=(-0.5, -1)), ValueError, "window_size\\[0\\] = -0.5 must be a whole number"),
    (lambda a: a.update(window_size=(1, 2, 3)), ValueError, "window_size must be a pair"),
    (lambda a: a.update(causal="no"), TypeError, "causal must be True or False"),
    (lambda a: a.update(causal=None), TypeError, "causal must be True or False"),
    (lambda a: a.update(q=torch.randn(5, 4, 8).numpy()), TypeError, "q must be a torch.Tensor"),
    (lambda a: a.update(q=torch.randn(5, 0, 8)), ValueError, "q has 0 heads"),
    (lambda a: a.update(**{n: torch.randn(a[n].shape[0], a[n].shape[1], 0) for n in
                           ("q", "k_context", "v_context", "k_decoded", "v_decoded")}), ValueError, "head_dim 0"),
])
def test_call2_refuses(mutate, error, match):
    args = _call2_args()
    mutate(args)
    with pytest.raises(error, match=match):
        dualkv.flash_attn_dualkv_varlen_func(**args)


def test_shared_prefix_refuses_layout_mismatch():
    layout = GroupLayout.single(4, [3, 2])
    q, k = torch.randn(9, 4, 8), torch.randn(9, 2, 8)
    with pytest.raises(ValueError, match="q has 9 tokens but the layout packs 9|layout packs"):
        dualkv.shared_prefix_attention(torch.randn(10, 4, 8), k, k, layout)
    with pytest.raises(TypeError, match="GroupLayout"):
        dualkv.shared_prefix_attention(q, k, k, [4, 3, 2])
    assert dualkv.shared_prefix_attention(q, k, k, layout).shape == q.shape


def test_standard_varlen_refuses_more_queries_than_keys():
    cu_q = torch.tensor([0, 4], dtype=torch.int32)
    cu_k = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="4 queries but only 3 keys"):
        standard_varlen_attention(torch.randn(4, 2, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8), cu_q, cu_k, 4, 3)


def test_context_attention_needs_max_seqlen_with_cu_seqlens():
    x = torch.randn(5, 2, 8)
    with pytest.raises(ValueError, match="max_seqlen is required"):
        dualkv.context_attention(x, x, x, cu_seqlens=torch.tensor([0, 5], dtype=torch.int32))


@pytest.mark.gpu
def test_device_mismatch_is_named():
    args = _call2_args()
    args["k_context"] = args["k_context"].cuda()
    with pytest.raises(ValueError, match="k_context is on cuda"):
        dualkv.flash_attn_dualkv_varlen_func(**args)


def test_group_layout_names_a_group_that_is_not_a_list_of_lengths():
    with pytest.raises(TypeError, match="response_lens\\[0\\] must be a sequence of ints"):
        GroupLayout((5, 6), (2, 3))
    with pytest.raises(TypeError, match="response_lens must be a sequence"):
        GroupLayout((5,), 3)


def test_tree_attention_checks_deterministic():
    """As every other reference entry: None or a bool, and False warns that it has no effect."""
    from dualkv import _warnings
    from dualkv.reference.tree import tree_attention
    from dualkv.tree import PrefixTreeLayout

    _warnings.reset()  # the warning is issued once per process
    layout = PrefixTreeLayout(node_lens=(3, 2, 1), parents=(-1, 0, 0))
    q, k = torch.randn(6, 2, 8, dtype=torch.float64), torch.randn(6, 1, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match="deterministic must be True, False or None"):
        tree_attention(q, k, k, layout, deterministic="yes")
    with pytest.warns(_warnings.DualKVWarning, match="deterministic=False has no effect"):
        tree_attention(q, k, k, layout, deterministic=False)


@pytest.mark.parametrize("scale,error", [(True, TypeError), ("0.5", TypeError), (b"1", TypeError),
                                         (float("nan"), ValueError), (0, ValueError)])
def test_softmax_scale_must_be_a_number(scale, error):
    """float(True) is 1.0 and float("0.5") is 0.5: a bool or a string for softmax_scale is refused by name, not
    silently turned into a scale (every entry point resolves it in _checks.resolve_scale)."""
    layout = GroupLayout.single(4, [3, 2])
    q, k = torch.randn(9, 4, 8), torch.randn(9, 2, 8)
    with pytest.raises(error, match="softmax_scale"):
        dualkv.shared_prefix_attention(q, k, k, layout, softmax_scale=scale)
    with pytest.raises(error, match="softmax_scale"):
        dualkv.flash_attn_dualkv_varlen_func(**_call2_args(), softmax_scale=scale)


def test_softmax_scale_accepts_numbers_of_any_kind():
    import numpy as np

    layout = GroupLayout.single(4, [3, 2])
    q, k = torch.randn(9, 4, 8, dtype=torch.float64), torch.randn(9, 2, 8, dtype=torch.float64)
    ref = dualkv.shared_prefix_attention(q, k, k, layout, softmax_scale=0.5)
    for scale in (np.float32(0.5), np.float64(0.5), torch.tensor(0.5), 0.5):
        assert torch.equal(dualkv.shared_prefix_attention(q, k, k, layout, softmax_scale=scale), ref)
    assert torch.equal(dualkv.shared_prefix_attention(q, k, k, layout, softmax_scale=2),
                       dualkv.shared_prefix_attention(q, k, k, layout, softmax_scale=2.0))


def test_context_attention_checks_max_seqlen_without_cu_seqlens():
    """Without cu_seqlens the prompt is one sequence of q's length; a max_seqlen given anyway is checked against it
    as it is with cu_seqlens, not ignored."""
    x = torch.randn(5, 2, 8)
    with pytest.raises(ValueError, match="max_seqlen = 3 is smaller than the longest sequence \\(5\\)"):
        dualkv.context_attention(x, x, x, max_seqlen=3)
    with pytest.raises(TypeError, match="max_seqlen must be an int"):
        dualkv.context_attention(x, x, x, max_seqlen=5.0)
    assert torch.equal(dualkv.context_attention(x, x, x, max_seqlen=5), dualkv.context_attention(x, x, x))
    assert torch.equal(dualkv.context_attention(x, x, x, max_seqlen=9), dualkv.context_attention(x, x, x))
