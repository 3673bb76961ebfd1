"""experiments/gpu/bench_table.py: a short table of `dualkv bench kernel` result files (one line per micro-batch and
system, ms by mode, fwd+bwd over the file's first system), read from written rows."""

from __future__ import annotations

import json

from experiment_scripts import load_script


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": {}, "benchmark": "kernel", "rows": rows}))


def _row(system, mode, ms, **extra):
    return {"system": system, "N": 8, "P": 512, "R": 2432, "mode": mode, "ms": ms, "groups": 4,
            "r_range": "256-4096", **extra}


def test_table_lists_each_system_with_its_ratio_to_the_first(tmp_path, capsys):
    table = load_script("experiments/gpu/bench_table.py", "bench_table")
    _write(tmp_path / "g4" / "kernel-groups4-x.json",
           [_row("dualkv", "bwd", 10.0), _row("dualkv", "fwdbwd", 12.0),
            _row("cascade", "bwd", 20.0), _row("cascade", "fwdbwd", 30.0),
            _row("dualkv", "fwdbwd", 4.0, groups=1, r_range=None, R=2048, P=1024, N=16)])
    entries = table.summarize(table.result_files([str(tmp_path)]))
    by = {(e["batch"], e["system"]): e for e in entries}
    ragged = "4 x (8, 512), R 256-4096 (mean 2432)"
    assert by[(ragged, "cascade")]["x_first"] == 2.5 and by[(ragged, "dualkv")]["x_first"] == 1.0
    assert by[(ragged, "cascade")]["bwd"] == 20.0
    assert by[("(16, 1024), R 2048", "dualkv")]["fwdbwd"] == 4.0  # another micro-batch: its own first system
    assert table.main([str(tmp_path), "--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "cascade" in out and "2.50" in out
    assert len(json.loads((tmp_path / "t.json").read_text())) == 3
    assert table.main([str(tmp_path / "missing")]) == 1
    (tmp_path / "empty").mkdir()
    assert table.main([str(tmp_path / "empty")]) == 1
