"""Input validation shared by every public entry point. Each check names the argument and what is wrong.

Sections: attention inputs (both backends), the log-prob head's inputs, and the numbers of :mod:`dualkv.analysis`.
"""

from __future__ import annotations

import math
from typing import Sequence, Union

import numpy as np
import torch

from .layout import GroupLayout

SUPPORTED_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def check_qkv(tensors: dict[str, torch.Tensor], *, query: str, keys: Sequence[str]) -> tuple[int, int, int]:
    """Check packed (tokens, heads, head_dim) tensors: rank, dtype, device, head dim and GQA ratio.

    Returns (H, H_k, d).
    """
    q = tensors[query]
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must have shape (tokens, heads, head_dim); got {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: float64, float32, bfloat16, float16")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {query} has {q.dtype}; all inputs must share one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but {query} is on {q.device}")
        if t.shape[2] != q.shape[2]:
            raise ValueError(f"{name} has head_dim {t.shape[2]} but {query} has {q.shape[2]}")
    h = q.shape[1]
    hk = tensors[keys[0]].shape[1]
    if q.shape[2] < 1:
        raise ValueError(f"{query} has head_dim {q.shape[2]}; need head_dim >= 1")
    if h < 1:
        raise ValueError(f"{query} has {h} heads; need at least one query head")
    for name in keys:
        if tensors[name].shape[1] != hk:
            raise ValueError(f"{name} has {tensors[name].shape[1]} heads but {keys[0]} has {hk}")
    if hk == 0 or h % hk != 0:
        raise ValueError(f"{query} has {h} heads, which is not a multiple of the {hk} key/value heads (GQA needs "
                         "H % H_k == 0)")
    return h, hk, q.shape[2]


def check_same_tokens(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str) -> None:
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"{a_name} has {a.shape[0]} tokens but {b_name} has {b.shape[0]}")


def check_cu_seqlens(cu: torch.Tensor, name: str, total: int, device: torch.device) -> list[int]:
    """Validate a cu_seqlens tensor against the token count it indexes; return it as a host list.

    Reads the tensor to the host once (N + 1 integers).
    """
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32, got {type(cu).__name__}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} must be 1-D with N + 1 >= 2 entries; got shape {tuple(cu.shape)}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 (or int64); got {cu.dtype}")
    if cu.device.type != "cpu" and cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but the attention inputs are on {device}")
    values = [int(x) for x in cu.tolist()]
    if values[0] != 0:
        raise ValueError(f"{name}[0] = {values[0]}; cu_seqlens must start at 0")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError(f"{name} decreases at index {i} ({values[i - 1]} -> {values[i]})")
    if values[-1] != total:
        raise ValueError(f"{name}[-1] = {values[-1]} but the packed tensors hold {total} tokens")
    return values


def check_max_seqlen(max_seqlen: int, name: str, lengths: Sequence[int]) -> None:
    if isinstance(max_seqlen, (bool, np.bool_)) or not isinstance(max_seqlen, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(max_seqlen).__name__}")
    actual = max(lengths) if len(lengths) else 0
    if max_seqlen < actual:
        raise ValueError(f"{name} = {max_seqlen} is smaller than the longest sequence ({actual})")


def check_window(window_size: Sequence[int], causal: bool) -> tuple[int, int]:
    """Normalise a FlashAttention-style (left, right) window; -1 means unbounded. Causal caps right at 0. Every
    entry point that takes ``causal`` passes it through here, so this is also where it must be a bool."""
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be True or False; got {causal!r}")
    if isinstance(window_size, (str, bytes)) or not hasattr(window_size, "__len__") or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair of ints (left, right); got {window_size!r}")
    left, right = (check_int(w, f"window_size[{i}]", -1) for i, w in enumerate(window_size))
    if causal:
        right = 0
    return left, right


def check_deterministic(deterministic: bool | None) -> bool | None:
    """``deterministic`` must be None (the backend's default) or a bool."""
    if deterministic is not None and not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be True, False or None; got {deterministic!r}")
    return deterministic


def resolve_scale(softmax_scale: float | None, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    # float() would turn True into 1.0 and "0.5" into 0.5: only numbers (Python, numpy, a 1-element tensor) pass.
    if isinstance(softmax_scale, (bool, np.bool_, str, bytes)):
        raise TypeError(f"softmax_scale must be a number or None; got {type(softmax_scale).__name__} "
                        f"{softmax_scale!r}")
    try:
        scale = float(softmax_scale)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"softmax_scale must be a number or None; got {type(softmax_scale).__name__}") from exc
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"softmax_scale must be a positive finite number; got {softmax_scale!r}")
    return scale


