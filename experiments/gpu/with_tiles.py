"""Run a module (pytest, ``dualkv bench``) with some kernel tiles replaced, for A/B timing of a tile before it becomes
a default; the replacement lives only in this process.

    python experiments/gpu/with_tiles.py SM90_WS_FWD_TILES:128:block_n=192,stages=2 [more ...] -- -m pytest -q ...
    python experiments/gpu/with_tiles.py SM90_WS_FWD_TILES:192:stages=2 -- -m dualkv bench kernel --head-dim 192 ...

Each replacement is ``TABLE:HEAD_DIM:field=value,...`` over a tile table of :mod:`dualkv.cuda.configs`.
"""

from __future__ import annotations

import dataclasses
import runpy
import sys
from pathlib import Path


def apply(item: str) -> None:
    """Replace fields of one tile: ``TABLE:HEAD_DIM:field=value,...``."""
    from dualkv.cuda import configs

    table_name, head_dim, fields = item.split(":")
    table = getattr(configs, table_name)
    values = {k: int(v) if v.lstrip("-").isdigit() else v == "True" for k, v in
              (pair.split("=") for pair in fields.split(","))}
    table[int(head_dim)] = dataclasses.replace(table[int(head_dim)], **values)
    print(f"with_tiles: {table_name}[{head_dim}] = {table[int(head_dim)]}", flush=True)


def main() -> None:
    split = sys.argv.index("--")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    for item in sys.argv[1:split]:
        apply(item)
    rest = sys.argv[split + 1:]
    if not rest or rest[0] != "-m":
        raise SystemExit("usage: with_tiles.py TABLE:DIM:field=value ... -- -m MODULE [ARGS]")
    sys.argv = [rest[1]] + rest[2:]
    runpy.run_module(rest[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
