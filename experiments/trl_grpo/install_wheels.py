"""Install the carried wheels (experiments/trl_grpo/fetch_wheels.sh) on a machine without network, touching as little as
possible: a wheel is installed only when its distribution is missing, or when the installed version does not meet
what another carried wheel requires and the carried one does. Nothing is resolved online (``--no-deps
--no-index``). Afterwards every requirement of the carried wheels is checked and the unmet ones are printed.

    python3 experiments/trl_grpo/install_wheels.py [WHEEL_DIR]      # default: .whl at the repo root
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version


def wheel_requirements(path: Path) -> list[Requirement]:
    """The unconditional (and marker-true) Requires-Dist of a wheel."""
    with zipfile.ZipFile(path) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(name).decode())
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def installed(name: str) -> Version | None:
    try:
        return Version(metadata.version(name))
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Install the carried wheels of fetch_wheels.sh where a distribution "
                                                 "is missing or too old, offline (--no-deps --no-index).")
    parser.add_argument("folder", nargs="?", metavar="WHEEL_DIR", type=Path,
                        default=Path(__file__).resolve().parents[2] / ".whl",
                        help="folder of the carried wheels (default: .whl at the repo root)")
    folder = parser.parse_args(argv).folder
    wheels = {}
    for path in sorted(folder.glob("*.whl")):
        name, version, *_ = parse_wheel_filename(path.name)
        wheels[canonicalize_name(name)] = (Version(str(version)), path)
    if not wheels:
        print(f"no wheels in {folder}; run experiments/trl_grpo/fetch_wheels.sh first", file=sys.stderr)
        return 1
    needs = {name: wheel_requirements(path) for name, (_, path) in wheels.items()}
    chosen = []
    for name, (version, path) in wheels.items():
        have = installed(name)
        unmet = [r for reqs in needs.values() for r in reqs
                 if canonicalize_name(r.name) == name and have is not None and not r.specifier.contains(have, True)]
        if have is None or (unmet and all(r.specifier.contains(version, True) for r in unmet)):
            chosen.append(path)
            print(f"install {path.name}" + (f" (have {have}; needed {', '.join(map(str, unmet))})" if have else ""))
        else:
            print(f"keep    {name} {have}")
    if chosen:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        *map(str, chosen)], check=True)
    problems = []
    for name, reqs in needs.items():
        for r in reqs:
            have = installed(r.name)
            if have is None or not r.specifier.contains(have, True):
                problems.append(f"{name} needs {r} (installed: {have})")
    for line in problems:
        print(f"UNMET   {line}")
    print(f"{len(chosen)} wheel(s) installed, {len(problems)} unmet requirement(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
