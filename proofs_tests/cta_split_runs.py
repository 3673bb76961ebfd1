"""GPU helper of the CTA-order tests (test_cuda_backward.py, test_cuda_ordered_dq.py): the gradients of one two-level
batch under several head-major splits (:attr:`dualkv.cuda.launch.Plan.ws_first_tiles`), so a test can require the
same bits from each."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

import dualkv
from dualkv import GroupLayout

LENGTHS = ([3000, 129], [[700, 65, 1, 300, 2048], [64]])

#: Splits as functions of (table rows, the plan's own split): the plan's, none, one row, half the table, all but one.
PICKS: dict[str, Callable[[int, int], int]] = {"plan": lambda n, s: s, "none": lambda n, s: 0, "one": lambda n, s: 1,
                                               "half": lambda n, s: n // 2, "all_but_one": lambda n, s: n - 1}


def grads_per_split(monkeypatch, head_dim: int, seed: int,
                    variants: Sequence[tuple[Optional[Callable[[], None]], str]]) -> tuple[list, list[int]]:
    """For each (setup, pick) of ``variants`` (setup: a callable run first, or None; pick: a key of :data:`PICKS`):
    dQ, dK, dV of shared_prefix_attention on :data:`LENGTHS` (16 query heads, 4 KV heads, bf16; the shared-key tiles
    unsplit) with the plan's split replaced by the pick, each on a fresh layout (plans are cached on it). Returns the
    gradients and the splits the plans carried."""
    from dualkv.cuda import launch, ws_schedule

    # a pick's first rows would also be split into as many parts as fill the GPU (ws_split), each pick rounding dK / dV
    # differently; the split has its own tests (test_cuda_ws_split.py)
    monkeypatch.setattr(launch, "WS_SPLIT", "off")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tokens = GroupLayout.from_lengths(*LENGTHS).total_tokens
    q = torch.randn(tokens, 16, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(tokens, 4, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    dout = torch.randn_like(q)
    split = ws_schedule.head_major_split
    runs, splits = [], []
    for setup, pick in variants:
        if setup is not None:
            setup()
        monkeypatch.setattr(ws_schedule, "head_major_split",
                            lambda tiles, seg, sf, pick=PICKS[pick]: pick(len(tiles), split(tiles, seg, sf)))
        layout = GroupLayout.from_lengths(*LENGTHS)
        q_, k_, v_ = (t.detach().clone().requires_grad_() for t in (q, k, v))
        runs.append(torch.autograd.grad(dualkv.shared_prefix_attention(q_, k_, v_, layout), (q_, k_, v_), dout))
        splits += [p.ws_first_tiles for key, p in layout._device_cache.items() if key[0] == "plan"]
    return runs, splits


def assert_same_bits(runs: list) -> None:
    """Every run's gradients equal the first run's, bit for bit."""
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
