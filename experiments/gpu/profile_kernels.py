"""Run each dualkv kernel once at a mid-size shape, for `ncu` to profile:

ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis -k regex:dualkv_ python3 experiments/gpu/profile_kernels.py
"""

import sys

import torch

sys.path.insert(0, ".")
import dualkv  # noqa: E402
from dualkv import GroupLayout  # noqa: E402

layout = GroupLayout.single(8192, [2048] * 8)
gen = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(layout.total_tokens, 32, 128, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
k = torch.randn(layout.total_tokens, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
v = torch.randn(layout.total_tokens, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
out = dualkv.shared_prefix_attention(q, k, v, layout)
out.backward(torch.randn_like(out))
torch.cuda.synchronize()
print("done")
