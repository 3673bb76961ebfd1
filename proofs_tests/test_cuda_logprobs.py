"""GPU: the fused log-prob head's dW accumulation on CUDA (bf16 chunk products with a float32 result, cuBLAS via
``addmm(out_dtype=float32)``) is float32-exact per chunk, as on the CPU."""

import pytest
import torch

from dualkv.integration import logprobs as lpmod
from dualkv.testing import rel_err

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_weight_gradient_chunks_are_summed_in_float32_on_cuda(dtype):
    gen = torch.Generator().manual_seed(4)
    chunks = [(torch.randn(256, 512, generator=gen).to(dtype), torch.randn(256, 128, generator=gen).to(dtype))
              for _ in range(40)]
    ref = sum(g.double().t() @ h.double() for g, h in chunks)
    acc = torch.zeros(512, 128, device="cuda")
    for g, h in chunks:
        acc = lpmod._accumulate_weight_grad(acc, g.cuda(), h.cuda())
    assert acc.dtype == torch.float32 and rel_err(acc, ref) < 1e-5
    rounded = sum((g.cuda().t() @ h.cuda()).float() for g, h in chunks)   # the known-wrong bf16/fp16 products
    assert rel_err(rounded, ref) > 10 * rel_err(acc, ref)
