"""Check DUALKV_BUILD_LOG files (dualkv/cuda/build.py): every compiler-chosen build compiled fresh carries its ptxas
spill report, and a specialization asked for by several processes (same NVRTC; one file may log several) got the same
cubin in each.

    python experiments/gpu/build_log_check.py build_t1.jsonl build_p0.jsonl

Prints one line per file and one per disagreement; exits 1 when a report is missing or two files disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dualkv.cuda.build import CHOSEN_MACROS  # noqa: E402


def read(path: Path) -> list[dict]:
    """The JSON lines of one build log."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    failed = False
    kept: dict[tuple[str, str], dict[str, str]] = {}  # (spec, nvrtc) -> {"file#pid": cubin hash}
    for path in args.logs:
        records = read(path)
        chosen = [r for r in records if not r["cache_hit"] and set(r.get("kept_macros", {})) & set(CHOSEN_MACROS)]
        missing = [r for r in chosen if "spill_stores" not in r]
        print(f"{path.name}: {len(records)} builds, {len(chosen)} compiler-chosen compiled here, "
              f"{len(missing)} without a spill report")
        for r in missing:
            print(f"  no spill report: {r['spec']} kept {r['kept_macros']}")
        failed |= bool(missing)
        for r in records:
            kept.setdefault((r["spec"], r["nvrtc"]), {})[f"{path.name}#{r['pid']}"] = r["cubin_sha256"]
    shared = {key: files for key, files in kept.items() if len(files) > 1}
    differ = {key: files for key, files in shared.items() if len(set(files.values())) > 1}
    print(f"{len(shared)} specializations asked for by more than one process, {len(differ)} with different cubins")
    for (spec, nvrtc), files in differ.items():
        print(f"  NVRTC {nvrtc} {spec}: {files}")
    return 1 if failed or differ else 0


if __name__ == "__main__":
    sys.exit(main())
