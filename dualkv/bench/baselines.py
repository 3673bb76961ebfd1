"""The attention systems the kernel benchmark compares, each run from the same packed (T, heads, d) activations.

* ``dualkv``      — :func:`dualkv.shared_prefix_attention` (one fused launch; CUDA kernels on a GPU).
* ``dualkv_tree`` — the same work through the prefix-tree kernels (the layout as a depth-1 forest).
* ``fa2_ncopy``   — PyTorch's vendored FlashAttention-2 (``aten._flash_attention_forward/_backward``) on the
                    N-copy layout: every prompt copied N times, causal varlen attention over [P; R_i] rows.
* ``cascade``     — three stock FA2 calls (prompt causal; all response queries x prompt keys; responses causal per
                    sequence) merged by log-sum-exp; backward: each part's FA2 backward with the merged output and
                    LSE (as ring attention does). Exact, no custom kernel.
* ``cudnn_cascade`` — the same three parts on PyTorch's cuDNN attention (:mod:`dualkv.cascade`; native GQA,
                    varlen through per-group calls and padded responses): the strongest exact composition of stock
                    PyTorch kernels on Hopper.
* ``cudnn_ncopy`` — cuDNN causal attention on the N-copy layout as a padded (N, P + R_max) batch.
* ``flex``        — ``torch.compile(flex_attention, dynamic=False)`` over the P+ΣR layout with a shared-prefix
                    BlockMask (a static kernel per shape); ``flex_dynamic`` the same under torch.compile's default.

Every system has ``prepare()`` (untimed one-time work: input copies for the N-copy layout, mask building,
compilation), ``forward(train)`` and ``backward(dout)`` (after a ``forward(train=True)``).
"""

from __future__ import annotations

import contextlib
import math

import torch

from ..layout import GroupLayout
from .registry import kernel_systems


class System:
    name = "system"

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: GroupLayout):
        self.q, self.k, self.v, self.layout = q, k, v, layout
        self.scale = 1.0 / math.sqrt(q.shape[-1])
        self.out = None

    def prepare(self) -> None:
        """One-time work outside the timed region."""

    def forward(self, train: bool = False) -> torch.Tensor:
        raise NotImplementedError

    def backward(self, dout: torch.Tensor):
        raise NotImplementedError

    def output_rows(self) -> int:
        """Rows of this system's output (and upstream gradient): T, or T_std for the N-copy layout."""
        return self.layout.total_tokens

    def to_packed(self, out: torch.Tensor) -> torch.Tensor:
        """The system's output in packed (T, H, d) order."""
        return out

    def upstream(self, dout: torch.Tensor) -> torch.Tensor:
        """A packed (T, H, d) upstream gradient in this system's output rows (copies other than the first get 0)."""
        return dout

    def packed_grads(self, grads):
        """(dq, dk, dv) in this system's rows -> packed (T, heads, d), summed over copies (fp32)."""
        return [g.float() for g in grads]


class _Autograd(System):
    """Systems differentiated by autograd."""

    def _leaves(self, train):
        if not train:
            return self.q, self.k, self.v
        self.leaves = tuple(t.detach().requires_grad_() for t in (self.q, self.k, self.v))
        return self.leaves

    def backward(self, dout):
        return torch.autograd.grad(self.out, self.leaves, dout, retain_graph=True)


class DualKV(_Autograd):
    """dualkv with the deterministic backward (the default kernels' choice of dQ scheme, bitwise reproducible)."""

    name = "dualkv"
    deterministic = True

    def forward(self, train=False):
        import dualkv

        q, k, v = self._leaves(train)
        with torch.set_grad_enabled(train):
            self.out = dualkv.shared_prefix_attention(q, k, v, self.layout, deterministic=self.deterministic)
        return self.out


class DualKVTree(DualKV):
    """dualkv's prefix-tree kernels on the layout as a depth-1 forest (``PrefixTreeLayout.from_group_layout``): the
    public API would route that packing to the two-level kernels, so this measures what the tree kernels cost on
    the same work (the issue's "within 5% of the two-level kernel")."""

    name = "dualkv_tree"

    def prepare(self):
        from ..tree import PrefixTreeLayout

        self.tree = PrefixTreeLayout.from_group_layout(self.layout)

    def forward(self, train=False):
        from ..cuda.api import tree_attention

        q, k, v = self._leaves(train)
        with torch.set_grad_enabled(train):
            self.out = tree_attention(q, k, v, self.tree, deterministic=self.deterministic, tree_kernels=True)
        return self.out


