"""Check that `make test-latest`'s environment is what it is for: a transformers newer than veRL's cap (the verl
extra's pin), so the HF tests see a release the main environment cannot have, and NVRTC 12 (the cu12 extra)."""

import sys
import tomllib
from pathlib import Path

import transformers
from cuda.bindings import nvrtc
from packaging.requirements import Requirement

extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
    "optional-dependencies"]
cap = next(Requirement(r) for r in extras["verl"] if Requirement(r).name == "transformers").specifier
_, major, minor = nvrtc.nvrtcVersion()
print(f"latest environment: transformers {transformers.__version__} (veRL's cap {cap}), NVRTC {major}.{minor}")
if transformers.__version__ in cap:
    sys.exit(f"transformers {transformers.__version__} is within veRL's cap {cap}: the second run would test "
             "nothing new")
if major != 12:
    sys.exit(f"NVRTC {major}.{minor}: the second environment should compile with the cu12 extra's NVRTC 12")
