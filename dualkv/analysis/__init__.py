"""Analytical models of dualkv: token counts and rho, attention pairs and FLOPs, whole-model FLOPs, memory, and
readers that put benchmark measurements next to the predictions.

Plain functions over numbers (numpy where useful); a packed micro-batch is always described by
:class:`dualkv.layout.GroupLayout`. Modules: :mod:`.tokens` (T_std, T_dk, rho), :mod:`.pairs` (q·k pairs,
attention FLOPs, attention speedup), :mod:`.models` (model configs, whole-model FLOPs, MFU),
:mod:`.trees` (prefix trees: rho generalised, the issue #14 workloads), :mod:`.memory` (kernel savings, memory
law), :mod:`.results` (result files), :mod:`.report` (``dualkv model``),
:mod:`.plots` (figures; imports matplotlib, so it is not imported here).
"""

from .memory import (PAPER_LLAMA31_8B_LAW, MemoryLaw, activation_memory, checkpoint_bytes_per_token,
                     fit_memory_law, kernel_memory_savings, memory_rows, model_kernel_memory_savings,
                     read_memory_rows)
from .models import (PEAK_BF16_FLOPS, QWEN3_8B_ATTENTION, AttentionShape, LayerSpec, ModelConfig, amdahl,
                     available_models, linear_flops_per_token, load_model, mfu, model_flops, step_speedup_bounds)
from .pairs import (MODE_FACTOR, attention_flops, attn_speedup_pairs, attn_speedup_theory, causal_row_pairs,
                    n_copy_pairs, pairs_dualkv, pairs_ncopy, useful_pairs)
from .report import format_report, model_report
from .results import ResultRow, compare, default_results_dir, format_table, load_results, read_result_file, row_layout
from .trees import (WORKLOADS, branching_workload, format_workload_table, multi_turn_workload,
                    system_prompt_workload, tree_attn_ratio, tree_n_copy_pairs, tree_rho, tree_tokens_ncopy,
                    tree_useful_pairs, two_level_counts, workload_table)
from .tokens import (group_layout, micro_batch_layouts, rho, rho_equal, rho_layout, rho_limit_long_prompt,
                     rho_limit_many_responses, rho_micro_batched, tokens_dualkv, tokens_std)

__all__ = [
    "PAPER_LLAMA31_8B_LAW", "MemoryLaw", "activation_memory", "checkpoint_bytes_per_token", "fit_memory_law",
    "kernel_memory_savings", "memory_rows", "model_kernel_memory_savings", "read_memory_rows",
    "PEAK_BF16_FLOPS", "QWEN3_8B_ATTENTION", "AttentionShape", "LayerSpec", "ModelConfig", "amdahl",
    "available_models", "linear_flops_per_token", "load_model", "mfu", "model_flops", "step_speedup_bounds",
    "MODE_FACTOR", "attention_flops", "attn_speedup_pairs", "attn_speedup_theory", "causal_row_pairs",
    "n_copy_pairs", "pairs_dualkv", "pairs_ncopy", "useful_pairs",
    "format_report", "model_report",
    "ResultRow", "compare", "default_results_dir", "format_table", "load_results", "read_result_file", "row_layout",
    "group_layout", "micro_batch_layouts", "rho", "rho_equal", "rho_layout", "rho_limit_long_prompt",
    "rho_limit_many_responses", "rho_micro_batched", "tokens_dualkv", "tokens_std",
    "WORKLOADS", "branching_workload", "format_workload_table", "multi_turn_workload", "system_prompt_workload",
    "tree_attn_ratio", "tree_n_copy_pairs", "tree_rho", "tree_tokens_ncopy", "tree_useful_pairs", "two_level_counts",
    "workload_table",
]
