"""The ``dualkv model`` report: every prediction for one (N, P, R, model[, mb]) in one JSON-ready dict."""

from __future__ import annotations

from .._checks import IntOrSeq, check_int, check_mode, response_lengths
from .memory import PAPER_LLAMA31_8B_LAW, MemoryLaw, checkpoint_bytes_per_token, model_kernel_memory_savings
from .models import PEAK_BF16_FLOPS, load_model, mfu, model_flops, step_speedup_bounds
from .pairs import attn_speedup_theory, n_copy_pairs, useful_pairs
from .tokens import group_layout, micro_batch_layouts, rho_layout, rho_limit_long_prompt, rho_limit_many_responses

__all__ = ["model_report", "format_report"]


def model_report(N: int | None, P: int, R: IntOrSeq, model: str = "qwen3-8b", mb: int | None = None,
                 mode: str = "fwdbwd", recompute: bool = False, memory_law: MemoryLaw | None = None,
                 seconds: float | None = None, gpu: str = "H100", num_gpus: int = 1) -> dict:
    """Token counts, rho, attention pairs, whole-model FLOPs, predicted speedups and memory for one prompt group.

    Units: token and pair counts are integers; FLOPs are FLOPs; memory is bytes unless a key says GiB/GB.
    ``mb``: micro-batch size in rows (adds a ``micro_batch`` section: the group is cut into micro-batches of
    ``mb`` rows). ``memory_law``: a fitted :class:`MemoryLaw` to project peak memory at (P, mb, mean R); for
    llama-3.1-8b without one, the paper's own fit is used and labelled as such. ``seconds``: a measured time for
    the whole group's ``mode`` pass(es) on ``num_gpus`` GPUs of kind ``gpu`` (a key of ``PEAK_BF16_FLOPS``); adds
    an ``mfu`` section: utilisation counting the dualkv layout's FLOPs, and counting the N-copy layout's FLOPs
    (the work the same rows cost unshared — an "effective" figure, larger than 1 is possible). MFU counts model
    FLOPs only: with ``recompute`` the measured time includes the recomputed forward, but its FLOPs are not counted.
    """
    lens = response_lengths(N, R)
    n = len(lens)
    cfg = load_model(model)
    mode = check_mode(mode)
    layout = group_layout(None, P, lens)
    r_mean = sum(lens) / n
    std = model_flops(cfg, layout, mode, "ncopy", recompute)
    dk = model_flops(cfg, layout, mode, "dualkv", recompute)
    per_token_ckpt = checkpoint_bytes_per_token(cfg)
    kernel_saved = model_kernel_memory_savings(cfg, n, layout.prompt_lens[0])
    out = {
        "model": cfg.name, "N": n, "P": layout.prompt_lens[0], "R": lens[0] if len(set(lens)) == 1 else list(lens),
        "R_mean": r_mean, "mode": mode, "recompute": recompute,
        "rho": rho_layout(layout),
        "tokens_std": layout.tokens_std,
        "tokens_dualkv": layout.total_tokens,
        "rho_limit_many_responses": rho_limit_many_responses(layout.prompt_lens[0], r_mean),
        "rho_limit_long_prompt": rho_limit_long_prompt(n),
        "attn_pairs_std": n_copy_pairs(layout),
        "attn_pairs_dualkv": useful_pairs(layout),
        "attn_speedup_pairs": n_copy_pairs(layout) / useful_pairs(layout),
        "attn_speedup_theory": attn_speedup_theory(n, layout.prompt_lens[0], r_mean),
        "flops_std": std,
        "flops_dualkv": dk,
        "speedup": step_speedup_bounds(cfg, layout, mode, recompute),
        "memory": {
            "kernel_savings_per_layer_bytes": kernel_saved["per_layer"],
            "kernel_savings_all_layers_bytes": kernel_saved["all_layers"],
            "checkpoint_activation_bytes_std": layout.tokens_std * per_token_ckpt,
            "checkpoint_activation_bytes_dualkv": layout.total_tokens * per_token_ckpt,
            "activation_ratio": rho_layout(layout),
        },
    }
    if mb is not None:
        mb = check_int(mb, "mb", 1)
        parts = micro_batch_layouts(n, layout.prompt_lens[0], lens, mb)
        first = parts[0]
        out["micro_batch"] = {
            "mb": mb, "micro_batches_per_group": len(parts),
            "rho": sum(p.tokens_std for p in parts) / sum(p.total_tokens for p in parts),
            "tokens_std_first": first.tokens_std, "tokens_dualkv_first": first.total_tokens,
            "flop_ratio_first": step_speedup_bounds(cfg, first, mode, recompute)["flop_ratio"],
        }
        law = memory_law if memory_law is not None else (PAPER_LLAMA31_8B_LAW if cfg.name == "llama-3.1-8b" else None)
        if law is not None:
            out["memory"]["law"] = {
                "source": law.source, "unit": law.unit, "M0": law.M0, "c_P_per_token": law.c_P,
                "c_mbR_per_token": law.c_mbR, "r2": law.r2,
                "dualkv": float(law.predict(layout.prompt_lens[0], mb, r_mean)),
                "fa2_projection": float(law.fa2_projection(layout.prompt_lens[0], mb, r_mean)),
            }
    if seconds is not None:
        if gpu not in PEAK_BF16_FLOPS:
            raise ValueError(f"unknown gpu {gpu!r}; known: {', '.join(PEAK_BF16_FLOPS)}")
        peak = PEAK_BF16_FLOPS[gpu]
        std_model, dk_model = ((model_flops(cfg, layout, mode, kind)["total"] for kind in ("ncopy", "dualkv"))
                               if recompute else (std["total"], dk["total"]))
        out["mfu"] = {"seconds": seconds, "gpu": gpu, "num_gpus": num_gpus, "peak_flops_per_gpu": peak,
                      "dualkv_flops": mfu(dk_model, seconds, peak, num_gpus),
                      "ncopy_equivalent": mfu(std_model, seconds, peak, num_gpus)}
    return out


