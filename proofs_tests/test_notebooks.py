"""Execute the analysis notebooks so they cannot rot: each runs once with no result files (predictions only)
and once with the synthetic result files of proofs_tests/data (the overlay path).

The kernel is this interpreter (a kernelspec written to a temporary directory), so the test works offline in the
project's venv whatever kernels the machine has registered. The Jupyter packages are imported inside the tests (the
``notebooks``/``dev`` extras have them; the GPU machine does not, and ``make test-gpu`` must still collect).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DATA = Path(__file__).resolve().parent / "data"


def test_both_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} >= {"rho_and_speedup.ipynb", "memory_scaling.ipynb"}


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory):
    pytest.importorskip("jupyter_client")
    from jupyter_client.kernelspec import KernelSpecManager

    root = tmp_path_factory.mktemp("kernels")
    spec = root / "dualkv-test"
    spec.mkdir()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "dualkv test kernel", "language": "python"}))
    return KernelSpecManager(kernel_dirs=[str(root)])


@pytest.mark.parametrize("results", ["none", "synthetic"])
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, results, kernel_specs, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    results_dir = DATA if results == "synthetic" else tmp_path
    monkeypatch.setenv("DUALKV_RESULTS_DIR", str(results_dir))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name="dualkv-test", kernel_spec_manager=kernel_specs)
    client = NotebookClient(nb, km=km, timeout=120, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 1, f"{path.name} displayed no figure"
    assert "Traceback" not in text
    if results == "synthetic":
        assert str(DATA) in text, f"{path.name} did not read the synthetic result files"
        assert "no result files" not in text
    else:
        assert str(results_dir) in text
