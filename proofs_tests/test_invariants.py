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


def test_one_input_check_module():
    """Input validation lives in dualkv/_checks.py: the analysis numbers, the attention inputs of both backends and
    the log-prob head's inputs (dualkv/integration/verl keeps its veRL-specific checks)."""
    import dualkv._checks as checks
    from dualkv.analysis import pairs, tokens
    from dualkv.cuda import api
    from dualkv.integration import logprobs
    from dualkv.reference import attention

    modules = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("_checks.py") if "verl" not in p.parts)
    assert modules == ["_checks.py"], modules
    assert pairs.check_int is tokens.check_int is checks.check_int
    assert logprobs.check_head_inputs is checks.check_head_inputs
    assert attention.check_context_inputs is api.check_context_inputs is checks.check_context_inputs


@pytest.mark.parametrize("backend", ["reference", "cuda"])
def test_both_backends_refuse_bad_context_inputs_alike(backend):
    """The CUDA backend validates with the same checks before it looks at devices, so the errors match."""
    import torch

    from dualkv import reference
    from dualkv.cuda import api

    fn = reference.context_attention if backend == "reference" else api.context_attention
    x = torch.randn(5, 2, 8)
    with pytest.raises(ValueError, match="max_seqlen is required"):
        fn(x, x, x, cu_seqlens=torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match="k has 6 tokens but q has 5"):
        fn(x, torch.randn(6, 2, 8), x)
    with pytest.raises(ValueError, match="cu_seqlens\\[-1\\] = 4 but the packed tensors hold 5"):
        fn(x, x, x, cu_seqlens=torch.tensor([0, 4], dtype=torch.int32), max_seqlen=4)


def test_dead_code_is_gone():
    from dualkv import cuda, testing
    from dualkv.cuda import schedule

    assert not hasattr(cuda, "HAS_BACKWARD") and not hasattr(schedule, "segments_from_layout")
    assert not hasattr(testing, "random_layout")
