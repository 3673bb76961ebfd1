"""Shared pytest setup: the ``gpu`` marker skips without CUDA; CPU tests never skip."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed(monkeypatch):
    torch.manual_seed(0)
    # the default backward mode is part of what the tests check: an exported setting must not change it
    monkeypatch.delenv("DUALKV_DETERMINISTIC", raising=False)


@pytest.fixture
def cuda_debug():
    """Outputs poisoned with NaN before every kernel launch; every launch synchronised and error-checked."""
    import dualkv
    from dualkv.cuda.runtime import debug

    assert dualkv.backend_name(torch.empty(0, device="cuda", dtype=torch.bfloat16)) == "cuda"
    with debug(poison=True, sync=True):
        yield


@pytest.fixture
def launched_specs(monkeypatch):
    """The KernelSpecs of every kernel the CUDA launchers load (dualkv.cuda.launch.get_kernel), in call order."""
    from dualkv.cuda import launch

    specs = []
    real = launch.get_kernel

    def record(spec, device):
        specs.append(spec)
        return real(spec, device)

    monkeypatch.setattr(launch, "get_kernel", record)
    return specs
