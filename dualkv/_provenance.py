"""Which code produced a result: the git commit of the checkout (or ``$DUALKV_COMMIT`` where the code runs from a
copy without git history, e.g. the GPU machine)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> tuple[str, bool | None]:
    """(commit, dirty); ("unknown", None) when neither git nor ``$DUALKV_COMMIT`` can tell."""
    env = os.environ.get("DUALKV_COMMIT")
    if env:
        return env, None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        if not re.fullmatch(r"[0-9a-f]{40}", commit):  # e.g. a copy whose .git points nowhere
            return "unknown", None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        return commit or "unknown", dirty if commit else None
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
