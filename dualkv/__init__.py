"""dualkv: exact shared-prompt attention for RL post-training (GRPO, DAPO).

N responses that share one prompt are packed once as [P; R_1; ...; R_N] (P + sum R_i tokens instead of
N(P + R)). The prompt's causal self-attention runs once (call 1); the responses attend to [shared prompt KV; own
response KV] (call 2); the backward sums the N responses' prompt gradients. The result equals the N-copy layout's.

Public entry points dispatch on the tensors (:mod:`dualkv.dispatch`): CUDA fp16/bf16 tensors use the CUDA kernels,
anything else the pure-PyTorch reference (:mod:`dualkv.reference`); ``DUALKV_BACKEND`` overrides the choice, and a
CUDA call that falls back to the reference warns with the reason. The full API (query rows per sequence, causal,
head dims, several GPUs) is described in docs/api.md.
"""

from __future__ import annotations

from .dispatch import backend_for, backend_name
from .layout import GroupLayout
from .tree import PrefixTreeLayout

__version__ = "0.1.0"

__all__ = [
    "GroupLayout",
    "PrefixTreeLayout",
    "backend_name",
    "context_attention",
    "flash_attn_dualkv_varlen_func",
    "shared_prefix_attention",
    "__version__",
]


def flash_attn_dualkv_varlen_func(q, k_context, v_context, k_decoded, v_decoded, cu_seqlens_q, cu_seqlens_k_decoded,
                                  max_seqlen_q, context_seqlen, max_seqlen_k_decoded, softmax_scale=None,
                                  causal=True, window_size=(-1, -1), return_lse=False, deterministic=None):
    """Call 2 (the paper's signature): see :func:`dualkv.reference.flash_attn_dualkv_varlen_func`."""
    return backend_for(q).flash_attn_dualkv_varlen_func(
        q, k_context, v_context, k_decoded, v_decoded, cu_seqlens_q, cu_seqlens_k_decoded, max_seqlen_q,
        context_seqlen, max_seqlen_k_decoded, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        return_lse=return_lse, deterministic=deterministic)


def context_attention(q, k, v, cu_seqlens=None, max_seqlen=None, softmax_scale=None, causal=True,
                      window_size=(-1, -1), return_lse=False, deterministic=None):
    """Call 1: see :func:`dualkv.reference.context_attention`."""
    return backend_for(q).context_attention(q, k, v, cu_seqlens, max_seqlen, softmax_scale=softmax_scale,
                                            causal=causal, window_size=window_size, return_lse=return_lse,
                                            deterministic=deterministic)


def shared_prefix_attention(q, k, v, layout, softmax_scale=None, window_size=(-1, -1), return_lse=False,
                            deterministic=None):
    """Calls 1 and 2 for every group of a packed micro-batch: see :func:`dualkv.reference.shared_prefix_attention`.

    ``deterministic``: CUDA backward mode (None: ``torch.are_deterministic_algorithms_enabled()`` or the default).
    """
    return backend_for(q, layout).shared_prefix_attention(q, k, v, layout, softmax_scale=softmax_scale,
                                                          window_size=window_size, return_lse=return_lse,
                                                          deterministic=deterministic)
