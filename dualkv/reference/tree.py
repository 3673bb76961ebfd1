"""Pure-PyTorch oracle of shared-prefix *tree* attention (any dtype, CPU or CUDA, differentiable by autograd).

For every node of a :class:`dualkv.PrefixTreeLayout`, its queries attend to the keys of its root-to-node path —
every ancestor's run, then its own run causally — at logical positions (window in those positions). Ancestor
K/V rows are read by every descendant, so autograd sums their gradients over all descendants (and the GQA group).

* :func:`tree_attention` — packed (T, H, d) queries over the tree;
* :func:`shared_prefix_attention` — the same entry point as :func:`dualkv.reference.shared_prefix_attention`,
  accepting a :class:`dualkv.GroupLayout` (two-level reference) or a :class:`dualkv.PrefixTreeLayout`;
* :func:`n_copy_tree_attention` — the baseline: every root-to-leaf path run as its own sequence, read back once
  per packed token.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .._checks import check_qkv, check_window, resolve_scale
from ..layout import GroupLayout
from ..tree import PrefixTreeLayout
from . import attention as _group
from .attention import standard_varlen_attention
from .core import masked_attention

__all__ = ["tree_attention", "shared_prefix_attention", "n_copy_tree_attention", "per_node_attention",
           "check_tree_tensors"]

#: ``(node, k, v, layout) -> (keys (L, H_k, d), values (L, H_k, d))`` over the node's root-to-node path.
PathKV = Callable[[int, torch.Tensor, torch.Tensor, PrefixTreeLayout], tuple[torch.Tensor, torch.Tensor]]


def check_tree_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       layout: PrefixTreeLayout) -> tuple[int, int, int]:
    """Validate packed (T, heads, d) tensors against a PrefixTreeLayout; returns (H, H_k, d)."""
    if not isinstance(layout, PrefixTreeLayout):
        raise TypeError(f"layout must be a dualkv.PrefixTreeLayout, got {type(layout).__name__}")
    h, hk, d = check_qkv({"q": q, "k": k, "v": v}, query="q", keys=("k", "v"))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[0] != layout.total_tokens:
            raise ValueError(f"{name} has {t.shape[0]} tokens but the tree packs {layout.total_tokens} ({layout!r})")
    return h, hk, d


def path_kv(node: int, k: torch.Tensor, v: torch.Tensor,
            layout: PrefixTreeLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V rows of the root-to-``node`` path, in position order (ancestors' runs, then the node's own)."""
    runs = [layout.node_range(i) for i in layout.path(node)]
    if len(runs) == 1:
        a, b = runs[0]
        return k[a:b], v[a:b]
    return torch.cat([k[a:b] for a, b in runs], 0), torch.cat([v[a:b] for a, b in runs], 0)


def per_node_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: PrefixTreeLayout, scale: float,
                       window: tuple[int, int], *, keys: PathKV = path_kv,
                       query_shift: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Each node's queries over ``keys(node, ...)`` at logical positions; outputs in packed order.

    ``keys`` and ``query_shift`` (queries placed that many positions late) exist for the known-wrong variants the
    tests must catch; the defaults are the exact computation.
    """
    outs, lses = [], []
    for i in range(layout.num_nodes):
        a, b = layout.node_range(i)
        kk, vv = keys(i, k, v, layout)
        pos = layout.node_positions[i]
        q_pos = torch.arange(pos + query_shift, pos + query_shift + b - a, device=q.device)
        k_pos = torch.arange(0, kk.shape[0], device=q.device)
        out, lse = masked_attention(q[a:b], kk, vv, q_pos, k_pos, scale=scale, causal=True, window=window)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, 0), torch.cat(lses, 1)


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: PrefixTreeLayout,
                   softmax_scale: float | None = None, window_size: Sequence[int] = (-1, -1),
                   return_lse: bool = False, deterministic: bool | None = None):
    """Exact causal attention of a packed prefix tree: every token over its ancestors and, causally, its own node.

    Equal to running each root-to-leaf path as its own causal sequence and keeping each packed token once (with
    gradients of shared tokens summed over the paths through them). ``deterministic`` is accepted for API parity
    (None or a bool; ``False`` warns that it has no effect, as on the other reference entries).

    Args:
        q: (T, H, d); k, v: (T, H_k, d), packed as ``layout`` says (H % H_k == 0).
        softmax_scale: default 1/sqrt(d).
        window_size: FlashAttention's (left, right) in logical positions; right is capped at 0 (causal).
    Returns:
        out (T, H, d) [, lse (H, T): float32, float64 for float64 inputs].
    """
    _group._note_deterministic(deterministic)
    _, _, d = check_tree_tensors(q, k, v, layout)
    out, lse = per_node_attention(q, k, v, layout, resolve_scale(softmax_scale, d), check_window(window_size, True))
    return (out, lse) if return_lse else out


def shared_prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            layout: GroupLayout | PrefixTreeLayout, softmax_scale: float | None = None,
                            window_size: Sequence[int] = (-1, -1), return_lse: bool = False,
                            deterministic: bool | None = None):
    """:func:`tree_attention` for a PrefixTreeLayout, :func:`dualkv.reference.shared_prefix_attention` for a
    GroupLayout. Shapes as there."""
    fn = tree_attention if isinstance(layout, PrefixTreeLayout) else _group.shared_prefix_attention
    return fn(q, k, v, layout, softmax_scale=softmax_scale, window_size=window_size, return_lse=return_lse,
              deterministic=deterministic)


def n_copy_tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: PrefixTreeLayout,
                          softmax_scale: float | None = None, window_size: Sequence[int] = (-1, -1),
                          return_lse: bool = False):
    """Causal attention over the N-copy layout of the tree (each root-to-leaf path its own sequence), read back at
    each packed token's first copy. Shapes as :func:`tree_attention`."""
    check_tree_tensors(q, k, v, layout)
    expand = torch.from_numpy(layout.copy_token_index).to(q.device)
    back = torch.from_numpy(layout.first_copy_index).to(q.device)
    cu = torch.from_numpy(layout.copy_cu_seqlens).to(torch.int32)
    out, lse = standard_varlen_attention(q[expand], k[expand], v[expand], cu, cu, layout.max_path_len,
                                         layout.max_path_len, softmax_scale, True, window_size, return_lse=True)
    out, lse = out[back], lse[:, back]
    return (out, lse) if return_lse else out
