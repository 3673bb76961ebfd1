"""experiments/gpu/ncu_summary.py: Nsight Compute's details page condensed to JSON (per kernel: launch shape, every
metric row, headline fields with durations in microseconds)."""

from __future__ import annotations

import json
import sys

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