def check_dualkv_inputs(q, k_context, v_context, k_decoded, v_decoded, cu_seqlens_q, cu_seqlens_k_decoded,
                        max_seqlen_q, context_seqlen,
                        max_seqlen_k_decoded) -> tuple[int, int, int, list[int], list[int]]:
    """Validate the paper's call-2 arguments; returns (H, H_k, d, cu_seqlens_q and cu_seqlens_k_decoded as host ints).

    Sequence i has L_i = cu_seqlens_q[i+1] - cu_seqlens_q[i] query rows and R_i decoded keys; its rows are aligned
    bottom-right on its P + R_i keys, so L_i <= P + R_i.
    """
    tensors = {"q": q, "k_context": k_context, "v_context": v_context, "k_decoded": k_decoded,
               "v_decoded": v_decoded}
    h, hk, d = check_qkv(tensors, query="q", keys=("k_context", "v_context", "k_decoded", "v_decoded"))
    if isinstance(context_seqlen, (bool, np.bool_)) or not isinstance(context_seqlen, (int, np.integer)) \
            or context_seqlen < 0:
        raise ValueError(f"context_seqlen must be an int >= 0; got {context_seqlen!r}")
    for name in ("k_context", "v_context"):
        if tensors[name].shape[0] != context_seqlen:
            raise ValueError(f"{name} has {tensors[name].shape[0]} tokens but context_seqlen = {context_seqlen}")
    check_same_tokens(v_decoded, "v_decoded", k_decoded, "k_decoded")
    cu_q = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0], q.device)
    cu_k = check_cu_seqlens(cu_seqlens_k_decoded, "cu_seqlens_k_decoded", k_decoded.shape[0], q.device)
    if len(cu_q) != len(cu_k):
        raise ValueError(f"cu_seqlens_q has {len(cu_q) - 1} sequences but cu_seqlens_k_decoded has {len(cu_k) - 1}")
    lens_q = [b - a for a, b in zip(cu_q, cu_q[1:])]
    lens_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        if lq > context_seqlen + lk:
            raise ValueError(f"sequence {i} has {lq} query rows but only {context_seqlen} + {lk} keys; its rows are "
                             "aligned bottom-right on [context; decoded], so L_i <= context_seqlen + R_i")
    check_max_seqlen(max_seqlen_q, "max_seqlen_q", lens_q)
    check_max_seqlen(max_seqlen_k_decoded, "max_seqlen_k_decoded", lens_k)
    return h, hk, d, cu_q, cu_k


def check_context_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor | None,
                         max_seqlen: int | None) -> tuple[int, int, int, list[int]]:
    """Validate call 1's arguments (one prompt, or several packed by ``cu_seqlens``); returns (H, H_k, d,
    cu_seqlens as host ints)."""
    h, hk, d = check_qkv({"q": q, "k": k, "v": v}, query="q", keys=("k", "v"))
    for name, t in (("k", k), ("v", v)):
        check_same_tokens(t, name, q, "q")
    if cu_seqlens is None:
        if max_seqlen is not None:  # optional here (one sequence of q's length), but checked when given
            check_max_seqlen(max_seqlen, "max_seqlen", [q.shape[0]])
        return h, hk, d, [0, q.shape[0]]
    if max_seqlen is None:
        raise ValueError("context_attention: max_seqlen is required when cu_seqlens is given")
    cu = check_cu_seqlens(cu_seqlens, "cu_seqlens", q.shape[0], q.device)
    check_max_seqlen(max_seqlen, "max_seqlen", [b - a for a, b in zip(cu, cu[1:])])
    return h, hk, d, cu


def check_layout_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: GroupLayout) -> tuple[int, int, int]:
    """Validate packed (T, heads, d) tensors against a GroupLayout; returns (H, H_k, d)."""
    if not isinstance(layout, GroupLayout):
        raise TypeError(f"layout must be a dualkv.GroupLayout, got {type(layout).__name__}")
    h, hk, d = check_qkv({"q": q, "k": k, "v": v}, query="q", keys=("k", "v"))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[0] != layout.total_tokens:
            raise ValueError(f"{name} has {t.shape[0]} tokens but the layout packs {layout.total_tokens} "
                             f"({layout!r})")
    return h, hk, d


