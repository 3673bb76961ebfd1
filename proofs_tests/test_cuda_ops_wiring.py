"""The custom ops' autograd wiring on the CPU: ``dualkv::fwd`` saves what ``dualkv::bwd`` needs and its backward
hands every table through in the right slot (both key-tile orders included), with the gradient of each of the five
tensor inputs in its own place. The launchers are replaced by stand-ins registered for the CPU (the real ones need a
GPU), so this checks the plumbing the GPU tests rely on, not the kernels."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dualkv.cuda import ops

SEEN: dict = {}


def _cpu_fwd(q, k_ctx, v_ctx, k_own, v_own, segments, fwd_tiles, dq_tiles, key_tiles, dkdv_key_tiles, split_key_tiles,
             fwd_kernel, fwd_pack, dq_pack, ws_first_tiles, split_parts, ctx_shared, scale, window_left, causal,
             deterministic, tree):
    SEEN["fwd"] = {"key_tiles": key_tiles, "dkdv_key_tiles": dkdv_key_tiles, "fwd_kernel": fwd_kernel}
    return q * scale, torch.zeros(q.shape[1], q.shape[0], dtype=torch.float32)


def _cpu_bwd(dout, d_lse, q, k_ctx, v_ctx, k_own, v_own, out, lse, segments, dq_tiles, key_tiles, dkdv_key_tiles,
             split_key_tiles, dq_pack, ws_first_tiles, split_parts, ctx_shared, scale, window_left, causal, deterministic,
             tree):
    SEEN["bwd"] = {"key_tiles": key_tiles, "dkdv_key_tiles": dkdv_key_tiles, "split_key_tiles": split_key_tiles,
                   "dq_tiles": dq_tiles, "segments": segments,
                   "meta": (dq_pack, ws_first_tiles, split_parts, ctx_shared, scale, window_left, causal, deterministic,
                            tree)}
    ctx_k = k_own.new_empty((0,)) if ctx_shared else torch.full_like(k_ctx, 3.0)
    ctx_v = v_own.new_empty((0,)) if ctx_shared else torch.full_like(v_ctx, 4.0)
    return dout * scale, ctx_k, ctx_v, torch.full_like(k_own, 5.0), torch.full_like(v_own, 6.0)


@contextlib.contextmanager
def _cpu_stand_ins():
    """The stand-ins as CPU kernels of the ops for the duration only (a ``torch.library`` fragment, destroyed on
    exit: ``CustomOpDef.register_kernel`` could not be undone and would leave them in every later test of the
    process)."""
    lib = torch.library.Library("dualkv", "IMPL")
    try:
        lib.impl("fwd", _cpu_fwd, "CPU")
        lib.impl("bwd", _cpu_bwd, "CPU")
        yield
    finally:
        lib._destroy()


@pytest.fixture
def _cpu_kernels():
    SEEN.clear()
    with _cpu_stand_ins():
        yield


def test_stand_ins_leave_no_cpu_kernel_behind():
    """After the fixture the ops have no CPU kernel again (the real ones exist for CUDA only)."""
    q = torch.randn(9, 4, 8)
    t = _tables()
    with _cpu_stand_ins():
        pass
    with pytest.raises(NotImplementedError, match="CPU"):
        torch.ops.dualkv.fwd(q, q[:, :2], q[:, :2], q[:, :2], q[:, :2], t["segments"], t["fwd_tiles"],
                             t["dq_tiles"], t["key_tiles"], t["dkdv_key_tiles"], None, "fwd", 2, 2, 3, 1, True,
                             0.5, -1, True, True, False)


def _tables():
    return {name: torch.arange(n * 4, dtype=torch.int32).reshape(n, 4) + i * 100
            for i, (name, n) in enumerate([("segments", 3), ("fwd_tiles", 5), ("dq_tiles", 6), ("key_tiles", 7),
                                           ("dkdv_key_tiles", 7), ("split_key_tiles", 9)])}


@pytest.mark.usefixtures("_cpu_kernels")
@pytest.mark.parametrize("ctx_shared", [True, False])
@pytest.mark.parametrize("split", [True, False])
def test_backward_receives_both_key_tile_orders_and_returns_five_gradients(ctx_shared, split):
    """Also the warp-specialised backward's split table (split_key_tiles, split_parts) or its absence (None, 1 part)."""
    q, k_ctx, v_ctx, k_own, v_own = (torch.randn(9, h, 8, requires_grad=True) for h in (4, 2, 2, 2, 2))
    t = _tables()
    split_key_tiles, split_parts = (t["split_key_tiles"], 2) if split else (None, 1)
    out, lse = ops.fwd(q, k_ctx, v_ctx, k_own, v_own, t["segments"], t["fwd_tiles"], t["dq_tiles"], t["key_tiles"],
                       t["dkdv_key_tiles"], split_key_tiles, "fwd", 2, 2, 3, split_parts, ctx_shared, 0.5, -1, True, True,
                       False)
    dout = torch.randn_like(out)
    out.backward(dout)
    seen = SEEN["bwd"]
    for name in ("key_tiles", "dkdv_key_tiles", "dq_tiles", "segments"):
        assert torch.equal(seen[name], t[name]), name
    assert torch.equal(seen["split_key_tiles"], t["split_key_tiles"]) if split else seen["split_key_tiles"] is None
    # ws_first_tiles 3 and the parts handed through
    assert seen["meta"] == (2, 3, split_parts, ctx_shared, 0.5, -1, True, True, False)
    assert torch.equal(q.grad, dout * 0.5)
    assert torch.equal(k_own.grad, torch.full_like(k_own, 5.0)) and torch.equal(v_own.grad, torch.full_like(v_own, 6.0))
    if ctx_shared:   # the context rows are own rows: their gradient arrives through the own slots only
        assert k_ctx.grad is None and v_ctx.grad is None
    else:
        assert torch.equal(k_ctx.grad, torch.full_like(k_ctx, 3.0)) and torch.equal(v_ctx.grad, torch.full_like(v_ctx, 4.0))


@pytest.mark.usefixtures("_cpu_kernels")
def test_swapped_key_tile_orders_are_seen():
    """Known-wrong wiring: had the backward received the tables in each other's slot, the check above would fail."""
    q, k, v = (torch.randn(9, h, 8, requires_grad=True) for h in (4, 2, 2))
    t = _tables()
    out, _ = ops.fwd(q, k, v, k, v, t["segments"], t["fwd_tiles"], t["dq_tiles"], t["dkdv_key_tiles"], t["key_tiles"],
                     None, "fwd", 2, 2, 3, 1, True, 0.5, -1, True, True, False)
    out.sum().backward()
    assert torch.equal(SEEN["bwd"]["key_tiles"], t["dkdv_key_tiles"])
    assert torch.equal(SEEN["bwd"]["dkdv_key_tiles"], t["key_tiles"])
