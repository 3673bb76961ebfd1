"""Pure-PyTorch oracle: every other backend of dualkv is checked against these functions."""

from .attention import (context_attention, flash_attn_dualkv_varlen_func, shared_prefix_attention,
                        standard_varlen_attention)
from .baseline import n_copy_attention
from .tree import n_copy_tree_attention, tree_attention

__all__ = [
    "context_attention",
    "flash_attn_dualkv_varlen_func",
    "n_copy_attention",
    "n_copy_tree_attention",
    "shared_prefix_attention",
    "standard_varlen_attention",
    "tree_attention",
]