# ---------------------------------------------------------------------------------------------- log-prob head
def check_head_inputs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      predictor_index: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size: int,
                      logit_softcap: float | None) -> None:
    """Validate the chunked log-prob head's arguments: hidden (T, D), weight (V, D), bias (V,) or None, and the
    (M,) predictor rows and target ids."""
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
        raise ValueError(f"hidden_states must be (T, D) (or (1, T, D)); got {tuple(getattr(hidden, 'shape', ()))}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight must be the (V, D) lm_head weight with D = {hidden.shape[1]}; got "
                         f"{tuple(getattr(weight, 'shape', ()))}")
    if weight.dtype != hidden.dtype or weight.device != hidden.device:
        raise ValueError(f"weight ({weight.dtype}, {weight.device}) and hidden_states ({hidden.dtype}, "
                         f"{hidden.device}) must share dtype and device")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != weight.dtype):
        raise ValueError(f"bias must be ({weight.shape[0]},) of dtype {weight.dtype}; got {tuple(bias.shape)}, "
                         f"{bias.dtype}")
    for name, t in (("predictor_index", predictor_index), ("targets", targets)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be a 1-D integer tensor; got {getattr(t, 'dtype', type(t))}, "
                             f"{tuple(getattr(t, 'shape', ()))}")
        if t.device != hidden.device:
            raise ValueError(f"{name} is on {t.device} but hidden_states on {hidden.device}")
    if predictor_index.shape != targets.shape:
        raise ValueError(f"predictor_index has {predictor_index.shape[0]} entries but targets {targets.shape[0]}")
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be a positive number; got {temperature!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int; got {chunk_size!r}")
    if logit_softcap is not None and not logit_softcap > 0:
        raise ValueError(f"logit_softcap must be positive or None; got {logit_softcap!r}")


# ---------------------------------------------------------------------------------------------- analysis numbers
IntOrSeq = Union[int, Sequence[int]]


def check_int(value: object, name: str, minimum: int) -> int:
    """``value`` as a Python int, refusing bools, non-integral numbers and values below ``minimum``."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got a bool")
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{name} = {value!r} must be a whole number")
        value = int(value)
    if not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        if name == "N":
            raise ValueError(f"N = {int(value)}: need N >= 1 (at least one response per prompt)")
        raise ValueError(f"{name} = {int(value)} is out of range: {name} must be >= {minimum}")
    return int(value)


def check_window_left(window_left: object) -> int:
    """A causal window's left extent: -1 (unbounded) or >= 0 keys before the query."""
    return check_int(window_left, "window_left", -1)


def response_lengths(N: int | None, R: IntOrSeq) -> tuple[int, ...]:
    """The N response lengths: ``R`` repeated N times, or the explicit list ``R`` (then N, if given, must match)."""
    if isinstance(R, (int, np.integer, float, np.floating)) and not isinstance(R, (bool, np.bool_)):
        if N is None:
            raise ValueError("N is required when R is a single length")
        n = check_int(N, "N", 1)
        return (check_int(R, "R", 1),) * n
    if isinstance(R, (str, bytes)) or not hasattr(R, "__iter__"):
        raise TypeError(f"R must be an int or a sequence of ints, got {type(R).__name__}")
    lens = tuple(check_int(r, f"R[{i}]", 1) for i, r in enumerate(R))
    if not lens:
        raise ValueError("R is an empty list: need N >= 1 responses")
    if N is not None and check_int(N, "N", 1) != len(lens):
        raise ValueError(f"N = {N} but R lists {len(lens)} response lengths")
    return lens


def check_positive_array(value: object, name: str, at_least_one: bool = False) -> np.ndarray:
    """A float array (or scalar) whose entries are all finite and > 0 (``at_least_one``: >= 1, as for N)."""
    arr = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite entries")
    bad = arr < 1 if at_least_one else arr <= 0
    if np.any(bad):
        worst = float(arr[bad].min())
        raise ValueError(f"{name} = {worst:g} is out of range: {name} must be {'>= 1' if at_least_one else '> 0'}")
    return arr


def check_mode(mode: object) -> str:
    if mode not in ("fwd", "bwd", "fwdbwd"):
        raise ValueError(f"mode = {mode!r}: expected 'fwd', 'bwd' or 'fwdbwd'")
    return str(mode)
