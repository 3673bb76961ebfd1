"""Memory models: kernel savings, activations, the memory-law fit and its readers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dualkv.analysis import (MemoryLaw, activation_memory, checkpoint_bytes_per_token, fit_memory_law,
                             kernel_memory_savings, model_kernel_memory_savings, read_memory_rows)

DATA = Path(__file__).resolve().parent / "data"


def test_kernel_savings_formulas():
    s = kernel_memory_savings(3, 10, 4, 2, 8, dtype_bytes=2)
    assert s == {"kv": 2 * 2 * 10 * 2 * 8 * 2, "q": 2 * 10 * 4 * 8 * 2, "lse": 2 * 10 * 4 * 4,
                 "total": 1280 + 1280 + 320}
    assert kernel_memory_savings(1, 10, 4, 2, 8)["total"] == 0           # N = 1 shares nothing
    assert kernel_memory_savings(3, 10, 4, 2, 8, k_eq_v=True)["kv"] == s["kv"] // 2
    per = model_kernel_memory_savings("qwen3-8b", 8, 16384)
    assert per == {"per_layer": 1_423_966_208, "all_layers": 36 * 1_423_966_208}
    gemma = model_kernel_memory_savings("gemma4-31b-style", 4, 1000)
    assert gemma["per_layer"] == max(kernel_memory_savings(4, 1000, 32, 16, 256)["total"],
                                     kernel_memory_savings(4, 1000, 32, 4, 512, k_eq_v=True)["total"])


def test_activation_memory():
    assert checkpoint_bytes_per_token("qwen3-8b") == 36 * 4096 * 2
    assert activation_memory(1000, 3.5) == 3500.0
    with pytest.raises(ValueError, match="tokens = -1"):
        activation_memory(-1, 1.0)


def test_fit_recovers_an_exact_law():
    truth = MemoryLaw(M0=12.5, c_P=3e-4, c_mbR=7e-5)
    rows = [(P, mb, R, float(truth.predict(P, mb, R))) for P in (4096, 16384, 65536) for mb in (2, 8)
            for R in (512, 2048)]
    law = fit_memory_law(rows)
    assert (law.M0, law.c_P, law.c_mbR) == pytest.approx((12.5, 3e-4, 7e-5), rel=1e-9)
    assert law.r2 == pytest.approx(1.0) and law.n == len(rows)
    assert float(law.fa2_projection(1000, 4, 24)) == pytest.approx(12.5 + 3e-4 * 4 * 1024)


def test_fit_to_synthetic_csv_and_json_agree():
    csv_rows = read_memory_rows(DATA / "synthetic_memory.csv")
    json_rows = read_memory_rows(DATA / "synthetic_layer.json")
    assert len(csv_rows) == 12 and csv_rows == json_rows
    law = fit_memory_law(csv_rows)
    # the synthetic rows were made from 20 + 0.30 P/1024 + 0.10 mb R/1024 GiB plus a small wiggle
    assert law.M0 == pytest.approx(20.0, abs=0.1)
    assert law.c_P * 1024 == pytest.approx(0.30, abs=0.005)
    assert law.c_mbR * 1024 == pytest.approx(0.10, abs=0.005)
    assert 0.999 < law.r2 < 1.0
    residual = [r["peak_mem_gib"] - float(law.predict(r["P"], r["mb"], r["R"])) for r in csv_rows]
    assert max(map(abs, residual)) < 0.06


def test_readers_skip_oom_and_accept_mappings(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("p,MB,r,peak\n1000,1,10,5\n2000,1,10,6\n1000,4,10,5.3\n3000,2,10,OOM\n4000,2,10,\n")
    rows = read_memory_rows(path)
    assert len(rows) == 3
    law = fit_memory_law(rows)
    assert law.c_P == pytest.approx(1e-3) and law.c_mbR == pytest.approx(0.01)
    doc = [{"P": 1000, "mb": 1, "R": 10, "peak_mem_gib": 5}, {"P": 2000, "mb": 1, "R": 10, "peak_mem_gib": 6},
           {"P": 1000, "mb": 4, "R": 10, "peak_mem_gib": 5.3}, {"P": 1000, "mb": 8, "R": 10, "status": "OOM"}]
    (tmp_path / "m.json").write_text(json.dumps(doc))
    assert len(read_memory_rows(tmp_path / "m.json")) == 3


@pytest.mark.parametrize("rows,match", [
    ([(1000, 1, 10, 5.0), (2000, 1, 10, 6.0)], "at least 3 rows"),
    ([(1000, 1, 10, 5.0), (1000, 2, 10, 6.0), (1000, 4, 10, 7.0)], "rank-deficient"),
    ([(1000, 1, 10, 5.0), (2000, 2, 10, 6.0), ("x", 4, 10, 7.0)], "non-numeric"),
    ([{"P": 1, "R": 2, "peak": 3}], "no 'mb' column"),
    ([(1000, 0, 10, 5.0)], "mb = 0"),
    ([(1, 2, 3)], r"must be \(P, mb, R, peak\)"),
])
def test_fit_errors_name_the_problem(rows, match):
    with pytest.raises(ValueError, match=match):
        fit_memory_law(rows)


def test_read_memory_rows_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no memory measurement file"):
        read_memory_rows(tmp_path / "missing.csv")
    (tmp_path / "rows.txt").write_text("P,mb,R,peak\n")
    with pytest.raises(ValueError, match=".csv or .json"):
        read_memory_rows(tmp_path / "rows.txt")


def test_law_broadcasts():
    law = MemoryLaw(M0=1.0, c_P=0.5, c_mbR=0.25)
    out = law.predict(np.array([1, 2]), np.array([[1], [2]]), 4)
    assert out.shape == (2, 2) and out[1, 1] == 1.0 + 1.0 + 2.0


def test_memory_rows_take_a_steps_peak_over_its_phases(tmp_path):
    """A policy_update result file has one row per phase (old/ref log-probs, update), each with the peak of that
    phase alone. The memory law models a training step's peak: one row per configuration, the largest phase peak
    (a configuration with an OOM phase has no step peak)."""
    from dualkv.analysis import memory_rows, read_result_file

    def rows(P, mb, peaks, status="ok"):
        return [{"system": "dualkv", "N": 8, "P": P, "R": 2048, "mb": mb, "phase": phase, "seconds": 1.0,
                 "peak_mem_gib": peak, "status": status if phase == "update_actor" else "ok"}
                for phase, peak in zip(("old_log_prob", "ref_log_prob", "update_actor"), peaks)]

    doc = {"benchmark": "policy_update", "rows": rows(4096, 4, (10.0, 10.5, 30.0)) + rows(8192, 4, (12.0, 12.5, 35.0))
           + rows(8192, 8, (13.0, 13.5, 40.0)) + rows(16384, 8, (15.0, 15.5, None), status="OOM")}
    (tmp_path / "pu.json").write_text(json.dumps(doc))
    got = memory_rows(read_result_file(tmp_path / "pu.json"))
    assert got == [{"P": 4096.0, "mb": 4.0, "R": 2048.0, "peak_mem_gib": 30.0},
                   {"P": 8192.0, "mb": 4.0, "R": 2048.0, "peak_mem_gib": 35.0},
                   {"P": 8192.0, "mb": 8.0, "R": 2048.0, "peak_mem_gib": 40.0}]
