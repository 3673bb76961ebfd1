"""Input checks for :mod:`dualkv.analysis`: every public function validates its numbers here, once, and the error
names the argument and what is wrong with it."""

from __future__ import annotations

import math
from typing import Sequence, Union

import numpy as np

IntOrSeq = Union[int, Sequence[int]]


def check_int(value: object, name: str, minimum: int) -> int:
    """``value`` as a Python int, refusing bools, non-integral numbers and values below ``minimum``."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got a bool")
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{name} = {value!r} must be a whole number")
        value = int(value)
    if not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        if name == "N":
            raise ValueError(f"N = {int(value)}: need N >= 1 (at least one response per prompt)")
        raise ValueError(f"{name} = {int(value)} is out of range: {name} must be >= {minimum}")
    return int(value)


def check_window(window_left: object) -> int:
    """A causal window's left extent: -1 (unbounded) or >= 0 keys before the query."""
    return check_int(window_left, "window_left", -1)


def response_lengths(N: int | None, R: IntOrSeq) -> tuple[int, ...]:
    """The N response lengths: ``R`` repeated N times, or the explicit list ``R`` (then N, if given, must match)."""
    if isinstance(R, (int, np.integer, float, np.floating)) and not isinstance(R, (bool, np.bool_)):
        if N is None:
            raise ValueError("N is required when R is a single length")
        n = check_int(N, "N", 1)
        return (check_int(R, "R", 1),) * n
    if isinstance(R, (str, bytes)) or not hasattr(R, "__iter__"):
        raise TypeError(f"R must be an int or a sequence of ints, got {type(R).__name__}")
    lens = tuple(check_int(r, f"R[{i}]", 1) for i, r in enumerate(R))
    if not lens:
        raise ValueError("R is an empty list: need N >= 1 responses")
    if N is not None and check_int(N, "N", 1) != len(lens):
        raise ValueError(f"N = {N} but R lists {len(lens)} response lengths")
    return lens


def check_positive_array(value: object, name: str, at_least_one: bool = False) -> np.ndarray:
    """A float array (or scalar) whose entries are all finite and > 0 (``at_least_one``: >= 1, as for N)."""
    arr = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite entries")
    bad = arr < 1 if at_least_one else arr <= 0
    if np.any(bad):
        worst = float(arr[bad].min())
        raise ValueError(f"{name} = {worst:g} is out of range: {name} must be {'>= 1' if at_least_one else '> 0'}")
    return arr


def check_mode(mode: object) -> str:
    if mode not in ("fwd", "bwd", "fwdbwd"):
        raise ValueError(f"mode = {mode!r}: expected 'fwd', 'bwd' or 'fwdbwd'")
    return str(mode)
