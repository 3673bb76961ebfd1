"""The ``dualkv`` command line: ``dualkv verify`` (and the subcommands other parts of the toolkit add)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

#: name -> (help, add_arguments(parser), run(args) -> exit code). Subpackages register here.
SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def subcommand(name: str, help: str):
    def register(pair):
        add_arguments, run = pair
        SUBCOMMANDS[name] = (help, add_arguments, run)
        return pair
    return register


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", help="write every row (and the environment) as JSON to PATH")
    p.add_argument("--quick", action="store_true", help="a smaller matrix (for smoke tests)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _verify_run(args: argparse.Namespace) -> int:
    from .verify import run_verify
    from .verify.report import JsonTargetError

    try:
        _, ok = run_verify(quick=args.quick, json_path=args.json, progress=not args.no_progress)
    except JsonTargetError as err:  # refused before any check ran
        raise SystemExit(f"dualkv verify: {err}") from None
    return 0 if ok else 1


subcommand("verify", "numerical-equivalence report on whatever hardware is present")((_verify_args, _verify_run))


def _load_plugins() -> None:
    """Import the modules that add the other subcommands (analysis, kernels, bench)."""
    from .analysis import cli as _analysis  # noqa: F401
    from .bench import cli as _bench  # noqa: F401
    from .cuda import cli as _cuda  # noqa: F401


def build_parser() -> argparse.ArgumentParser:
    _load_plugins()
    parser = argparse.ArgumentParser(prog="dualkv", description="exact shared-prompt attention for RL training")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_arguments, run) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args))


if __name__ == "__main__":
    sys.exit(main())
