"""GPU, two devices: the kernels run on their tensors' device whatever the current device is, on that device's
current stream, and leave PyTorch's current device where the caller put it (forward and backward, any thread)."""

import threading

import pytest
import torch

import dualkv
from dualkv import GroupLayout

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

LAYOUT = GroupLayout.from_lengths([300, 65], [[129, 1, 64], [200]])


def _inputs(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(LAYOUT.total_tokens, h, 128, generator=g).to(device, torch.bfloat16)  # noqa: E731
    return [t.requires_grad_() for t in (make(8), make(2), make(2))]


def _run(q, k, v):
    out = dualkv.shared_prefix_attention(q, k, v, LAYOUT)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    return [out.detach(), *grads]


@pytest.mark.parametrize("current,target", [(0, 1), (1, 0)])
def test_tensors_on_the_other_gpu(current, target):
    torch.cuda.set_device(target)
    expected = _run(*_inputs(f"cuda:{target}"))   # the same call with the tensors' device current
    torch.cuda.synchronize(target)
    torch.cuda.set_device(current)
    got = _run(*_inputs(f"cuda:{target}"))
    assert torch.cuda.current_device() == current
    torch.cuda.synchronize(target)
    for a, b in zip(got, expected):
        assert a.device == torch.device("cuda", target)
        assert torch.equal(a, b)                  # deterministic kernels: bitwise the same


def test_both_gpus_against_the_reference():
    torch.cuda.set_device(0)
    for device in ("cuda:0", "cuda:1"):
        q, k, v = _inputs(device, seed=1)
        out = dualkv.shared_prefix_attention(q, k, v, LAYOUT)
        ref = dualkv.reference.shared_prefix_attention(q.double(), k.double(), v.double(), LAYOUT)
        assert (out.double() - ref).abs().max().item() < 3e-2
        assert torch.cuda.current_device() == 0


def test_the_target_devices_current_stream_is_used():
    """On a side stream of cuda:1 (current device 0), the launch is ordered after work queued on that stream."""
    torch.cuda.set_device(0)
    q, k, v = (t.detach() for t in _inputs("cuda:1", seed=2))
    side = torch.cuda.Stream(device=1)
    expected = dualkv.shared_prefix_attention(q, k, v, LAYOUT)
    torch.cuda.synchronize(1)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)             # keeps the side stream busy: a launch on another stream races
        q2 = q * 1.0
        out = dualkv.shared_prefix_attention(q2, k, v, LAYOUT)
    side.synchronize()
    assert torch.cuda.current_device() == 0
    assert torch.equal(out, expected)


def test_a_second_thread_on_the_second_gpu():
    torch.cuda.set_device(0)
    expected = _run(*_inputs("cuda:1", seed=3))
    result, error = {}, []

    def worker():
        try:
            result["grads"] = _run(*_inputs("cuda:1", seed=3))
            result["current"] = torch.cuda.current_device()
            torch.cuda.synchronize(1)
        except Exception as exc:  # surfaced below
            error.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert not error, error
    assert result["current"] == 0 and torch.cuda.current_device() == 0
    for a, b in zip(result["grads"], expected):
        assert torch.equal(a, b)
