# make verify — the numerical-equivalence report on this machine's hardware
# make test   — the test suite
# Both create (or refresh) .venv/ in the repo root and install what they need there.
# On a machine whose python already holds torch (e.g. the GPU box), use SYSTEM=1: no venv, no installs.

VENV        := .venv
TORCH_SPEC  ?= torch==2.13.0
EXTRAS      ?= dev
STAMP       := $(VENV)/.dualkv-$(EXTRAS)
# veRL 0.9.1 (and what its workers/trainers import) for proofs_tests/test_verl_*.py and TRL 1.16 for
# proofs_tests/test_trl_*.py; `make test` only
VERL_STAMP  := $(VENV)/.dualkv-verl

ifeq ($(SYSTEM),1)
PY   := PYTHONPATH=$(CURDIR) python3
DEPS :=
TEST_DEPS :=
else
PY   := $(VENV)/bin/python
DEPS := $(STAMP)
TEST_DEPS := $(STAMP) $(VERL_STAMP)
endif

.PHONY: verify test test-gpu setup clean

verify: $(DEPS)
	$(PY) -m dualkv verify $(VERIFY_ARGS)

test: $(TEST_DEPS)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-gpu: $(DEPS)
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

setup: $(STAMP)

# torch is installed first with an exact pin: that wheel is a CPU build on this project's machines; a looser spec
# would pull a multi-GB CUDA build. Override TORCH_SPEC to use another one.
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(VENV)/bin/python -m pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

$(VERL_STAMP): $(STAMP) pyproject.toml
	$(VENV)/bin/python -m pip install -q -e ".[verl,trl]"
	touch $(VERL_STAMP)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
