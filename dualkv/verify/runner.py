"""``dualkv verify``: the numerical-equivalence report on whatever hardware is present.

Runs the fixed matrix of :mod:`dualkv.verify.cases` on every available backend — the reference on the CPU
(float64, float32), and on a GPU the CUDA kernels (bf16, fp16) once they are built, and there also the run-to-run
repeat checks of the deterministic backward — plus the whole-model checks and the negative controls (known-wrong
variants that must be caught).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import torch
from tqdm.auto import tqdm

from .. import shared_prefix_attention
from ..cuda.configs import ATOMIC_HEAD_DIMS
from ..dispatch import backend_name, kernels_unavailable_reason
from . import mutants
from .cases import attention_cases, model_cases
from .checks import AttentionCase, Row, shared_prefix_check, two_call_check
from .model_checks import model_check
from .repeat_checks import attention_repeat_check, head_repeat_check, repeat_cases
from .report import JsonTargetError, format_table, json_target_problem, summary, write_json


@dataclass
class Task:
    label: str
    run: Callable[[], list[Row]]


def _control(name: str, rows: list[Row]) -> list[Row]:
    """A negative control passes when the mutant FAILS at least one quantity."""
    failing = [r for r in rows if not r.passed]
    worst = max(rows, key=lambda r: r.error / r.bound if r.bound else float("inf"))
    shown = failing[0] if failing else worst
    return [Row(f"control:{name}", rows[0].config, f"caught via {shown.quantity}" if failing else "NOT caught",
                rows[0].backend, rows[0].dtype, shown.error, shown.bound, shown.metric, bool(failing),
                note="known-wrong variant; must fail the check")]


def build_tasks(quick: bool = False) -> list[Task]:
    tasks: list[Task] = []
    cases = attention_cases(quick)
    single = [c for c in cases if len(c.prompt_lens) == 1]
    # Reference on the CPU: float64 (exactness) and float32.
    for case in cases:
        tasks.append(Task(f"shared_prefix fp64 {case.name}", lambda c=case: shared_prefix_check(
            c, dtype=torch.float64, backend="reference")))
    for case in single:
        tasks.append(Task(f"two_call fp64 {case.name}", lambda c=case: two_call_check(
            c, dtype=torch.float64, backend="reference")))
    for case in cases[:4]:
        tasks.append(Task(f"shared_prefix fp32 {case.name}", lambda c=case: shared_prefix_check(
            c, dtype=torch.float32, backend="reference")))
    # GPU backends.
    if gpu_rows_missing() is None:
        for dtype in (torch.bfloat16, torch.float16):
            for case in cases:
                tasks.append(Task(f"shared_prefix cuda {dtype} {case.name}", lambda c=case, dt=dtype:
                                  shared_prefix_check(c, dtype=dt, device="cuda", backend=_gpu_backend(dt))))
            for case in single:
                tasks.append(Task(f"two_call cuda {dtype} {case.name}", lambda c=case, dt=dtype:
                                  two_call_check(c, dtype=dt, device="cuda", backend=_gpu_backend(dt))))
            # deterministic=False routes elsewhere (Hopper: the hybrid path; mma.sync kernels: the atomic dQ) at the
            # head dims that have such a path
            for case in (c for c in cases if c.head_dim <= NON_DETERMINISTIC_MAX_HEAD_DIM):
                tasks.append(Task(f"shared_prefix cuda {dtype} deterministic=False {case.name}",
                                  lambda c=case, dt=dtype: shared_prefix_check(
                                      c, dtype=dt, device="cuda", backend=_gpu_backend(dt),
                                      attention_fn=_non_deterministic, check="shared_prefix deterministic=False")))
        # Run-to-run reproducibility of the deterministic default (bit-identical backward), and the known-wrong head
        # it must catch: ~16K gathers of one row, whose atomic sum lands in another order on some run.
        for case in repeat_cases(cases):
            tasks.append(Task(f"repeat cuda bf16 {case.name}", lambda c=case: attention_repeat_check(
                c, dtype=torch.bfloat16, backend=_gpu_backend(torch.bfloat16))))
        tasks.append(Task("repeat cuda log-prob head", head_repeat_check))
        tasks.append(Task("control atomic_gather_head", lambda: _control("atomic_gather_head", head_repeat_check(
            groups=1, responses=1 << 14, response_len=1, head=mutants.atomic_gather_head,
            check="control:atomic_gather_head"))))
    # Whole models.
    for arch, prompts, responses, ckpt in model_cases(quick):
        tasks.append(Task(f"model {arch} fp64", lambda a=arch, p=prompts, r=responses, ck=ckpt: model_check(
            a, p, r, dtype=torch.float64, gradient_checkpointing=ck, backend="reference")))
    arch, prompts, responses, _ = model_cases()[0]
    tasks.append(Task(f"model {arch} fp32", lambda: model_check(arch, prompts, responses, dtype=torch.float32,
                                                               backend="reference")))
    # Negative controls.
    # Shapes where each mutant is observable (a shifted mask needs a response of >= 2 tokens).
    control_cases = [c for c in cases if max(max(r) for r in c.response_lens) >= 2][:2]
    for name, fn in mutants.ATTENTION_MUTANTS.items():
        for case in control_cases:
            tasks.append(Task(f"control {name} {case.name}", lambda n=name, f=fn, c=case: _control(
                n, shared_prefix_check(c, attention_fn=f, backend="reference", check=f"control:{n}"))))
    tasks.append(Task("control no_context_grad_call2", lambda: _control("no_context_grad_call2", two_call_check(
        cases[0], call2=mutants.no_context_grad_call2, backend="reference"))))
    tasks.append(Task("control own_row_first_token", lambda: _control("own_row_first_token", model_check(
        arch, prompts, responses, predictor_fn=mutants.own_row_first_token, backend="reference"))))
    return tasks


#: Head dims up to which ``deterministic=False`` has its own paths (above it the deterministic kernels serve and warn):
#: the atomic dQ mode's.
NON_DETERMINISTIC_MAX_HEAD_DIM = max(ATOMIC_HEAD_DIMS)


def gpu_rows_missing() -> str | None:
    """Why this machine's report has no CUDA rows (no CUDA device, or the kernels cannot run on it: e.g. a GPU below
    sm_80, or cuda-python / NVRTC missing); None when it has them."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    reason = kernels_unavailable_reason()
    return None if reason is None else f"a CUDA device, but the kernels cannot run on it: {reason}"


