"""Invariants of the product code are exceptions with messages, not ``assert`` statements (``python -O`` strips
those): no ``assert`` is left in dualkv/ outside its tests' helpers, the tile-table invariant raises by name, and a
failed check still fails under ``python -O``."""

import ast
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import dualkv
from dualkv.cuda import configs

PACKAGE = Path(dualkv.__file__).parent


def test_no_assert_statements_in_the_package():
    found = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
             for path in PACKAGE.rglob("*.py") if "verl" not in path.parts
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Assert)]
    assert not found, found


def test_tile_table_invariant_is_an_exception():
    configs.check_tile_tables()
    bad = {128: replace(configs.SM90_DKDV_TILES[128], warps=4)}
    with pytest.raises(ValueError, match=r"SM90_DKDV_TILES\[128\] has 64 keys per CTA but DKDV_TILES\[128\] 128"):
        configs.check_tile_tables(sm90_dkdv=bad)
    with pytest.raises(ValueError, match=r"SM90_DQ_TILES\[64\]"):
        configs.check_tile_tables(sm90_dq={64: replace(configs.SM90_DQ_TILES[64], warps=4)})


def test_a_failed_check_fails_under_python_O():
    code = ("from dualkv.testing import assert_rows_pass\n"
            "from dualkv.verify.checks import Row\n"
            "assert_rows_pass([Row('c', 'cfg', 'out', 'cuda', 'bf16', 1.0, 0.1, 'max_abs', False)])\n")
    proc = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                          cwd=PACKAGE.parent)
    assert proc.returncode != 0 and "AssertionError: cfg bf16: out: 1.000e+00 > 1.000e-01" in proc.stderr
