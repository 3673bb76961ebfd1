"""Rule reward for ``build_longprompt_dataset.py``: 1.0 when the last ``\\boxed{N}`` (else the last integer) of the
response equals the ground truth, else 0.0. veRL: ``reward.custom_reward_function.path=experiments/verl/reward.py``
and ``reward.custom_reward_function.name=compute_score``."""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")
_INT = re.compile(r"-?\d+")


def extract_answer(text: str) -> str | None:
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1]
    ints = _INT.findall(text)
    return ints[-1] if ints else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    answer = extract_answer(solution_str or "")
    return 1.0 if answer is not None and answer.lstrip("+") == str(ground_truth).strip() else 0.0