def _non_deterministic(*args, **kwargs):
    """``dualkv.shared_prefix_attention`` with ``deterministic=False``."""
    return shared_prefix_attention(*args, deterministic=False, **kwargs)


def _gpu_backend(dtype: torch.dtype) -> str:
    return backend_name(torch.empty(0, device="cuda", dtype=dtype))


def run_verify(*, quick: bool = False, json_path: str | None = None, progress: bool = True,
               stream=None) -> tuple[list[Row], bool]:
    """Run every task, print the table, optionally write JSON; returns (rows, all_passed)."""
    stream = sys.stdout if stream is None else stream
    problem = json_target_problem(json_path) if json_path else None
    if problem:
        raise JsonTargetError(problem)
    rows: list[Row] = []
    tasks = build_tasks(quick)
    bar = tqdm(tasks, desc="dualkv verify", unit="check", disable=not progress, file=sys.stderr)
    for task in bar:
        bar.set_postfix_str(task.label[:60])
        rows.extend(task.run())
    print(format_table(rows), file=stream)
    stats = summary(rows)
    ok = stats["failed"] == 0
    print(f"\n{stats['passed']}/{stats['rows']} rows passed" + ("" if ok else f", {stats['failed']} FAILED"),
          file=stream)
    missing = gpu_rows_missing()
    if missing:
        print(f"CUDA rows: none ({missing}); only the reference was checked", file=stream)
    if json_path:
        write_json(json_path, rows, {"cuda_rows": {"run": missing is None, "reason": missing}})
        print(f"rows written to {json_path}", file=stream)
    return rows, ok
