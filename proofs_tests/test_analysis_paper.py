"""The paper's numbers, computed by dualkv.analysis.

Where the paper's printed number follows from its own formula, the test checks the formula reproduces it to the
printed precision. Where it does not, the test pins what the formula gives and says so in a ``PAPER
INCONSISTENCY`` note; no formula is bent to hit a printed number.
"""

from __future__ import annotations

import pytest

from dualkv.analysis import (PAPER_LLAMA31_8B_LAW, attn_speedup_pairs, attn_speedup_theory, kernel_memory_savings,
                             load_model, rho, rho_equal, rho_limit_long_prompt, rho_limit_many_responses, rho_micro_batched,
                             tokens_dualkv, tokens_std)

K = 1024

# Appendix "Token Reduction Ratio", table of scenarios: (N, P, R, printed rho)
SCENARIOS = [
    (8, 2 * K, 2 * K, 1.8),
    (8, 16 * K, 2 * K, 4.5),
    (8, 64 * K, 512, 7.6),
    (16, 16 * K, 2 * K, 6.0),
    (32, 4 * K, 2 * K, 2.8),
    (32, 16 * K, 2 * K, 7.2),
    (16, 32 * K, 2 * K, 8.5),
    (16, 64 * K, 512, 14.3),
]


@pytest.mark.parametrize("N,P,R,printed", SCENARIOS)
def test_scenario_table(N, P, R, printed):
    assert round(rho(N, P, R), 1) == printed


def test_rho_limits_as_printed():
    # "With P=16K, R=2K: ceiling is 9x"; "as P -> inf the speedup approaches N"
    assert rho_limit_many_responses(16 * K, 2 * K) == 9.0
    assert rho_limit_long_prompt(16) == 16.0
    assert rho_equal(1e9, 16 * K, 2 * K) == pytest.approx(9.0, rel=1e-6)
    assert rho(16, 10**12, 2 * K) == pytest.approx(16.0, rel=1e-6)


def test_longreason_micro_batch_rho():
    # Section "End-to-End ... LongReason": P=8192, R=2048, N=32, rho = 2.5x at mb=4 and 3.3x at mb=8
    assert rho(4, 8192, 2048) == 2.5
    assert round(rho(8, 8192, 2048), 1) == 3.3
    assert rho_micro_batched(32, 8192, 2048, 4) == 2.5
    assert round(rho_micro_batched(32, 8192, 2048, 8), 1) == 3.3


def test_kernel_benchmark_rho():
    # GSM8K appendix note: the kernel benchmarks (N=28, R=2048) reach "rho up to 7x" (at P=16K)
    assert rho(28, 16 * K, 2 * K) == 7.0


def test_gsm8k_token_counts():
    # "FA2 requires ~8 x (3072+256) = 26,624 tokens ... DualKV requires only 3072 + 8 x 256 = 5,120 tokens -- a
    # 5.2x reduction"
    assert tokens_std(8, 3072, 256) == 26_624
    assert tokens_dualkv(8, 3072, 256) == 5_120
    assert round(rho(8, 3072, 256), 1) == 5.2


# PAPER INCONSISTENCY (GSM8K table): the rho column prints 1.8, 2.3, 2.9, 3.3, 3.8 for P = 1K, 1.5K, 2K, 2.5K, 3K
# at N=8, R=256 and states rho = N(P+R)/(P+NR) under the table. That formula gives 3.33, 4.00, 4.50, 4.89, 5.20 --
# and 5.2 at P=3K is the paper's own "5.2x reduction" from its own token counts (26,624 / 5,120). We pin the
# formula's values.
GSM8K = [(1024, 1.8, 3.33), (1536, 2.3, 4.00), (2048, 2.9, 4.50), (2560, 3.3, 4.89), (3072, 3.8, 5.20)]


@pytest.mark.parametrize("P,printed,formula", GSM8K)
def test_gsm8k_rho_column_is_not_the_formula(P, printed, formula):
    value = rho(8, P, 256)
    assert round(value, 2) == formula
    assert abs(value - printed) > 1.0