class DualKVAtomic(DualKV):
    """dualkv with ``deterministic=False``: on Hopper the path :data:`dualkv.cuda.configs.CASCADE_FASTER` names
    (d = 64, 128, 192, 256: the fused forward with the cuDNN cascade's backward; d = 96: the fused kernels); on
    the mma.sync kernels the atomic dQ at d = 64-128, the split backward elsewhere
    (:data:`dualkv.cuda.configs.MMA_BACKWARDS`)."""

    name = "dualkv_atomic"
    deterministic = False


class _Switched(DualKV):
    """dualkv under in-process switches of :mod:`dualkv.cuda.configs` (``(name, choice)`` pairs: kernel family, mma
    backward, attention path), in force for the forward AND the backward: the backward picks its kernels when it
    runs. None writes to ``os.environ``."""

    switches: tuple[tuple[str, str], ...] = ()

    def _in_force(self) -> contextlib.ExitStack:
        from dualkv.cuda import configs

        stack = contextlib.ExitStack()
        for name, choice in self.switches:
            stack.enter_context(getattr(configs, name)(choice))
        return stack

    def forward(self, train=False):
        with self._in_force():
            return super().forward(train)

    def backward(self, dout):
        with self._in_force():
            return super().backward(dout)


class DualKVHybrid(_Switched):
    """``deterministic=False`` on the hybrid path (``path_override("hybrid")``, in process what ``DUALKV_PATH=hybrid``
    sets): the fused forward, the cuDNN cascade's part backwards from its output and LSE (:mod:`dualkv.cuda.hybrid`)."""

    name = "dualkv_hybrid"
    deterministic = False
    switches = (("path_override", "hybrid"),)


class DualKVMma(_Switched):
    """dualkv with the mma.sync kernels on Hopper too (what sm_80 runs; the wgmma kernels' baseline)."""

    name = "dualkv_mma"
    switches = (("kernel_family", "mma"),)


class DualKVMmaSplit(_Switched):
    """The mma.sync kernels with the split backward whatever "auto" picks: the dQ kernel beside the dK/dV kernel,
    seven products, deterministic (``mma_backward("split")``)."""

    name = "dualkv_mma_split"
    switches = (("kernel_family", "mma"), ("mma_backward", "split"))


class DualKVMmaOrdered(_Switched):
    """The mma.sync kernels with the ordered-dQ backward: dQ inside the dK/dV kernel, five products, deterministic
    (``mma_backward("ordered")``)."""

    name = "dualkv_mma_ordered"
    switches = (("kernel_family", "mma"), ("mma_backward", "ordered"))


class DualKVMmaAtomic(_Switched):
    """The mma.sync kernels' atomic dQ (``mma_backward("atomic")``, ``deterministic=False``) on the fused path
    (``path_override("fused")``: not Hopper's dispatch floor): dQ added by fp32 atomics inside the dK/dV kernel, five
    products, FlashAttention-2's scheme."""

    name = "dualkv_mma_atomic"
    deterministic = False
    switches = (("kernel_family", "mma"), ("mma_backward", "atomic"), ("path_override", "fused"))


class DualKVV1(_Switched):
    """dualkv with the first-generation Hopper wgmma kernels (cp.async loads, no warp specialisation)."""

    name = "dualkv_v1"
    switches = (("kernel_family", "wgmma_v1"),)


class Reference(_Autograd):
    """dualkv's pure-PyTorch oracle (any device; for CPU smoke tests of the harness)."""

    name = "reference"

    def forward(self, train=False):
        from ..reference import shared_prefix_attention

        q, k, v = self._leaves(train)
        with torch.set_grad_enabled(train):
            self.out = shared_prefix_attention(q, k, v, self.layout)
        return self.out


def fa2_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
    """(out, lse, rng_state, unused) of PyTorch's FlashAttention-2 varlen forward."""
    out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal,
                                                                       False, scale=scale)
    return out, lse, rng, unused


def fa2_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, rng, unused, scale):
    return torch.ops.aten._flash_attention_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, 0.0, causal,
                                                    rng, unused, scale=scale)


