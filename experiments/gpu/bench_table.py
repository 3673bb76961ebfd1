"""A short table of ``dualkv bench kernel`` result files: per micro-batch (groups, N, P, responses), each system's
forward / backward / forward+backward median ms and its forward+backward time over the first system's of the same
file (files are separate processes; only systems of one file were timed side by side).

    python experiments/gpu/bench_table.py $OUT/bench            # every kernel-*.json below the folder
    python experiments/gpu/bench_table.py a.json b.json --json summary.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def result_files(paths: list[str]) -> list[Path]:
    """The ``kernel-*.json`` files named, or found below the folders named, in name order within each folder."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.rglob("kernel-*.json")) if p.is_dir() else [p]
    return files


def batch_label(row: dict) -> str:
    """'4 x (8, 512), R 256-4096 (mean 2190)' for a row of ``groups`` groups of N responses on a P-token prompt."""
    groups = row.get("groups", 1)
    responses = f"R {row['r_range']} (mean {row['R']})" if row.get("r_range") else f"R {row['R']}"
    shape = f"({row['N']}, {row['P']}), {responses}"
    return f"{groups} x {shape}" if groups > 1 else shape


def summarize(files: list[Path]) -> list[dict]:
    """One entry per (file, micro-batch, system): ms by mode and the fwd+bwd ratio to the file's first system."""
    out = []
    for path in files:
        rows = json.loads(path.read_text())["rows"]
        by_batch: dict[str, dict[str, dict[str, float | None]]] = {}
        for r in rows:
            by_batch.setdefault(batch_label(r), {}).setdefault(r["system"], {})[r["mode"]] = r["ms"]
        for batch, systems in by_batch.items():
            first = next(iter(systems.values())).get("fwdbwd")
            for system, ms in systems.items():
                fb = ms.get("fwdbwd")
                out.append({"file": path.parent.name or path.name, "batch": batch, "system": system, **ms,
                            "x_first": fb / first if fb and first else None})
    return out


def format_table(entries: list[dict]) -> str:
    cell = lambda v: f"{v:8.2f}" if isinstance(v, float) else f"{'-':>8}"  # noqa: E731
    lines = [f"{'process':<12} {'micro-batch':<40} {'system':<14} {'fwd':>8} {'bwd':>8} {'fwd+bwd':>8} {'x 1st':>6}"]
    for e in entries:
        ratio = f"{e['x_first']:6.2f}" if e["x_first"] else f"{'-':>6}"
        lines.append(f"{e['file'][:12]:<12} {e['batch'][:40]:<40} {e['system'][:14]:<14} {cell(e.get('fwd'))} "
                     f"{cell(e.get('bwd'))} {cell(e.get('fwdbwd'))} {ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", help="result files or folders holding them")
    p.add_argument("--json", default=None, help="also write the entries here")
    args = p.parse_args(argv)
    missing = [path for path in args.paths if not Path(path).exists()]
    if missing:
        print(f"no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 1
    files = result_files(args.paths)
    if not files:
        print(f"no kernel-*.json under {args.paths}", file=sys.stderr)
        return 1
    entries = summarize(files)
    print(format_table(entries))
    if args.json:
        Path(args.json).write_text(json.dumps(entries, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
