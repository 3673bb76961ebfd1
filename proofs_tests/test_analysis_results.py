"""Result-file readers and the prediction-vs-measurement table (synthetic files in proofs_tests/data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualkv.analysis import (attention_flops, attn_speedup_pairs, compare, default_results_dir, format_table,
                             load_results, pairs_dualkv, read_result_file, row_layout)

DATA = Path(__file__).resolve().parent / "data"


def kernel_rows():
    with pytest.warns(UserWarning, match="row 10 is not an object"):
        return read_result_file(DATA / "synthetic_kernel.json")


def test_read_kernel_file_tolerantly():
    rows = kernel_rows()
    assert len(rows) == 10
    assert all(r.benchmark == "kernel" and "SYNTHETIC" in r.gpu for r in rows)
    oom = [r for r in rows if r.status == "OOM"]
    assert len(oom) == 1 and oom[0].ms is None and oom[0].system == "fa2_ncopy" and not oom[0].ok
    cascade = next(r for r in rows if r.system == "cascade")
    assert cascade.mb is None and cascade.tflops is None and cascade.peak_mem_gib is None and cascade.ok
    listed = next(r for r in rows if r.R_list)
    assert listed.R_list == (100, 300, 500, 700) and listed.R == 400 and listed.N == 4
    assert row_layout(listed).response_lens == ((100, 300, 500, 700),)


def test_row_layout_with_micro_batches():
    rows = read_result_file(DATA / "synthetic_layer.json")
    row = next(r for r in rows if r.mb == 4)
    assert row.N == 32 and row_layout(row).group_sizes == (4,)
    assert [row_layout(r) for r in rows if r.P is None] == []


def test_load_results_filters_and_missing_dirs(tmp_path):
    with pytest.warns(UserWarning):
        rows = load_results(DATA)
    assert {r.benchmark for r in rows} == {"kernel", "layer"}
    assert all(r.benchmark == "layer" for r in load_results(DATA / "synthetic_layer.json", benchmark="layer"))
    with pytest.warns(UserWarning):
        assert len(load_results(DATA, system="cascade")) == 1
    assert load_results(tmp_path / "nothing") == []
    assert load_results(tmp_path) == []
    with pytest.warns(UserWarning, match="truncated.json"):
        assert load_results(DATA / "broken") == []
    with pytest.raises(ValueError, match="truncated.json: not a readable JSON"):
        read_result_file(DATA / "broken" / "truncated.json")
    (tmp_path / "x.json").write_text(json.dumps({"rows": 3}))
    with pytest.raises(ValueError, match="list 'rows'"):
        read_result_file(tmp_path / "x.json")


def test_status_inference(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"benchmark": "kernel", "rows": [
        {"system": "dualkv", "ms": "OOM"}, {"system": "dualkv"}, {"system": "dualkv", "ms": "12.5", "N": 4.0},
        {"system": "dualkv", "status": "Ok", "ms": float("nan")}]}))
    rows = read_result_file(tmp_path / "r.json")
    assert [r.status for r in rows] == ["OOM", "missing", "ok", "ok"]
    assert rows[2].ms == 12.5 and rows[2].N == 4 and rows[3].ms is None


def test_default_results_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("DUALKV_RESULTS_DIR", str(tmp_path))
    assert default_results_dir() == tmp_path
    monkeypatch.delenv("DUALKV_RESULTS_DIR")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "experiments" / "results").mkdir(parents=True)
    assert default_results_dir() == tmp_path / "experiments" / "results"


def test_compare_kernel_rows():
    table = compare(kernel_rows())
    by = {(e["system"], e["N"], e["P"]): e for e in table}
    e = by[("dualkv", 16, 32768)]
    assert e["speedup_measured"] == pytest.approx(e["ms_baseline"] / e["ms"])
    assert e["speedup_predicted"] == pytest.approx(attn_speedup_pairs(16, 32768, 2048))
    assert e["useful_tflops"] == pytest.approx(attention_flops(pairs_dualkv(16, 32768, 2048), 32, 128, "fwdbwd")
                                               / (e["ms"] * 1e-3) / 1e12)
    oom = by[("dualkv", 16, 65536)]
    assert oom["status_baseline"] == "OOM" and oom["speedup_measured"] is None and oom["speedup_predicted"] > 8
    assert by[("cascade", 16, 32768)]["speedup_measured"] is not None      # mb missing still matches mb = N
    assert by[("dualkv", 4, 4096)]["status_baseline"] == "missing"
    text = format_table(table, ["system", "N", "P", "speedup_measured", "speedup_predicted"])
    assert "cascade" in text and text.splitlines()[1].startswith("-")
    assert format_table([]) == "(no rows)"


def test_compare_layer_rows_use_the_micro_batch():
    table = compare(read_result_file(DATA / "synthetic_layer.json"), model="llama-3.1-8b")
    assert len(table) == 12 and all(e["responses_per_group"] == e["mb"] for e in table)
    assert sum(e["speedup_measured"] is not None for e in table) == 6


def test_harness_rows_with_r_list_get_a_layout(tmp_path):
    """dualkv.bench.harness writes layer/model rows with ``R_list`` (and no ``R`` or ``N``): they must still get a
    layout, a prediction and memory rows."""
    from dualkv.analysis import memory_rows

    (tmp_path / "layer.json").write_text(json.dumps({"benchmark": "layer", "rows": [
        {"system": s, "P": 4096, "mb": 4, "R_list": [100, 300, 500, 700], "R_total": 1600, "ms": ms,
         "peak_mem_gib": 10.0, "status": "ok"} for s, ms in (("dualkv", 10.0), ("fa2_ncopy", 20.0))]}))
    rows = read_result_file(tmp_path / "layer.json")
    assert rows[0].R_list == (100, 300, 500, 700) and rows[0].R == 400
    assert row_layout(rows[0]).response_lens == ((100, 300, 500, 700),)
    (entry,) = compare(rows)
    assert entry["speedup_measured"] == 2.0 and entry["speedup_predicted"] > 1
    assert memory_rows(rows) == [{"P": 4096.0, "mb": 4.0, "R": 400.0, "peak_mem_gib": 10.0}]


def test_compare_keeps_head_geometries_apart(tmp_path):
    """Kernel rows that name their heads / head_dim are compared only with a baseline of the same shape, and their
    useful TFLOP/s counts their own shape (rows that do not say are Qwen3-8B's 32 x 128)."""
    base = {"N": 8, "P": 8192, "R": 2048, "mode": "fwdbwd", "status": "ok"}
    (tmp_path / "k.json").write_text(json.dumps({"benchmark": "kernel", "rows": [
        {**base, "system": "fa2_ncopy", "heads": 32, "kv_heads": 8, "head_dim": 128, "ms": 40.0},
        {**base, "system": "dualkv", "heads": 32, "kv_heads": 8, "head_dim": 128, "ms": 10.0},
        {**base, "system": "fa2_ncopy", "heads": 32, "kv_heads": 8, "head_dim": 64, "ms": 30.0},
        {**base, "system": "dualkv", "heads": 32, "kv_heads": 8, "head_dim": 64, "ms": 5.0},
        {**base, "system": "dualkv_mma", "heads": 32, "kv_heads": 8, "head_dim": 64, "ms": 6.0},
        {**base, "system": "dualkv_mma", "ms": 8.0}]}))
    table = compare(read_result_file(tmp_path / "k.json"))
    by = {(e["system"], e["head_dim"]): e for e in table}
    assert by[("dualkv", 128)]["speedup_measured"] == 4.0
    assert by[("dualkv", 64)]["speedup_measured"] == 6.0
    assert by[("dualkv_mma", 64)]["speedup_measured"] == 5.0
    assert by[("dualkv_mma", 128)]["speedup_measured"] == 5.0          # no shape given: Qwen3-8B's
    useful = attention_flops(pairs_dualkv(8, 8192, 2048), 32, 64, "fwdbwd") / 5e-3 / 1e12
    assert by[("dualkv", 64)]["useful_tflops"] == pytest.approx(useful)


def test_a_bad_entry_in_an_r_list_is_not_dropped_silently(tmp_path):
    """A response-length list with an unreadable entry does not describe the batch: dropping the entry would
    invent a smaller batch (fewer responses, another mean R), so the row has no R at all."""
    (tmp_path / "r.json").write_text(json.dumps({"benchmark": "kernel", "rows": [
        {"system": "dualkv", "N": 3, "P": 1000, "R": [100, "x", 300], "ms": 1.0},
        {"system": "dualkv", "N": 3, "P": 1000, "R": [100, 2.5, 300], "ms": 1.0},
        {"system": "dualkv", "N": 3, "P": 1000, "R_list": [100, 0, 300], "ms": 1.0}]}))
    rows = read_result_file(tmp_path / "r.json")
    for row in rows:
        assert row.R_list is None and row.R is None and row_layout(row) is None
    assert compare(rows)[0]["speedup_predicted"] is None                 # and no ValueError from the layout
