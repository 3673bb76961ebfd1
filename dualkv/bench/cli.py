"""``dualkv bench <kind> ...``: one sub-subcommand per registered bench kind (:data:`dualkv.bench.BENCHES`)."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

from ..cli import subcommand
from . import BENCHES

#: Where ``dualkv bench`` writes results and figures unless told otherwise: outside the tracked tree (``/out/`` is
#: git-ignored), so a local run never lands among the committed runs in ``experiments/results`` that the docs, the
#: notebooks and ``experiments/summarize.py`` read. Record a run there on purpose with ``--out experiments/results``.
DEFAULT_OUT = "out/bench"
_TRACKED_RESULTS = "experiments/results"


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
        _results_outside_the_tree(p)
        p.set_defaults(_bench_run=kind.run)


def _results_outside_the_tree(parser: argparse.ArgumentParser) -> None:
    """A kind whose ``--out`` defaults into the tracked ``experiments/results`` writes to :data:`DEFAULT_OUT`."""
    for action in parser._actions:
        if action.dest == "out" and str(action.default).rstrip("/") == _TRACKED_RESULTS:
            action.default = DEFAULT_OUT
            action.help = (f"output folder (default {DEFAULT_OUT}, outside the tracked tree; "
                           f"{_TRACKED_RESULTS} holds the runs the docs cite)")


def _run(args: argparse.Namespace) -> int:
    return int(args._bench_run(args))


subcommand("bench", "GPU benchmarks (layer, model, ...): timings and peak memory as JSON + plot")((_add_arguments, _run))
