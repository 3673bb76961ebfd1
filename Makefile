# make verify — the numerical-equivalence report on this machine's hardware
# make test   — the test suite: test-main (everything but TRL, veRL's pinned transformers), test-latest (the HF path
#               with the newest transformers and the CUDA-12 NVRTC, in a second environment) and test-trl (TRL's
#               tests in a third: veRL 0.9.1 imports trl.experimental.ppo, which TRL 1.16 no longer has, as soon
#               as TRL is installed beside it)
# They create (or refresh) .venv/ (.venv-latest/, .venv-trl/) in the repo root and install what they need there.
# On a machine whose python already holds torch (e.g. the GPU box), use SYSTEM=1: no venv, no installs.

VENV        := .venv
TORCH_SPEC  ?= torch==2.13.0
EXTRAS      ?= dev
STAMP       := $(VENV)/.dualkv-$(EXTRAS)
# veRL 0.9.1 (and what its workers/trainers import) for proofs_tests/test_verl_*.py; `make test` only
VERL_STAMP  := $(VENV)/.dualkv-verl
# The third environment: TRL 1.16 without veRL, transformers in the range its parity tests were checked with.
TRL_VENV    := .venv-trl
TRL_STAMP   := $(TRL_VENV)/.dualkv-trl
TRL_TESTS   := proofs_tests/test_trl_rows.py proofs_tests/test_trl_parity.py proofs_tests/test_trl_experiment.py
# The second environment: no veRL, so transformers is the newest release (only the verl extra caps it), and the
# cu12 extra (NVRTC 12). Runs the tests of the transformers path and the packaging test.
LATEST_VENV  := .venv-latest
LATEST_STAMP := $(LATEST_VENV)/.dualkv-latest
LATEST_TESTS := proofs_tests/test_hf_errors.py proofs_tests/test_hf_logprob_head.py proofs_tests/test_hf_models.py \
                proofs_tests/test_model_equivalence.py proofs_tests/test_training_step_invariance.py \
                proofs_tests/test_logprobs.py proofs_tests/test_mutants.py proofs_tests/test_verify_cli.py \
                proofs_tests/test_packaging.py
# The CUDA extra (cu12/cu13: NVRTC, runtime headers, cuda-bindings) of the CUDA major the installed torch was
# built for; a CPU torch gets cu13.
CUDA_EXTRA   = $$($(1)/bin/python -c "import torch; v = torch.version.cuda; print('cu' + v.split('.')[0] if v else 'cu13')")

ifeq ($(SYSTEM),1)
PY   := PYTHONPATH=$(CURDIR) python3
DEPS :=
TEST_DEPS :=
else
PY   := $(VENV)/bin/python
DEPS := $(STAMP)
TEST_DEPS := $(STAMP) $(VERL_STAMP)
endif

.PHONY: verify test test-main test-latest test-trl test-gpu setup clean

verify: $(DEPS)
	$(PY) -m dualkv verify $(VERIFY_ARGS)

ifeq ($(SYSTEM),1)
test: test-main
else
test: test-main test-latest test-trl
endif

test-main: $(TEST_DEPS)
	$(PY) -m pytest -q $(PYTEST_ARGS) $(addprefix --ignore=,$(TRL_TESTS))

test-trl: $(TRL_STAMP)
	$(TRL_VENV)/bin/python -m pytest -q -p no:cacheprovider $(TRL_TESTS)

test-latest: $(LATEST_STAMP)
	$(LATEST_VENV)/bin/python .ci/latest_env.py
	$(LATEST_VENV)/bin/python -m pytest -q -p no:cacheprovider $(LATEST_TESTS)

test-gpu: $(DEPS)
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

setup: $(STAMP)

# torch is installed first with an exact pin: that wheel is a CPU build on this project's machines; a looser spec
# would pull a multi-GB CUDA build. Override TORCH_SPEC to use another one.
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(VENV)/bin/python -m pip install -q -e ".[$(EXTRAS),$(call CUDA_EXTRA,$(VENV))]"
	touch $(STAMP)

$(VERL_STAMP): $(STAMP) pyproject.toml
	$(VENV)/bin/python -m pip install -q -e ".[verl]"
	touch $(VERL_STAMP)

$(TRL_STAMP): pyproject.toml
	test -x $(TRL_VENV)/bin/python || python3 -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/python -c "import torch" 2>/dev/null || $(TRL_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(TRL_VENV)/bin/python -m pip install -q -e ".[trl,$(call CUDA_EXTRA,$(TRL_VENV))]" "pytest>=8" \
	    "transformers>=5.5.3,<5.11,!=5.6.0"
	touch $(TRL_STAMP)

$(LATEST_STAMP): pyproject.toml
	test -x $(LATEST_VENV)/bin/python || python3 -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -c "import torch" 2>/dev/null || $(LATEST_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(LATEST_VENV)/bin/python -m pip install -q -e ".[hf,cu12]" "pytest>=8"
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade "transformers>=5.5.3,!=5.6.0"
	touch $(LATEST_STAMP)

clean:
	rm -rf $(VENV) $(LATEST_VENV) $(TRL_VENV) build *.egg-info .pytest_cache