def _e(x: float) -> str:
    return f"{x:.3e}"


def format_report(rep: dict) -> str:
    """The report as readable text (the default output of ``dualkv model``)."""
    sp, mem = rep["speedup"], rep["memory"]
    r = rep["R"] if isinstance(rep["R"], int) else f"{len(rep['R'])} lengths, mean {rep['R_mean']:.1f}"
    lines = [
        f"model {rep['model']}  N={rep['N']}  P={rep['P']}  R={r}  mode={rep['mode']}"
        + ("  (recompute)" if rep["recompute"] else ""),
        "",
        f"tokens          N-copy {rep['tokens_std']:>14,}   dualkv {rep['tokens_dualkv']:>14,}   rho = {rep['rho']:.2f}",
        f"rho limits      N->inf: 1+P/R = {rep['rho_limit_many_responses']:.2f}   P->inf: N = {rep['rho_limit_long_prompt']:.0f}",
        f"attn pairs      N-copy {rep['attn_pairs_std']:>14,}   dualkv {rep['attn_pairs_dualkv']:>14,}   "
        f"ratio = {rep['attn_speedup_pairs']:.2f}  (paper formula N(P+R)^2/(P^2+NR(P+R)) = {rep['attn_speedup_theory']:.2f})",
        "",
        f"model FLOPs ({rep['mode']})  {'N-copy':>12} {'dualkv':>12}  ratio",
    ]
    for part in ("linear", "attention", "total"):
        a, b = rep["flops_std"][part], rep["flops_dualkv"][part]
        lines.append(f"  {part:<19} {_e(a):>12} {_e(b):>12}  {a / b:.2f}")
    lines += [
        f"attention share of FLOPs: N-copy {sp['attention_share_std']:.1%}, dualkv {sp['attention_share_dualkv']:.1%}",
        f"predicted compute speedup {sp['flop_ratio']:.2f}x  (bounds: {sp['lower']:.2f} .. {sp['upper']:.2f} = "
        "min/max of rho and attention ratio)",
        "",
        f"kernel memory saved per layer  {mem['kernel_savings_per_layer_bytes'] / 1e6:,.0f} MB   "
        f"all layers {mem['kernel_savings_all_layers_bytes'] / 2**30:,.2f} GiB",
        f"checkpointed activations       N-copy {mem['checkpoint_activation_bytes_std'] / 2**30:,.2f} GiB   "
        f"dualkv {mem['checkpoint_activation_bytes_dualkv'] / 2**30:,.2f} GiB   (ratio rho)",
    ]
    if "micro_batch" in rep:
        m = rep["micro_batch"]
        lines += ["", f"micro-batches of {m['mb']} rows: {m['micro_batches_per_group']} per group, rho = {m['rho']:.2f}, "
                      f"first: {m['tokens_std_first']:,} -> {m['tokens_dualkv_first']:,} tokens, "
                      f"FLOP ratio {m['flop_ratio_first']:.2f}"]
    if "law" in mem:
        law = mem["law"]
        lines.append(f"peak memory ({law['source']}): dualkv {law['dualkv']:.1f} {law['unit']}, "
                     f"N-copy projection {law['fa2_projection']:.1f} {law['unit']}")
    if "mfu" in rep:
        u = rep["mfu"]
        lines.append(f"MFU in {u['seconds']:g} s on {u['num_gpus']} x {u['gpu']}: {u['dualkv_flops']:.1%} of peak "
                     f"(dualkv FLOPs); {u['ncopy_equivalent']:.1%} counting the N-copy FLOPs of the same rows")
    return "\n".join(lines)
