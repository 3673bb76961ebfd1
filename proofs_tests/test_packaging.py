"""Packaging: a wheel built from the repository carries everything the kernels need (every file of ``csrc``), installs
on its own and compiles kernels from the installed copy on a CPU; the CUDA extras each pin one CUDA major; only the
``verl`` extra caps transformers (at veRL's own pin).

``make test-latest`` runs this file again in its second environment (newest transformers, the cu12 extra; checked
by ``.ci/latest_env.py``), so the installed wheel's kernels are compiled with NVRTC 12 there and NVRTC 13 in the
main one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
#: The CUDA components whose major must match torch's (and the driver's).
CUDA_PARTS = ("cuda-bindings", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime")

_COMPILE = """
import sys, torch
import dualkv
from dualkv.cuda.build import compile_spec
from dualkv.cuda.configs import dkdv_spec, fwd_spec
assert dualkv.__file__.startswith(sys.argv[1]), dualkv.__file__
for spec in (fwd_spec(128, torch.bfloat16, 4, False, "sm_90"), dkdv_spec(64, torch.float16, True, "sm_80")):
    built = compile_spec(spec, use_cache=False)
    assert len(built.cubin) > 1000, spec
    print("compiled", spec.kernel, spec.arch, len(built.cubin))
"""


def _requirements(extra: str) -> dict[str, Requirement]:
    return {Requirement(r).name: Requirement(r) for r in EXTRAS[extra]}


def _base(name: str) -> str:
    """``nvidia-cuda-nvrtc-cu12`` -> ``nvidia-cuda-nvrtc``."""
    return name[:-5] if name.endswith(("-cu12", "-cu13")) else name


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the package sources (pip's isolated build, as a user's ``pip install``)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "dualkv", src / "dualkv", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (path,) = out.glob("dualkv-*.whl")
    return path


def test_wheel_carries_the_kernel_sources_and_entry_points(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {f"dualkv/cuda/csrc/{p.name}" for p in (ROOT / "dualkv" / "cuda" / "csrc").iterdir() if p.is_file()}
    assert sources and sources <= names, sorted(sources - names)
    configs = {f"dualkv/analysis/configs/{p.name}" for p in (ROOT / "dualkv" / "analysis" / "configs").glob("*.json")}
    assert configs <= names
    assert not any(n.startswith(("proofs_tests/", "experiments/")) for n in names)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "dualkv = dualkv.cli:main" in text and "dualkv = dualkv.integration.verl.plugin" in text


def test_installed_wheel_compiles_kernels_on_the_cpu(wheel, tmp_path):
    """Installed on its own (no checkout on the path), the package finds its CUDA sources and NVRTC builds a Hopper
    wgmma forward and an sm_80 dK/dV kernel (with its dQ-atomic variant's headers) from them."""
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(site), "DUALKV_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", _COMPILE, str(site)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("compiled") == 2


@pytest.mark.parametrize("extra, major", [("cu12", 12), ("cu13", 13)])
def test_cuda_extras_pin_one_major(extra, major):
    reqs = _requirements(extra)
    assert {_base(n) for n in reqs} == set(CUDA_PARTS)
    for name, req in reqs.items():
        assert f"{major}.99" in req.specifier and f"{major + 1}.0" not in req.specifier, (name, str(req))
        assert not name.endswith("-cu12") or major == 12
    base = {Requirement(r).name for r in PYPROJECT["project"]["dependencies"]}
    assert not {_base(n) for n in base} & set(CUDA_PARTS), "a CUDA component in the base dependencies forces a major"


def test_only_the_verl_extra_caps_transformers():
    for extra in ("hf", "dev"):
        spec = _requirements(extra)["transformers"].specifier
        assert "99.0" in spec, f"{extra} caps transformers: {spec}"
    capped = _requirements("verl")["transformers"].specifier
    assert "5.10.99" in capped and "5.11.0" not in capped
    try:
        verl_pin = [Requirement(r) for r in metadata.requires("verl") or [] if r.startswith("transformers")
                    and "extra" not in r]
    except metadata.PackageNotFoundError:
        return
    assert verl_pin and verl_pin[0].specifier == capped, "the verl extra's cap is not veRL's own pin"