class FA2NCopy(_Autograd):
    """PyTorch's varlen FlashAttention-2 on the N-copy layout — the same call as the layer-level ``fa2_ncopy``
    (:func:`dualkv.bench.systems.varlen_causal`), differentiated by autograd. The N-copy q/k/v are built in
    :meth:`prepare`: in the N-copy pipeline they are the activations themselves, so their memory counts (peak memory
    is measured over preparation and calls) but their copy time does not."""

    name = "fa2_ncopy"

    def prepare(self):
        index = torch.from_numpy(self.layout.copy_token_index).to(self.q.device)
        self.q_std, self.k_std, self.v_std = (t[index].contiguous() for t in (self.q, self.k, self.v))
        cu = self.layout.copy_cu_seqlens
        self.cu = torch.from_numpy(cu).to(device=self.q.device, dtype=torch.int32)
        self.max_len = int((cu[1:] - cu[:-1]).max())

    def output_rows(self):
        return self.layout.tokens_std

    def forward(self, train=False):
        from .systems import varlen_causal

        q, k, v = (self.q_std, self.k_std, self.v_std)
        if train:
            self.leaves = q, k, v = tuple(t.detach().requires_grad_() for t in (q, k, v))
        with torch.set_grad_enabled(train):
            self.out = varlen_causal(q, k, v, self.cu, self.cu, self.max_len, self.max_len, self.scale)
        return self.out

    def to_packed(self, out):
        return out[torch.from_numpy(self.layout.first_copy_index).to(out.device)]

    def upstream(self, dout):
        d = dout.new_zeros((self.output_rows(), *dout.shape[1:]))
        d[torch.from_numpy(self.layout.first_copy_index).to(dout.device)] = dout
        return d

    def packed_grads(self, grads):
        index = torch.from_numpy(self.layout.copy_token_index).to(self.q.device)
        return [torch.zeros(t.shape, dtype=torch.float32, device=t.device).index_add_(0, index, g.float())
                for t, g in zip((self.q, self.k, self.v), grads)]


class CudnnNCopy(System):
    """cuDNN causal attention over the N-copy layout as a padded (S, L_max) batch (S = responses, L = P_g + R_i;
    padding at the end, which a causal query never sees). The padded copies are built in :meth:`prepare`, like
    FA2 N-copy's: in that pipeline they are the activations themselves."""

    name = "cudnn_ncopy"

    def prepare(self):
        import numpy as np

        from .systems import padded_slots

        lay = self.layout
        lens = [lay.prompt_lens[g] + r for g, r in zip(lay.response_group, lay.flat_response_lens)]
        slot_of_copy, self.width = padded_slots(lens)
        self.batch = len(lens)
        gather = np.zeros(self.batch * self.width, dtype=np.int64)
        gather[slot_of_copy] = lay.copy_token_index
        dev = self.q.device
        self.slot_of_copy = torch.from_numpy(slot_of_copy).to(dev)
        self.token_of_slot = torch.from_numpy(gather).to(dev)
        self.first_slot = torch.from_numpy(slot_of_copy[lay.first_copy_index]).to(dev)
        self.q4, self.k4, self.v4 = (t[self.token_of_slot].view(self.batch, self.width, *t.shape[1:]).transpose(1, 2)
                                     for t in (self.q, self.k, self.v))

    def output_rows(self):
        return self.batch * self.width

    def forward(self, train=False):
        from ..cascade import engine_for

        self.engine = engine_for(self.q)  # cuDNN on CUDA bf16/fp16; plain math elsewhere (CPU checks)
        self.out4, self.lse, self.state = self.engine.forward(self.q4, self.k4, self.v4, True, self.scale)
        return self.out4.transpose(1, 2).reshape(self.output_rows(), *self.q.shape[1:])

    def backward(self, dout):
        d4 = dout.view(self.batch, self.width, *dout.shape[1:]).transpose(1, 2)
        grads = self.engine.backward(d4, self.q4, self.k4, self.v4, self.out4, self.lse, self.state, True,
                                       self.scale)
        return [g.transpose(1, 2).reshape(self.output_rows(), *g.shape[1:2], g.shape[-1]) for g in grads]

    def to_packed(self, out):
        return out[self.first_slot]

    def upstream(self, dout):
        d = dout.new_zeros((self.output_rows(), *dout.shape[1:]))
        d[self.first_slot] = dout
        return d

    def packed_grads(self, grads):
        rows = self.token_of_slot[self.slot_of_copy]
        return [torch.zeros(t.shape, dtype=torch.float32, device=t.device).index_add_(0, rows,
                                                                                      g[self.slot_of_copy].float())
                for t, g in zip((self.q, self.k, self.v), grads)]


def merge_by_lse(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor):
    """Exact merge of attentions over two disjoint key sets: o (T, H, d), l (H, T) natural-log LSE -> (o, l); the
    cascade backend's merge (:func:`dualkv.cascade.merge_lse`), output in o1's dtype."""
    from ..cascade import merge_lse

    return merge_lse(o1, l1, o2, l2, o1.dtype)


