"""Every system the benchmarks compare, in one table: its name, what it is, and at which level it is implemented.

* kernel level (``dualkv bench kernel``): attention only, on packed q/k/v — :mod:`dualkv.bench.baselines`;
* layer level (``dualkv bench layer`` / ``model``): a token layout and an HF attention function around the same
  stock modules — :mod:`dualkv.bench.systems`.

A system measured at both levels has one name and one attention implementation (FA2 N-copy is PyTorch's varlen
FlashAttention-2 at both). Result files written before this table used ``flex_packed`` for the layer-level
FlexAttention; :func:`canonical` maps it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SystemInfo:
    name: str
    description: str
    kernel: bool  # implemented in dualkv.bench.baselines
    layer: bool   # implemented in dualkv.bench.systems


REGISTRY: dict[str, SystemInfo] = {info.name: info for info in (
    SystemInfo("dualkv", "P+ΣR packing, dualkv.shared_prefix_attention (the default kernels)", True, True),
    SystemInfo("dualkv_tree", "dualkv's prefix-tree kernels on the layout as a depth-1 forest", True, False),
    SystemInfo("dualkv_atomic", "dualkv with deterministic=False (on Hopper d=64, 128: the hybrid path; on the "
               "mma.sync kernels at d=64-128: the atomic dQ; elsewhere the deterministic kernels)", True, False),
    SystemInfo("dualkv_hybrid", "dualkv, deterministic=False: the fused forward with the cuDNN cascade's backward",
               True, False),
    SystemInfo("dualkv_mma", "dualkv with the mma.sync kernels (what sm_80 runs)", True, False),
    SystemInfo("dualkv_mma_split", "dualkv_mma with the split backward (dQ kernel + dK/dV kernel, seven products)",
               True, False),
    SystemInfo("dualkv_mma_ordered", "dualkv_mma with the ordered-dQ backward (five products, deterministic)", True,
               False),
    SystemInfo("dualkv_mma_atomic", "dualkv_mma with mma_backward('atomic'), deterministic=False, on the fused path "
               "(atomic dQ, five products)", True, False),
    SystemInfo("dualkv_v1", "dualkv with the first wgmma kernels", True, False),
    SystemInfo("fa2_ncopy", "N-copy varlen layout, PyTorch's FlashAttention-2 (varlen_attn)", True, True),
    SystemInfo("cudnn_ncopy", "N-copy layout, cuDNN attention on the copies as a padded batch", True, True),
    SystemInfo("cascade", "three FlashAttention-2 calls merged by LSE", True, False),
    SystemInfo("cudnn_cascade", "three cuDNN attention calls merged by LSE (dualkv.cascade) on the P+ΣR packing",
               True, True),
    SystemInfo("pg_padded", "Prefix-Grouper-style padded two-call attention", False, True),
    SystemInfo("flex", "P+ΣR packing, torch.compile(flex_attention) with a shared-prefix BlockMask", True, True),
    SystemInfo("flex_dynamic", "FlexAttention under torch.compile's dynamic shapes", True, False),
    SystemInfo("reference", "dualkv's pure-PyTorch oracle (CPU smoke runs)", True, False),
)}

#: Names in result files written before this table.
ALIASES = {"flex_packed": "flex"}


def canonical(name: str) -> str:
    """The registry name of a system named ``name`` in any result file."""
    return ALIASES.get(name, name)


def kernel_systems() -> tuple[str, ...]:
    return tuple(name for name, info in REGISTRY.items() if info.kernel)


def layer_systems() -> tuple[str, ...]:
    return tuple(name for name, info in REGISTRY.items() if info.layer)


def check_system(name: str, level: str) -> str:
    """``name`` if it is a system of ``level`` ("kernel" or "layer"), else an error listing the valid ones."""
    valid = kernel_systems() if level == "kernel" else layer_systems()
    if name not in valid:
        raise ValueError(f"unknown {level}-level system {name!r}; choose from {', '.join(valid)}")
    return name