def test_theoretical_attention_speedup_at_16_32k_2k():
    # PAPER INCONSISTENCY (appendix "Speedup Scaling"): "For P=32K, R=2K, N=16: theoretical speedup is 6.1x,
    # measured fwd+bwd is 5.48x (90% efficiency)". The printed formula N(P+R)^2/(P^2+NR(P+R)) gives 8.76x; the exact
    # causal pair count (N rows of (P+R)(P+R+1)/2 vs P(P+1)/2 + N(RP + R(R+1)/2)) gives 5.90x. Neither is 6.1x.
    # Against the causal count the measured 5.48x is 93% of the ceiling.
    assert round(attn_speedup_theory(16, 32 * K, 2 * K), 2) == 8.76
    assert round(attn_speedup_pairs(16, 32 * K, 2 * K), 2) == 5.90
    assert round(5.48 / attn_speedup_pairs(16, 32 * K, 2 * K), 2) == 0.93
    assert abs(attn_speedup_theory(16, 32 * K, 2 * K) - 6.1) > 2
    assert abs(attn_speedup_pairs(16, 32 * K, 2 * K) - 6.1) > 0.15


def test_kernel_memory_table():
    """Appendix "Memory Savings": Qwen3-8B, N=8, P=16384, bf16: 469 MB (K_c, V_c), 940 MB (Q at prompt
    positions), 14 MB (prompt LSE), 1423 MB per layer."""
    cfg = load_model("qwen3-8b")
    saved = kernel_memory_savings(8, 16384, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    assert saved == {"kv": 469_762_048, "q": 939_524_096, "lse": 14_680_064, "total": 1_423_966_208}
    mb = {k: v / 1e6 for k, v in saved.items()}
    # The paper's rounding is mixed: 469.76 -> "469" and 14.68 -> "14" are truncated, 939.52 -> "940" is rounded,
    # and "1423" is the sum of the printed entries (469 + 940 + 14); the exact total is 1423.97 MB.
    assert int(mb["kv"]) == 469
    assert round(mb["q"]) == 940
    assert int(mb["lse"]) == 14
    assert int(mb["kv"]) + round(mb["q"]) + int(mb["lse"]) == 1423
    assert round(mb["total"], 2) == 1423.97


def test_memory_law_projection_at_96k():
    # Appendix "Context-Length Scaling Sweep": with M0 = 41.1 GB, c_P = 0.475 GB/Ktoken, c_mbR = 0.122 GB/Ktoken
    # the paper says that at P=96K "increasing mb from 4 to 16 adds only ~4 GB" under DualKV and that "FA2 would
    # require 225 -> 775 GB".
    # PAPER INCONSISTENCY (small): its own law gives c_mbR * 12 * R = 2.93 GB (not ~4 GB) and the FA2 projection
    # M0 + c_P*mb*(P+R) gives 227.3 -> 785.9 GB (the printed 225 -> 775 is 1-1.4% lower). We pin the formula.
    law = PAPER_LLAMA31_8B_LAW
    P, R = 96 * K, 2 * K
    assert float(law.predict(P, 16, R) - law.predict(P, 4, R)) == pytest.approx(2.93, abs=0.005)
    assert float(law.fa2_projection(P, 4, R)) == pytest.approx(227.3, abs=0.05)
    assert float(law.fa2_projection(P, 16, R)) == pytest.approx(785.9, abs=0.05)
    assert float(law.predict(P, 16, R)) / float(law.predict(P, 4, R)) - 1 < 0.05     # "<5%" holds


def test_prefix_grouper_token_counts():
    # Prefix Grouper appendix, P=8K, mb=8, R ~ U(131, 2048): "DualKV processes 18K tokens vs FA2's 75K and PG's 81K
    # -- a 4.2x reduction". Only PG's padded count is determined by the text: 8 x (8192 + 2048) = 81,920. With the
    # expected R = 1089.5 the formula gives 16,908 vs 74,252 tokens (4.39x); the paper's sampled lengths are not
    # given, so this is not counted as an inconsistency.
    assert 8 * (8 * K + 2048) == 81_920
    assert tokens_dualkv(8, 8 * K, 1089) == 16_904 and tokens_std(8, 8 * K, 1089) == 74_248
    assert round(tokens_std(8, 8 * K, 1089) / tokens_dualkv(8, 8 * K, 1089), 2) == 4.39
