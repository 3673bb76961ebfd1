"""The README's GPU command, ``make test-gpu SYSTEM=1``, must collect on the GPU machine, whose python holds torch,
transformers, numpy, sympy, pytest, numba and cuda-core but not the packages below (/work/shared/notes/device.md).

Each check runs pytest's collection in a subprocess where those packages cannot be imported (``sys.modules[name] =
None``: ``import name`` raises ModuleNotFoundError and ``importlib.util.find_spec(name)`` returns None, as for a
package that is not installed, so transformers' availability probes agree) and compares the gpu-marked tests it
collects with an unrestricted collection: every one of them must still be there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Installed by the dev/verl/notebooks extras but absent on the GPU machine.
NOT_ON_GPU_IMAGE = ("nbformat", "nbclient", "jupyter_client", "jupyter_core", "ipykernel", "IPython", "matplotlib",
                    "verl", "ray", "datasets", "pandas", "pyarrow", "tensordict", "omegaconf", "hydra",
                    "transfer_queue", "flash_attn", "trl", "vllm", "peft", "accelerate", "uvicorn", "fastapi")

_COLLECT = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None
import pytest
sys.exit(pytest.main(["-q", "-m", "gpu", "--collect-only", "-p", "no:cacheprovider", *{paths!r}]))
"""


def _collect(blocked: tuple[str, ...], paths: tuple[str, ...] = ()) -> tuple[int, set[str], str]:
    """(exit status, gpu-marked test ids, output) of ``pytest -m gpu --collect-only [paths]`` run from the repository
    root (what ``make test-gpu SYSTEM=1`` runs) with ``blocked`` unimportable and no pytest plugins auto-loaded
    (the extras bring some, e.g. hydra's; the GPU machine has none)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run([sys.executable, "-c", _COLLECT.format(blocked=blocked, paths=paths)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)
    ids = {line for line in proc.stdout.splitlines() if "::" in line and not line.startswith(("ERROR", "SKIPPED"))}
    return proc.returncode, ids, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_gpu_tests_collect_without_the_packages_the_gpu_machine_lacks():
    rc_full, full, out_full = _collect(())
    assert rc_full == 0, out_full
    assert len(full) > 100, f"only {len(full)} gpu tests collected:\n{out_full}"
    rc, ids, out = _collect(NOT_ON_GPU_IMAGE)
    assert rc == 0, f"`make test-gpu` would stop at collection on the GPU machine:\n{out}"
    assert ids == full, f"gpu tests lost without the extras: {sorted(full - ids)[:10]}"


def test_the_blocker_really_blocks(tmp_path):
    """Known-wrong control: a test module importing a blocked package at module level (what test_notebooks.py did)
    must make the collection fail."""
    probe = tmp_path / "test_collection_probe.py"
    probe.write_text("import nbformat\n\nimport pytest\n\n\n@pytest.mark.gpu\ndef test_probe():\n    pass\n")
    rc, _, out = _collect(NOT_ON_GPU_IMAGE, (str(probe),))
    assert rc != 0 and "nbformat" in out, out
    rc, ids, out = _collect((), (str(probe),))
    assert rc == 0 and len(ids) == 1, out
