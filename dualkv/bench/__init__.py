"""Benchmarks behind ``dualkv bench <kind>``: a registry other modules add kinds to.

A kind is registered with :func:`register_bench` (``layer`` and ``model`` live here; ``kernel`` and others may
come from elsewhere). ``dualkv bench`` builds one sub-subcommand per entry of :data:`BENCHES` when the parser is
built, so a module only has to be imported before that (``dualkv.bench.cli`` imports every module of this package;
``dualkv.cli`` imports its plugin modules first).

Benchmarks are not tests: they time what they run on whatever device is present and write one JSON file per run
to ``experiments/results/`` (see :mod:`dualkv.bench.harness`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

__all__ = ["BENCHES", "BenchKind", "register_bench"]


@dataclass(frozen=True)
class BenchKind:
    """One ``dualkv bench <name>``: its help line, its argument setup and its run function (-> exit status)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


#: name -> kind, in registration order.
BENCHES: dict[str, BenchKind] = {}


def register_bench(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None],
                   run: Callable[[argparse.Namespace], int]) -> BenchKind:
    """Add ``dualkv bench <name>``. Registering the same name twice with a different run function is an error."""
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"bench name must be a plain word; got {name!r}")
    kind = BenchKind(name, help, add_arguments, run)
    existing = BENCHES.get(name)
    if existing is not None and existing.run is not run:
        raise ValueError(f"a bench named {name!r} is already registered (by {existing.run.__module__})")
    BENCHES[name] = kind
    return kind
