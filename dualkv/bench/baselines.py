"""The attention systems the kernel benchmark compares, each run from the same packed (T, heads, d) activations.

* ``dualkv``      — :func:`dualkv.shared_prefix_attention` (one fused launch; CUDA kernels on a GPU).
* ``fa2_ncopy``   — PyTorch's vendored FlashAttention-2 (``aten._flash_attention_forward``) on the N-copy layout:
                    every prompt copied N times, causal varlen attention over [P; R_i] rows.
* ``cascade``     — three stock FA2 calls (prompt causal; all response queries x prompt keys; responses causal per
                    sequence) merged by log-sum-exp. Exact, no custom kernel.
* ``flex``        — ``torch.compile(flex_attention)`` over the P+ΣR layout with a shared-prefix BlockMask.

Each system exposes ``forward() -> out`` on packed-order outputs, so all are timed on the same call boundary.
"""

from __future__ import annotations

import math

import torch

from ..layout import GroupLayout


class System:
    name = "system"

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: GroupLayout):
        self.q, self.k, self.v, self.layout = q, k, v, layout
        self.scale = 1.0 / math.sqrt(q.shape[-1])

    def prepare(self) -> None:
        """One-time work outside the timed region (mask building, compilation warm-up)."""

    def forward(self) -> torch.Tensor:
        raise NotImplementedError

    def to_packed(self, out: torch.Tensor) -> torch.Tensor:
        """The system's output in packed (T, H, d) order."""
        return out


class DualKV(System):
    name = "dualkv"

    def forward(self):
        import dualkv

        return dualkv.shared_prefix_attention(self.q, self.k, self.v, self.layout)


def _fa2(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
    out, lse, *_ = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False,
                                                           scale=scale)
    return out, lse


class FA2NCopy(System):
    """N-copy inputs are built inside the timed call: in the N-copy pipeline they are the activations themselves,
    so their memory counts; their copy time is excluded by building them in :meth:`prepare`."""

    name = "fa2_ncopy"

    def prepare(self):
        index = torch.from_numpy(self.layout.copy_token_index).to(self.q.device)
        self.q_std, self.k_std, self.v_std = (t[index].contiguous() for t in (self.q, self.k, self.v))
        cu = self.layout.copy_cu_seqlens
        self.cu = torch.from_numpy(cu).to(device=self.q.device, dtype=torch.int32)
        self.max_len = int((cu[1:] - cu[:-1]).max())

    def forward(self):
        out, _ = _fa2(self.q_std, self.k_std, self.v_std, self.cu, self.cu, self.max_len, self.max_len, True,
                      self.scale)
        return out

    def to_packed(self, out):
        return out[torch.from_numpy(self.layout.first_copy_index).to(out.device)]


class Cascade(System):
    name = "cascade"

    def prepare(self):
        dev = self.q.device
        self.parts = []
        for g in range(self.layout.num_groups):
            p0, p1 = self.layout.prompt_range(g)
            r0, r1 = self.layout.responses_range(g)
            cu_r = torch.tensor(self.layout.response_cu_seqlens(g), dtype=torch.int32, device=dev)
            self.parts.append((p0, p1, r0, r1, cu_r, max(self.layout.response_lens[g])))

    def forward(self):
        q, k, v, scale = self.q, self.k, self.v, self.scale
        out = torch.empty_like(q)
        dev = q.device
        for p0, p1, r0, r1, cu_r, max_r in self.parts:
            p, n_r = p1 - p0, r1 - r0
            cu_p = torch.tensor([0, p], dtype=torch.int32, device=dev)
            cu_all = torch.tensor([0, n_r], dtype=torch.int32, device=dev)
            out[p0:p1] = _fa2(q[p0:p1], k[p0:p1], v[p0:p1], cu_p, cu_p, p, p, True, scale)[0]
            o_ctx, l_ctx = _fa2(q[r0:r1], k[p0:p1], v[p0:p1], cu_all, cu_p, n_r, p, False, scale)
            o_own, l_own = _fa2(q[r0:r1], k[r0:r1], v[r0:r1], cu_r, cu_r, max_r, max_r, True, scale)
            out[r0:r1] = merge_by_lse(o_ctx, l_ctx, o_own, l_own)
        return out


def merge_by_lse(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    """Exact merge of two attentions over disjoint key sets: o (T, H, d), l (H, T) natural-log LSE."""
    l1, l2 = l1.float(), l2.float()
    m = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)
    w1, w2 = (w1 / (w1 + w2)).t()[..., None], (w2 / (w1 + w2)).t()[..., None]
    return (o1.float() * w1 + o2.float() * w2).to(o1.dtype)


class Flex(System):
    name = "flex"

    def prepare(self):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        seg = torch.empty(self.layout.total_tokens, dtype=torch.int32, device=self.q.device)
        group = torch.empty_like(seg)
        sid = 0
        for g in range(self.layout.num_groups):
            p0, p1 = self.layout.prompt_range(g)
            seg[p0:p1] = -1
            group[p0:p1] = g
            for i in range(len(self.layout.response_lens[g])):
                r0, r1 = self.layout.response_range(g, i)
                seg[r0:r1] = sid
                group[r0:r1] = g
                sid += 1

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (group[kv_idx] == group[q_idx]) & ((seg[kv_idx] == -1) | (seg[kv_idx] == seg[q_idx]))

        t = self.layout.total_tokens
        self.block_mask = create_block_mask(mask_mod, None, None, t, t, device=self.q.device, _compile=True)
        self.flex = torch.compile(flex_attention, dynamic=False)
        self.qt, self.kt, self.vt = (x.transpose(0, 1).unsqueeze(0) for x in (self.q, self.k, self.v))

    def forward(self):
        out = self.flex(self.qt, self.kt, self.vt, block_mask=self.block_mask, scale=self.scale,
                        enable_gqa=self.q.shape[1] != self.k.shape[1])
        return out[0].transpose(0, 1)


SYSTEMS = {cls.name: cls for cls in (DualKV, FA2NCopy, Cascade, Flex)}
