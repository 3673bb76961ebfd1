"""Quick GPU check of the forward kernels as built in this process (``$DUALKV_EXTRA_DEFINES`` selects an A/B
variant): both families (the default and ``mma``), bf16 and fp16, awkward lengths, GQA ratios, head dims 64 and 128,
with q scaled by 1, 8 and 64 so that the running row max moves rarely, sometimes and often, against the float64
N-copy oracle under the project's tolerance rule, outputs poisoned with NaN and every launch synchronised.

    DUALKV_EXTRA_DEFINES=DKV_SOFTMAX_LAZY=1 python3 experiments/gpu/fwd_variant_check.py

Prints one line per (family, q scale) and exits 1 if any row failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

AWKWARD = (1, 63, 64, 65, 127, 129, 1000, 4097)


def cases():
    from dualkv.verify.cases import random_cases
    from dualkv.verify.checks import AttentionCase

    small = random_cases(8, 0, prompt_lens=AWKWARD[:6], response_lens=AWKWARD[:6], group_sizes=(1, 2, 3, 5),
                         head_dims=(64, 128), window_share=0.0)
    long = [AttentionCase((4097,), ((1, 63, 65, 127, 129, 2000),), 8, 2, 128)]
    long += [AttentionCase((1000, 4097), ((1, 700, 129), (65, 2000)), 16, 4, d) for d in (64, 128)]
    return small + long


def main() -> int:
    import dualkv.verify.checks as checks
    from dualkv.cuda.configs import kernel_family
    from dualkv.cuda.runtime import debug

    random_qkv = checks.random_qkv
    failed = 0
    for family in ("auto", "mma"):
        for q_scale in (1.0, 8.0, 64.0):
            def scaled(*args, **kwargs):
                q, k, v = random_qkv(*args, **kwargs)
                return q * q_scale, k, v

            checks.random_qkv = scaled
            rows = []
            with kernel_family(family), debug(poison=True, sync=True):
                for case in cases():
                    for dtype in (torch.bfloat16, torch.float16):
                        rows += checks.shared_prefix_check(case, dtype=dtype, device="cuda", with_grad=False)
            bad = [r for r in rows if not r.passed]
            worst = max(rows, key=lambda r: r.error / r.bound if r.bound else 0.0)
            print(f"{family} q*{q_scale:g}: {len(rows) - len(bad)}/{len(rows)} rows passed; worst error/bound "
                  f"{worst.error / worst.bound:.3f} ({worst.config} {worst.quantity} {worst.dtype})")
            for r in bad[:5]:
                print(f"  FAILED {r.config} {r.quantity} {r.dtype}: {r.error:.3e} > {r.bound:.3e}")
            failed += len(bad)
    checks.random_qkv = random_qkv
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
