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


def test_switched_systems_hold_their_kernels_through_the_backward(monkeypatch):
    """The backward picks its kernels when it runs: dualkv_mma(_ordered, _atomic) / dualkv_v1 / dualkv_hybrid keep
    their switches in force for it too, and restore the process's choice after each call. dualkv_hybrid chooses its
    path in process (configs.path_override), over a $DUALKV_PATH that says otherwise, and never writes os.environ."""
    import os

    from dualkv.cuda.configs import current_kernel_family, current_mma_backward, current_path

    monkeypatch.setenv("DUALKV_PATH", "fused")
    environ = dict(os.environ)
    seen = []

    def state(what):
        assert dict(os.environ) == environ, what
        seen.append((what, current_kernel_family(), current_mma_backward(), current_path()))

    monkeypatch.setattr(baselines.DualKV, "forward", lambda self, train=False: state("fwd"))
    monkeypatch.setattr(baselines._Autograd, "backward", lambda self, dout: state("bwd"))
    before = (current_kernel_family(), current_mma_backward(), current_path())
    assert before[2] == "fused"
    layout = GroupLayout.from_lengths([9], [[3, 5]])
    q = torch.randn(layout.total_tokens, 2, 16)
    for name, expected in (("dualkv_mma_ordered", ("mma", "ordered", "fused")),
                           ("dualkv_mma", ("mma", before[1], "fused")),
                           ("dualkv_mma_split", ("mma", "split", "fused")),
                           ("dualkv_mma_atomic", ("mma", "atomic", "fused")),
                           ("dualkv_v1", ("wgmma_v1", before[1], "fused")),
                           ("dualkv_hybrid", (before[0], before[1], "hybrid"))):
        seen.clear()
        system = baselines.SYSTEMS[name](q, q[:, :1], q[:, :1], layout)
        system.forward(True)
        system.backward(None)
        assert seen == [("fwd", *expected), ("bwd", *expected)], name
        assert (current_kernel_family(), current_mma_backward(), current_path()) == before
        assert dict(os.environ) == environ
