"""Leaving a ``torch.distributed`` worker process once its work is written."""

from __future__ import annotations

import os
import sys


def exit_without_finalizers(code: int) -> None:
    """End this process now with ``code``, skipping interpreter finalisation and C++ static destructors.

    After ``destroy_process_group`` a gloo worker thread can still be joinable when the interpreter finalises; its
    destructor then calls ``std::terminate`` ("terminate called without an active exception", SIGABRT) and torchrun
    reports a failed rank although the rank's work and result files are complete (seen in CI). Call this only once
    everything the process produces is written and closed, and after the ranks have met at a barrier.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
