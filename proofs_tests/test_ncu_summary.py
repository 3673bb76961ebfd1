"""experiments/gpu/ncu_summary.py: Nsight Compute's details page condensed to JSON (per kernel: launch shape, every
metric row, headline fields with durations in microseconds)."""

from __future__ import annotations

import json
import sys

import pytest

from experiment_scripts import load_script

PAGE = """\
  dualkv_bwd_sm90_ws (4096, 1, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    Elapsed Cycles                cycle  258,587,269
    Duration                         ms       155.15
    Compute (SM) Throughput           %        48.40
    OPT   Memory is more heavily utilized than Compute: 12.5 percent
    Section: Memory Workload Analysis
    Local Memory Spilling Requests                      761,333,760
  dualkv_bwd_dq_cast (131072, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Duration                         us       532.60
    Warp Cycles Per Issued Instruction             cycle        67.92
"""


def test_kernels_metrics_and_headline(tmp_path):
    ncu = load_script("experiments/gpu/ncu_summary.py", "ncu_summary")
    kernels = ncu.parse(PAGE)
    assert [k["kernel"] for k in kernels] == ["dualkv_bwd_sm90_ws", "dualkv_bwd_dq_cast"]
    assert kernels[0]["grid"] == [4096, 1, 1] and kernels[0]["block"] == [384, 1, 1]
    ws = kernels[0]["metrics"]
    assert ws["Elapsed Cycles [cycle]"] == 258587269 and ws["Local Memory Spilling Requests"] == 761333760
    assert not any(key.startswith(("OPT", "Metric Name")) for key in ws)  # advice and header rows are not metrics
    head = [ncu.headline(k) for k in kernels]
    assert head[0]["duration_us"] == 155150.0 and head[1]["duration_us"] == 532.6  # ms and us both to us
    assert head[0]["sm_throughput_pct"] == 48.4 and head[1]["warp_cycles_per_issue"] == 67.92
    page = tmp_path / "ncu_x.txt"
    page.write_text(PAGE)
    out = tmp_path / "x.json"
    argv, sys.argv = sys.argv, ["ncu_summary.py", str(page), "--out", str(out), "--note", "n"]
    try:
        assert ncu.main() == 0
    finally:
        sys.argv = argv
    data = json.loads(out.read_text())
    assert data["note"] == "n" and data["ncu_x"][1]["kernel"] == "dualkv_bwd_dq_cast"
    assert data["metrics"]["ncu_x"][0]["metrics"]["Duration [ms]"] == 155.15


SOURCE_CSV = """\
"Kernel Name","dualkv_bwd_dq",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","L1 Wavefronts Shared","L1 Wavefronts Shared Excessive","stall_long_sb","stall_wait","stall_long_sb (Not Issued)"
"0x0","      DEPBAR.LE SB0, 0x0","10","100","0","0","0","10","0"
"0x10","      HMMA.16816.F32.BF16 R152, R196, R192, RZ","25","400","0","0","0","25","0"
"0x20","      ULOP3.LUT UR5, URZ, UR4, URZ, 0x33, !UPT","60","100","0","0","58","2","50"
"0x30","  @P0 LDL R4, [R1+0x8]","5","50","0","0","5","0","0"
"Kernel Name","dualkv_bwd_dkdv",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","L1 Wavefronts Shared","L1 Wavefronts Shared Excessive","stall_long_sb","stall_wait","stall_long_sb (Not Issued)"
"0x0","      LDSM.16.M88.4 R8, [R2+UR5]","4","10","40","8","0","4","0"
"""


def test_source_counters_summary(tmp_path):
    """--source: per kernel, stall reasons and opcodes as % of samples (Not-Issued columns left out), predicated
    opcodes named without their guard, local-memory executions, shared wavefronts, the top instructions in order."""
    import gzip

    ncu = load_script("experiments/gpu/ncu_summary.py", "ncu_summary")
    kernels = ncu.parse_source(SOURCE_CSV)
    assert [k["kernel"] for k in kernels] == ["dualkv_bwd_dq", "dualkv_bwd_dkdv"]
    dq = ncu.source_summary(kernels[0], top=2)
    assert dq["samples"] == 100 and dq["stall_pct"] == {"long_sb": 63.0, "wait": 37.0}
    ops = {o["opcode"]: o for o in dq["opcodes"]}
    assert ops["ULOP3"]["samples_pct"] == 60.0 and ops["HMMA"]["executed_pct"] == round(100 * 400 / 650, 2)
    assert ops["LDL"]["samples_pct"] == 5.0 and dq["local_instructions"] == 1 and dq["local_executed"] == 50
    assert [t["index"] for t in dq["top"]] == [1, 2]  # the two most sampled (2 before 1), in program order
    assert dq["top"][1]["stalls_pct"] == {"long_sb": 58.0, "wait": 2.0}
    dkdv = ncu.source_summary(kernels[1])
    assert dkdv["shared_wavefronts"] == 40 and dkdv["shared_wavefronts_excessive"] == 8
    path = tmp_path / "ncusrc_rows.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write(SOURCE_CSV)
    out = tmp_path / "s.json"
    argv, sys.argv = sys.argv, ["ncu_summary.py", "--source", str(path), "--out", str(out), "--note", "n"]
    try:
        assert ncu.main() == 0
    finally:
        sys.argv = argv
    data = json.loads(out.read_text())
    assert data["note"] == "n" and [k["kernel"] for k in data["ncusrc_rows"]] == ["dualkv_bwd_dq", "dualkv_bwd_dkdv"]
    empty = ncu.source_summary({"kernel": "k", "rows": []})
    assert empty["samples"] == 0 and empty["stall_pct"] == {} and empty["top"] == []
    other = tmp_path / "sub"
    other.mkdir()
    (other / "ncusrc_rows.csv").write_text(SOURCE_CSV)  # the same key as the first input
    argv, sys.argv = sys.argv, ["ncu_summary.py", "--source", str(path), str(other / "ncusrc_rows.csv"), "--out",
                                str(out)]
    try:
        with pytest.raises(SystemExit, match="must differ"):
            ncu.main()
    finally:
        sys.argv = argv
