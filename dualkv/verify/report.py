"""Printing and saving the rows of ``dualkv verify``."""

from __future__ import annotations

import datetime as _dt
import json
import platform
from pathlib import Path
from typing import Sequence

import torch

from .._provenance import git_commit
from .checks import Row


def environment() -> dict:
    """Where the rows were produced: versions, device, commit, date, and the kernel choices in force that the CUDA rows
    ran under (the family, e.g. ``DUALKV_KERNELS=mma``; the mma.sync backward; the path override; the NVRTC)."""
    from ..cuda.build import nvrtc_version
    from ..cuda.configs import current_kernel_family, current_mma_backward, current_path

    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "kernel_family": current_kernel_family(),
        "mma_backward": current_mma_backward(),
        "path": current_path(),
        "nvrtc": nvrtc_version(),
    }
    env["commit"], env["dirty"] = git_commit()
    return env


def format_table(rows: Sequence[Row]) -> str:
    head = ("check", "configuration", "quantity", "backend", "dtype", "max error", "bound", "")
    body = [(r.check, r.config, r.quantity, r.backend, r.dtype, f"{r.error:.2e}", f"{r.bound:.1e}",
             "PASS" if r.passed else "FAIL") for r in rows]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)])


def summary(rows: Sequence[Row]) -> dict:
    failed = [r for r in rows if not r.passed]
    return {"rows": len(rows), "passed": len(rows) - len(failed), "failed": len(failed)}


class JsonTargetError(ValueError):
    """``--json`` names a path the report cannot be written to (raised before the matrix runs)."""


def json_target_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot take the JSON report (a folder, or below a file), or None; asked before the matrix runs,
    so a bad ``--json`` does not end a full run in a traceback."""
    path = Path(path)
    if path.is_dir():
        return f"--json {path} is a folder; give a file path such as {path / 'verify.json'}"
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        return f"--json {path}: {blocking} is a file, not a folder"
    return None


def write_json(path: str | Path, rows: Sequence[Row], extra: dict | None = None) -> None:
    payload = {"environment": environment(), "summary": summary(rows), "rows": [r.to_dict() for r in rows]}
    if extra:
        payload.update(extra)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
