"""Condense ``ncu --import REPORT --page details`` text into JSON: per profiled kernel, its launch line and every
"Metric Name / Unit / Value" row of its sections (numbers parsed), so a profile can be committed as a small file.

    python experiments/gpu/ncu_summary.py ncu_dualkv_bwd.txt [more.txt ...] --out checks/ncu-....json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

_KERNEL = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")
_METRIC = re.compile(r"^    (\S.*?)\s{2,}(\S+)?\s+([\d,.]+)\s*$")


def parse(text: str) -> list[dict]:
    kernels: list[dict] = []
    for line in text.splitlines():
        if m := _KERNEL.match(line):
            name = m.group(1)
            kernels.append({"kernel": name[:160], "grid": [int(m.group(i)) for i in (2, 3, 4)],
                            "block": [int(m.group(i)) for i in (5, 6, 7)], "metrics": {}})
        elif kernels and (m := _METRIC.match(line)) and not line.strip().startswith(("OPT", "INF", "WRN")):
            label, unit, value = m.group(1).strip(), m.group(2) or "", m.group(3).replace(",", "")
            if label in ("Metric Name", "----"):
                continue
            try:
                kernels[-1]["metrics"][f"{label} [{unit}]" if unit else label] = float(value)
            except ValueError:
                continue
    return kernels


#: Headline fields lifted out of each kernel's metrics (the results summary shows scalar fields).
HEADLINE = {"duration_us": ("Duration [us]", "Duration [ms]", "Duration [ns]"),
            "sm_throughput_pct": ("Compute (SM) Throughput [%]",), "memory_throughput_pct": ("Memory Throughput [%]",),
            "l2_throughput_pct": ("L2 Cache Throughput [%]",), "issue_slots_busy_pct": ("Issue Slots Busy [%]",),
            "warp_cycles_per_issue": ("Warp Cycles Per Issued Instruction [cycle]",),
            "local_spill_requests": ("Local Memory Spilling Requests",)}
_TO_US = {"[us]": 1.0, "[ms]": 1e3, "[ns]": 1e-3}


def headline(kernel: dict) -> dict:
    out = {"kernel": kernel["kernel"][:90]}
    for field, keys in HEADLINE.items():
        for key in keys:
            if key in kernel["metrics"]:
                value = kernel["metrics"][key]
                out[field] = round(value * _TO_US[key[-4:]], 2) if field == "duration_us" else value
                break
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    parsed = {p.stem: parse(p.read_text()) for p in args.reports}
    data = {"note": args.note, **{stem: [headline(k) for k in kernels] for stem, kernels in parsed.items()},
            "metrics": {stem: kernels for stem, kernels in parsed.items()}}
    args.out.write_text(json.dumps(data, indent=1))
    for stem, kernels in parsed.items():
        for k in data[stem]:
            print(f"{stem}: {k['kernel'][:70]:<70} {k.get('duration_us')} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
