"""Integration with training stacks: packing, HuggingFace transformers, veRL."""

from .packing import PackedBatch, pack_padded, pack_varlen, split_token_values, unpack_token_values

__all__ = ["PackedBatch", "pack_padded", "pack_varlen", "split_token_values", "unpack_token_values"]