class Cascade(System):
    name = "cascade"

    def prepare(self):
        dev = self.q.device
        self.parts = []
        for g in range(self.layout.num_groups):
            p0, p1 = self.layout.prompt_range(g)
            r0, r1 = self.layout.responses_range(g)
            i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
            self.parts.append(dict(p=(p0, p1), r=(r0, r1), cu_p=i32([0, p1 - p0]), cu_all=i32([0, r1 - r0]),
                                   cu_r=i32(self.layout.response_cu_seqlens(g)),
                                   max_r=max(self.layout.response_lens[g])))

    def forward(self, train=False):
        q, k, v, s = self.q, self.k, self.v, self.scale
        self.out = torch.empty_like(q)
        self.saved = []
        for part in self.parts:
            (p0, p1), (r0, r1) = part["p"], part["r"]
            p, n = p1 - p0, r1 - r0
            prompt = fa2_forward(q[p0:p1], k[p0:p1], v[p0:p1], part["cu_p"], part["cu_p"], p, p, True, s)
            cross = fa2_forward(q[r0:r1], k[p0:p1], v[p0:p1], part["cu_all"], part["cu_p"], n, p, False, s)
            own = fa2_forward(q[r0:r1], k[r0:r1], v[r0:r1], part["cu_r"], part["cu_r"], part["max_r"],
                              part["max_r"], True, s)
            merged, lse = merge_by_lse(cross[0], cross[1], own[0], own[1])
            self.out[p0:p1] = prompt[0]
            self.out[r0:r1] = merged
            if train:
                self.saved.append((prompt, cross, own, merged, lse))
        return self.out

    def backward(self, dout):
        q, k, v, s = self.q, self.k, self.v, self.scale
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for part, (prompt, cross, own, merged, lse) in zip(self.parts, self.saved):
            (p0, p1), (r0, r1) = part["p"], part["r"]
            p, n = p1 - p0, r1 - r0
            a = fa2_backward(dout[p0:p1], q[p0:p1], k[p0:p1], v[p0:p1], prompt[0], prompt[1], part["cu_p"],
                             part["cu_p"], p, p, True, prompt[2], prompt[3], s)
            b = fa2_backward(dout[r0:r1], q[r0:r1], k[p0:p1], v[p0:p1], merged, lse, part["cu_all"], part["cu_p"],
                             n, p, False, cross[2], cross[3], s)
            c = fa2_backward(dout[r0:r1], q[r0:r1], k[r0:r1], v[r0:r1], merged, lse, part["cu_r"], part["cu_r"],
                             part["max_r"], part["max_r"], True, own[2], own[3], s)
            dq[p0:p1] = a[0]
            dq[r0:r1] = b[0] + c[0]
            dk[p0:p1] = a[1] + b[1]
            dv[p0:p1] = a[2] + b[2]
            dk[r0:r1] = c[1]
            dv[r0:r1] = c[2]
        return dq, dk, dv


class CudnnCascade(_Autograd):
    """:mod:`dualkv.cascade` on cuDNN attention parts (what the dispatch floor routes to where it is faster)."""

    name = "cudnn_cascade"

    def forward(self, train=False):
        from ..cascade import shared_prefix_attention

        q, k, v = self._leaves(train)
        with torch.set_grad_enabled(train):  # cuDNN parts on CUDA bf16/fp16 (plain math elsewhere: CPU checks)
            self.out = shared_prefix_attention(q, k, v, self.layout)
        return self.out


class Flex(_Autograd):
    """FlexAttention compiled for this shape (static: its fastest kernel for one shape)."""

    name = "flex"
    dynamic: bool | None = False

    def prepare(self):
        from .systems import compiled_flex_attention, flex_mask

        # The benchmark re-runs one backward (retain_graph=True); compiled donated buffers forbid that.
        torch._functorch.config.donated_buffer = False
        self.block_mask = flex_mask(self.layout, self.q.device).block_mask
        self.flex = compiled_flex_attention(self.dynamic)

    def forward(self, train=False):
        q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in self._leaves(train))
        with torch.set_grad_enabled(train):
            out = self.flex(q, k, v, block_mask=self.block_mask, scale=self.scale,
                            enable_gqa=self.q.shape[1] != self.k.shape[1])
            self.out = out[0].transpose(0, 1)
        return self.out


class FlexDynamic(Flex):
    """FlexAttention under torch.compile's default (dynamic-shape kernels once a second shape is seen): what a
    trainer whose (P, R_i) change every micro-batch runs, rather than recompiling per shape."""

    name = "flex_dynamic"
    dynamic = None


#: The kernel-level implementations of the one registry (dualkv.bench.registry).
SYSTEMS = {cls.name: cls for cls in (DualKV, DualKVTree, DualKVAtomic, DualKVHybrid, DualKVMma, DualKVMmaSplit,
                                     DualKVMmaOrdered, DualKVMmaAtomic, DualKVV1, FA2NCopy, Cascade, CudnnCascade,
                                     CudnnNCopy, Flex, FlexDynamic, Reference)}
if set(SYSTEMS) != set(kernel_systems()):
    raise RuntimeError(f"kernel systems {tuple(SYSTEMS)} and the registry's {kernel_systems()} disagree")
