"""One benchmark system registry (dualkv.bench.registry): every name implemented at the levels it claims, one FA2
N-copy implementation for both levels, and the old ``flex_packed`` name read as ``flex``."""

import pytest
import torch

from dualkv import GroupLayout
from dualkv.bench import baselines, registry, systems


def test_every_system_is_implemented_where_the_registry_says():
    assert set(baselines.SYSTEMS) == set(registry.kernel_systems())
    assert set(systems.SYSTEMS) == set(registry.layer_systems()) == set(systems.ATTN_NAMES)
    both = set(registry.kernel_systems()) & set(registry.layer_systems())
    assert {"dualkv", "fa2_ncopy", "flex"} <= both
    assert registry.canonical("flex_packed") == "flex" and registry.canonical("dualkv") == "dualkv"
    with pytest.raises(ValueError, match="unknown layer-level system 'cascade'"):
        registry.check_system("cascade", "layer")
    assert registry.check_system("cascade", "kernel") == "cascade"


def test_kernel_and_layer_fa2_ncopy_share_one_implementation(monkeypatch):
    calls = []
    real = systems.varlen_causal

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(systems, "varlen_causal", spy)
    layout = GroupLayout.from_lengths([9], [[3, 5]])
    q = torch.randn(layout.total_tokens, 2, 16, dtype=torch.float64)
    k, v = (torch.randn(layout.total_tokens, 1, 16, dtype=torch.float64) for _ in range(2))
    system = baselines.SYSTEMS["fa2_ncopy"](q, k, v, layout)
    system.prepare()
    out = system.forward(True)
    grads = system.packed_grads(system.backward(system.upstream(torch.randn_like(q))))
    assert calls == [(layout.tokens_std, 2, 16)] and out.shape[0] == layout.tokens_std
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
