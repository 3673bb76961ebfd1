"""dualkv's warnings: each distinct message is issued once per process, so a per-layer call does not repeat it."""

from __future__ import annotations

import threading
import warnings

__all__ = ["DualKVWarning", "FallbackWarning", "warn_once"]


class DualKVWarning(UserWarning):
    """Something dualkv was asked for has no effect, or runs differently than the caller may expect."""


class FallbackWarning(DualKVWarning):
    """A call that the CUDA kernels would serve runs on the (much slower) pure-PyTorch reference; the message says
    why."""


_issued: set[tuple[type, str]] = set()
_lock = threading.Lock()


def warn_once(message: str, category: type[Warning] = DualKVWarning, stacklevel: int = 3) -> None:
    """``warnings.warn(message, category)`` the first time this (category, message) comes up in the process."""
    key = (category, message)
    with _lock:
        if key in _issued:
            return
        _issued.add(key)
    warnings.warn(message, category, stacklevel=stacklevel)


def reset() -> None:
    """Forget which warnings were issued (tests)."""
    with _lock:
        _issued.clear()
