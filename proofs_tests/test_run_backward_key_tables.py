"""Which key-tile table each backward launcher gets (CPU, no kernel runs): ``run_backward`` hands the dK/dV
kernel the heaviest-first table (``dkdv_key_tiles_t``) on the separate-dQ and atomic-dQ paths, and the
warp-specialised backward the launch order it needs. The launchers are recorded instead of run, so a swap or a
dropped argument on these GPU-only paths shows up here before the next GPU run."""

from __future__ import annotations

import pytest
import torch

from dualkv import GroupLayout
from dualkv.cuda import launch

PLAN_ARGS = dict(head_dim=128, group_size=2, window_left=-1, device=torch.device("cpu"), ctx_shared=True,
                 fwd_kernel="fwd")


class _Recorder:
    """Stands in for a loaded kernel: records each launch's kernel (":atomic" added for the atomic-dQ dK/dV build),
    grid and the data pointers among its arguments."""

    def __init__(self, spec, log):
        self.spec, self.log = spec, log

    def launch(self, grid, args):
        name = self.spec.kernel + (":atomic" if getattr(self.spec, "dq_atomic", False) else "")
        self.log.append((name, grid, [a for a in args if isinstance(a, int)]))


@pytest.fixture
def launches(monkeypatch):
    log: list = []
    monkeypatch.setattr(launch, "device_index", lambda where: 0)
    monkeypatch.setattr(launch, "arch_of", lambda index: "sm_90")
    monkeypatch.setattr(launch, "get_kernel", lambda spec, index: _Recorder(spec, log))
    monkeypatch.setattr(launch, "run_prep", lambda dout, out, lse, d_lse=None: (lse, lse))
    # (…, segments, key_tiles_t 14, group, scale, tree, ws_first_tiles 18)
    monkeypatch.setattr(launch, "_run_backward_ws", lambda *a: log.append(("ws", None, [a[14].data_ptr(), a[18]])))
    return log


def _backward(plan, ws: bool, deterministic: bool, monkeypatch, **kwargs):
    monkeypatch.setattr(launch, "ws_backward_for", lambda *a, **k: ws)
    t = int(plan.segments[:, 1].sum())
    q, dout, out = (torch.randn(t, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    k = torch.randn(t, 2, 128, dtype=torch.bfloat16)
    lse = torch.zeros(4, t)
    launch.run_backward(dout, q, k, k, k, k, out, lse, plan.segments, plan.dq_tiles, plan.key_tiles, plan.dq_pack,
                        True, scale=0.1, window_left=-1, deterministic=deterministic,
                        dkdv_key_tiles_t=plan.dkdv_key_tiles, **kwargs)


@pytest.mark.parametrize("mode", ["split", "atomic"])
@pytest.mark.parametrize("deterministic", [True, False])
def test_dkdv_kernel_gets_the_heaviest_first_table(deterministic, mode, launches, monkeypatch):
    """The dK/dV kernel runs the heaviest-first table; the separate dQ kernel runs unless mma_backward("atomic") and
    deterministic=False put dQ into the dK/dV kernel, whose fp32 accumulator one cast kernel then reads (the split
    backward serves deterministic=False by default)."""
    from dualkv.cuda.configs import mma_backward

    plan = launch.make_plan(GroupLayout.from_lengths([300], [[129, 5, 64]]).segment_table, **PLAN_ARGS)
    assert not torch.equal(plan.key_tiles, plan.dkdv_key_tiles)   # else the check below could not tell them apart
    with mma_backward(mode):
        _backward(plan, ws=False, deterministic=deterministic, monkeypatch=monkeypatch)
    dkdv = [entry for entry in launches if "dkdv" in entry[0]]
    assert len(dkdv) == 1
    _, grid, pointers = dkdv[0]
    assert grid == (plan.dkdv_key_tiles.shape[0], 2, 1)
    assert plan.dkdv_key_tiles.data_ptr() in pointers and plan.key_tiles.data_ptr() not in pointers
    atomic = mode == "atomic" and not deterministic
    kernels = [e[0] for e in launches]
    assert any(k in ("bwd_dq", "bwd_dq_sm90") for k in kernels) == (not atomic)  # atomic: dQ in the dK/dV kernel,
    assert kernels.count("bwd_dq_frag_cast") == int(atomic)        # its fragment-order accumulator cast once
    assert any("dkdv" in e[0] and "atomic" in e[0] for e in launches) == atomic


def test_warp_specialised_backward_gets_the_launch_order(launches, monkeypatch):
    """The launch order and the plan's head-major split (None when the caller gives none: the whole table)."""
    monkeypatch.setattr(launch, "TWO_LEVEL_SHARED_FIRST", True)
    plan = launch.make_plan(GroupLayout.from_lengths([300], [[129, 5, 64]]).segment_table, **PLAN_ARGS)
    assert 0 < plan.ws_first_tiles < plan.key_tiles.shape[0]
    _backward(plan, ws=True, deterministic=True, monkeypatch=monkeypatch)
    _backward(plan, ws=True, deterministic=True, monkeypatch=monkeypatch, ws_first_tiles=plan.ws_first_tiles)
    assert launches == [("ws", None, [plan.key_tiles.data_ptr(), None]),
                        ("ws", None, [plan.key_tiles.data_ptr(), plan.ws_first_tiles])]
