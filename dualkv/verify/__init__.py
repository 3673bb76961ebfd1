"""Numerical-equivalence checks and the ``dualkv verify`` report."""

from .checks import AttentionCase, Row, shared_prefix_check, two_call_check
from .model_checks import model_check
from .runner import run_verify

__all__ = ["AttentionCase", "Row", "model_check", "run_verify", "shared_prefix_check", "two_call_check"]
