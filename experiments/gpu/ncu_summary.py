"""Condense ``ncu --import REPORT --page details`` text into JSON: per profiled kernel, its launch line and every
"Metric Name / Unit / Value" row of its sections (numbers parsed), so a profile can be committed as a small file.
With ``--source``, the inputs are ``--page source --print-source sass --csv`` exports (plain or gzipped) of the
SourceCounters section instead: per kernel, the warp-stall samples by reason and by opcode, local-memory and
shared-memory counts, and the instructions with the most samples.

    python experiments/gpu/ncu_summary.py ncu_dualkv_bwd.txt [more.txt ...] --out checks/ncu-....json
    python experiments/gpu/ncu_summary.py --source ncusrc_rows.csv.gz --out checks/ncu-...-source.json
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import re
from collections import Counter
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


_SAMPLES = "Warp Stall Sampling (All Samples)"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def parse_source(text: str) -> list[dict]:
    """The source page's CSV: a "Kernel Name" line, a header row starting with "Address", then one row per SASS
    instruction, for each profiled kernel. Returns one {kernel, rows} per kernel (rows: dicts keyed by the header)."""
    kernels: list[dict] = []
    header = None
    for row in csv.reader(io.StringIO(text)):
        if row and row[0] == "Kernel Name":
            kernels.append({"kernel": row[1][:160], "rows": []})
            header = None
        elif row and row[0] == "Address":
            header = row
        elif kernels and header and len(row) == len(header):
            kernels[-1]["rows"].append(dict(zip(header, row)))
    return kernels


def _opcode(sass: str) -> str:
    words = sass.split()
    if words and words[0].startswith("@"):  # a predicate guard
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def source_summary(kernel: dict, top: int = 12) -> dict:
    """Warp-stall samples of one kernel by reason (% of all samples) and by opcode (% of samples, % of executed
    warp instructions, main reasons), local-memory instructions and their executions, shared wavefronts (all and
    excessive, i.e. bank conflicts), and the ``top`` instructions with the most samples, in program order."""
    rows = kernel["rows"]
    reasons = [k for k in (rows[0] if rows else {}) if k.startswith("stall_") and "(Not Issued)" not in k]
    # each row's samples per reason ("stall_" dropped), counted once and summed by opcode and overall below
    row_stalls = [Counter({k[6:]: _number(r[k]) for k in reasons}) for r in rows]
    row_samples = [_number(r[_SAMPLES]) for r in rows]
    row_executed = [_number(r["Instructions Executed"]) for r in rows]
    samples, executed = sum(row_samples), sum(row_executed)
    by_op: dict[str, list] = {}
    for r, stalls, smp, ex in zip(rows, row_stalls, row_samples, row_executed):
        entry = by_op.setdefault(_opcode(r["Source"]), [0.0, 0.0, Counter()])
        entry[0] += smp
        entry[1] += ex
        entry[2].update(stalls)
    by_reason = sum((c for _, _, c in by_op.values()), Counter())
    local = [i for i, r in enumerate(rows) if re.search(r"\b(LDL|STL)\b", r["Source"])]
    ranked = sorted(range(len(rows)), key=lambda i: -row_samples[i])[:top]
    pct = lambda v: round(100 * v / samples, 2) if samples else 0.0  # noqa: E731
    main_stalls = lambda c: {k: pct(v) for k, v in c.most_common(3) if v}  # noqa: E731
    return {
        "kernel": kernel["kernel"][:90], "instructions": len(rows), "samples": samples,
        "executed_warp_instructions": executed,
        "stall_pct": {k: pct(v) for k, v in by_reason.most_common() if v},
        "opcodes": [{"opcode": op, "samples_pct": pct(smp),
                     "executed_pct": round(100 * ex / executed, 2) if executed else 0.0, "stalls_pct": main_stalls(c)}
                    for op, (smp, ex, c) in sorted(by_op.items(), key=lambda x: -x[1][0])[:16]],
        "local_instructions": len(local),
        "local_executed": sum(row_executed[i] for i in local),
        "shared_wavefronts": sum(_number(r.get("L1 Wavefronts Shared", "0")) for r in rows),
        "shared_wavefronts_excessive": sum(_number(r.get("L1 Wavefronts Shared Excessive", "0")) for r in rows),
        "top": [{"index": i, "sass": rows[i]["Source"].strip()[:100], "samples_pct": pct(row_samples[i]),
                 "executed": row_executed[i], "stalls_pct": main_stalls(row_stalls[i])}
                for i in sorted(ranked)],
    }


def _read(path: Path) -> str:
    return gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("--source", action="store_true", help="the inputs are source-page CSV exports")
    args = ap.parse_args()
    if args.source:
        keys = [p.name.split(".")[0] for p in args.reports]  # ncusrc_rows.csv.gz -> ncusrc_rows
        if len(set(keys)) < len(keys) or "note" in keys:
            raise SystemExit(f"input names must differ before their first dot and not be 'note': {keys}")
        data = {"note": args.note, **{key: [source_summary(k) for k in parse_source(_read(p))]
                                      for key, p in zip(keys, args.reports)}}
        args.out.write_text(json.dumps(data, indent=1))
        for stem, kernels in data.items():
            for k in kernels if stem != "note" else ():
                print(f"{stem}: {k['kernel'][:60]:<60} stalls {dict(list(k['stall_pct'].items())[:4])}")
        return 0
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
