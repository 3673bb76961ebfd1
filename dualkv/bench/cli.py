"""``dualkv bench <kind> ...``: one sub-subcommand per registered bench kind (:data:`dualkv.bench.BENCHES`)."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

from ..cli import subcommand
from . import BENCHES


def load_bench_modules() -> None:
    """Import every public module of ``dualkv.bench`` so their ``register_bench`` calls run."""
    from .. import bench

    for info in pkgutil.iter_modules(bench.__path__):
        if not info.name.startswith("_") and info.name != "cli":
            importlib.import_module(f"{bench.__name__}.{info.name}")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    load_bench_modules()
    kinds = parser.add_subparsers(dest="bench_kind", required=True, metavar="KIND")
    for kind in BENCHES.values():
        p = kinds.add_parser(kind.name, help=kind.help, description=kind.help)
        kind.add_arguments(p)
        p.set_defaults(_bench_run=kind.run)


def _run(args: argparse.Namespace) -> int:
    return int(args._bench_run(args))


subcommand("bench", "GPU benchmarks (layer, model, ...): timings and peak memory as JSON + plot")((_add_arguments, _run))
