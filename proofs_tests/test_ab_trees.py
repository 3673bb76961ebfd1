"""experiments/gpu/ab_trees.sh: each side of the A/B imports its own tree's package (session 27's first try imported one
tree twice), here with kernel_times.py, which on a machine without a GPU stops after naming the package it imported."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_each_side_imports_its_own_tree(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the two sides would run the benchmark (checked on the CPU)")
    other = tmp_path / "other"
    (other / "dualkv").mkdir(parents=True)
    (other / "dualkv" / "__init__.py").write_text('"""a stand-in package"""\n')
    env = dict(os.environ, OTHER=str(other), OTHER_NAME="stand-in", TOOL="kernel_times", RUNS="1",
               OUT=str(tmp_path / "out"), TAIL="3", PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "experiments/gpu/ab_trees.sh"), "--system", "dualkv_mma", "--shapes",
                           "8:8192"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    other_part, here_part = proc.stdout.split("== here1")
    assert f"package: {other}/dualkv/__init__.py" in other_part and "needs a CUDA GPU" in other_part
    assert f"package: {ROOT}/dualkv/__init__.py" in here_part and "needs a CUDA GPU" in here_part
    assert "exit 2" in other_part and "exit 2" in here_part
