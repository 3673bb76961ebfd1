"""The fixed equivalence matrix of ``dualkv verify``: awkward lengths (1, 63, 64, 65, 127, 129), N = 1, several
groups, GQA ratios 1-8, every head dim, windows shorter and longer than the prompt."""

from __future__ import annotations

import random
from typing import Sequence

from .checks import AttentionCase

HEAD_DIMS = (32, 64, 96, 128, 192, 256, 512)


def attention_cases(quick: bool = False) -> list[AttentionCase]:
    cases = [
        AttentionCase((65,), ((63, 1, 129),), 4, 4, 64),
        AttentionCase((1,), ((1,),), 2, 1, 64),                       # P = 1, N = 1, R = 1
        AttentionCase((127,), ((65,),), 8, 1, 128),                    # N = 1, GQA 8
        AttentionCase((129,), ((1, 64, 127, 2, 63),), 8, 2, 128),      # N = 5, GQA 4
        AttentionCase((63, 1, 130), ((5, 65), (1,), (64, 3, 7)), 4, 2, 96),   # three groups
        AttentionCase((64,), ((64, 64),), 4, 4, 32),
        AttentionCase((33,), ((17, 9),), 2, 2, 192),
        AttentionCase((70,), ((5, 66, 1),), 4, 2, 256),
        AttentionCase((40,), ((3, 41),), 2, 1, 512),
        AttentionCase((100,), ((30, 7),), 4, 2, 64, window=(16, 0)),   # window shorter than P
        AttentionCase((20,), ((50, 3),), 4, 1, 128, window=(45, 0)),   # window longer than P
        AttentionCase((65, 9), ((2, 70), (9, 1)), 8, 4, 256, window=(8, 0)),
        AttentionCase((3,), ((129, 1, 2),), 2, 2, 64, window=(0, 0)),  # window of the diagonal only
    ]
    return cases[:5] if quick else cases


def model_cases(quick: bool = False):
    """(arch, prompt_lens, response_lens, gradient_checkpointing)."""
    cases = [
        ("qwen3", (7, 3), ((2, 1, 5), (1,)), False),
        ("llama", (5,), ((4, 1, 3, 2),), False),
        ("qwen3", (1, 9), ((3,), (2, 2)), True),
    ]
    return cases[:1] if quick else cases


def random_cases(count: int, seed: int, *, prompt_lens: Sequence[int], response_lens: Sequence[int],
                 group_sizes: Sequence[int] = (1, 2, 3, 5), head_dims: Sequence[int] = HEAD_DIMS,
                 windows: Sequence[int] = (0, 17, 64, 200, 5000), window_share: float = 0.4) -> list[AttentionCase]:
    """Seeded random multi-group cases over awkward lengths, GQA ratios 1-8 and windows; head dims cycle through
    ``head_dims`` (no window at d = 512, which the kernels run unwindowed only)."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        groups = rng.choice([1, 1, 2, 3])
        d = head_dims[i % len(head_dims)]
        kv, gqa = rng.choice([1, 2]), rng.choice([1, 2, 4, 8])
        prompts = tuple(rng.choice(prompt_lens) for _ in range(groups))
        responses = tuple(tuple(rng.choice(response_lens) for _ in range(rng.choice(group_sizes)))
                          for _ in range(groups))
        window = (rng.choice(windows), 0) if d != 512 and rng.random() < window_share else (-1, -1)
        cases.append(AttentionCase(prompts, responses, kv * gqa, kv, d, window))
    return cases
