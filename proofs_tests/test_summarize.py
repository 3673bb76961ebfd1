"""``experiments/summarize.py`` (the README's GPU tables) runs over the committed result files and derives each
system's own-FLOP MFU for policy-update files written before the ``mfu_useful`` field existed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

ROOT = Path(__file__).resolve().parents[1]


def test_summarize_prints_policy_update_mfu_within_100_percent():
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "summarize.py")], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"^\| (\d+) \| (\w+) \| [\d.]+ \([\d.]+, (\d+)%\) \| [\d.]+ \([\d.]+, (\d+)%\) \| ([\d.]+)x \|$",
                      proc.stdout, re.MULTILINE)
    assert any(n == "32" and phase == "update_actor" for n, phase, *_ in rows), proc.stdout[-3000:]
    for _, _, stock_mfu, dualkv_mfu, _ in rows:
        assert 0 < int(stock_mfu) <= 100 and 0 < int(dualkv_mfu) <= 100
