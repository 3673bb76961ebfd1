"""Run a function right after a module is imported (or now, if it already is).

veRL loads plugins from inside ``import verl``, before the engine and trainer modules exist; importing those
modules there would pull in most of veRL (and, for the trainers, Ray and the HTTP stack) on every ``import verl``.
Instead each patch is attached to its module's import: a meta-path finder wraps the module's loader so the patch
runs once the module body has executed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Callable

__all__ = ["when_imported"]

_PENDING: dict[str, list[Callable[[ModuleType], None]]] = {}
_LOCK = threading.RLock()


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the callbacks registered for the module."""

    def __init__(self, wrapped: importlib.abc.Loader) -> None:
        self._wrapped = wrapped

    def create_module(self, spec):
        return self._wrapped.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._wrapped.exec_module(module)
        with _LOCK:
            callbacks = _PENDING.pop(module.__name__, [])
        for callback in callbacks:
            callback(module)

    def __getattr__(self, name: str):  # get_source, get_code, is_package, ... of the real loader
        return getattr(self._wrapped, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; for a watched module it asks the other finders and wraps the loader they return."""

    def find_spec(self, fullname, path, target=None):
        with _LOCK:
            if fullname not in _PENDING:
                return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _PatchingLoader):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


_FINDER = _Finder()


def when_imported(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` now if ``module_name`` is imported, else right after its import completes."""
    with _LOCK:
        module = sys.modules.get(module_name)
        if module is None:
            _PENDING.setdefault(module_name, []).append(callback)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    callback(module)
