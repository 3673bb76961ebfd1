"""Load a script of ``experiments/`` (not a package) as a module, for the CPU tests of its logic."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(path: str | Path, name: str) -> ModuleType:
    """The module of ``path`` (relative to the repository root), registered in ``sys.modules`` as ``name`` (dataclasses
    look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
