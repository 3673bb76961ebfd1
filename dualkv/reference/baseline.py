"""The N-copy baseline expressed on shared-prompt packed tensors.

Today's trainers pack N copies of each prompt, [P; R_1], ..., [P; R_N], and run causal varlen attention over them.
:func:`n_copy_attention` does exactly that from packed (T, heads, d) tensors — copying the prompt rows N_g times —
and returns each packed token's output once, so it can be compared with
:func:`dualkv.reference.shared_prefix_attention` output for output and gradient for gradient.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..layout import GroupLayout
from .attention import check_layout_tensors, standard_varlen_attention


def n_copy_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: GroupLayout,
                     softmax_scale: float | None = None, window_size: Sequence[int] = (-1, -1),
                     return_lse: bool = False):
    """Causal attention over the N-copy layout of ``layout``'s rows, read back at each packed token.

    Args:
        q: (T, H, d); k, v: (T, H_k, d), packed as ``layout`` says.
    Returns:
        out (T, H, d) [, lse (H, T)] — a prompt token's value is taken from its group's first copy.
    """
    check_layout_tensors(q, k, v, layout)
    expand = torch.from_numpy(layout.copy_token_index).to(q.device)
    back = torch.from_numpy(layout.first_copy_index).to(q.device)
    cu = torch.from_numpy(layout.copy_cu_seqlens).to(torch.int32)
    max_len = int((cu[1:] - cu[:-1]).max())
    out, lse = standard_varlen_attention(q[expand], k[expand], v[expand], cu, cu, max_len, max_len,
                                         softmax_scale, True, window_size, return_lse=True)
    out, lse = out[back], lse[:, back]
    return (out, lse) if return_lse else out
