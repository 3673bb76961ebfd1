"""The kernel benchmark's harness (timing, modes, result files, agreement check) on the CPU with the reference."""

import json
import re

import torch

from dualkv import GroupLayout
from dualkv.bench import kernel as kb


def test_bench_shape_on_cpu_writes_rows(tmp_path):
    rows = kb.bench_shape(2, 64, 16, ["reference"], heads=2, kv_heads=1, head_dim=32, dtype=torch.float32,
                          modes=kb.MODES, reps=2, device="cpu")
    assert [r.mode for r in rows] == list(kb.MODES)
    assert all(r.status == "ok" and r.ms > 0 for r in rows)
    path = kb.write_results(rows, tmp_path / "k.json")
    data = json.loads(path.read_text())
    assert data["benchmark"] == "kernel" and len(data["rows"]) == 3
    assert "ms" in kb.format_rows(rows)


def test_agreement_check_catches_a_wrong_system(monkeypatch):
    layout = GroupLayout.from_lengths([40], [[9, 17]])
    ok = kb.check_systems_agree(["reference"], heads=2, kv_heads=1, head_dim=32, dtype=torch.float64, device="cpu",
                                layout=layout, reference="reference")
    assert ok == {"reference": [0.0, 0.0, 0.0, 0.0]}

    class Wrong(kb.SYSTEMS["reference"]):
        def forward(self, train=False):
            return super().forward(train) * 1.01

    monkeypatch.setitem(kb.SYSTEMS, "wrong", Wrong)
    res = kb.check_systems_agree(["reference", "wrong"], heads=2, kv_heads=1, head_dim=32, dtype=torch.float64,
                                 device="cpu", layout=layout, reference="reference")
    assert res["wrong"][0] > 1e-3
    # without the named reference among the systems, the first one is the reference (it was a KeyError)
    res = kb.check_systems_agree(["wrong", "reference"], heads=2, kv_heads=1, head_dim=32, dtype=torch.float64,
                                 device="cpu", layout=layout)
    assert res["wrong"] == [0.0, 0.0, 0.0, 0.0] and res["reference"][0] > 1e-3


def test_varying_layouts_all_differ():
    layouts = kb.varying_layouts(20, seed=0)
    shapes = {(l.prompt_lens, l.response_lens) for l in layouts}
    assert len(shapes) == 20


def test_cudnn_systems_compose_exactly_on_cpu():
    """The cuDNN systems' plumbing (padded N-copy batch, per-group cascade) with plain-math parts in float64."""
    layout = GroupLayout.from_lengths([13, 5], [[9, 17, 1], [4]])
    res = kb.check_systems_agree(["reference", "cudnn_cascade", "cudnn_ncopy"], heads=4, kv_heads=2, head_dim=16,
                                 dtype=torch.float64, device="cpu", layout=layout, reference="reference")
    assert all(err < 1e-10 for name in ("cudnn_cascade", "cudnn_ncopy") for err in res[name]), res


def test_bench_shape_builds_multi_group_micro_batches(tmp_path):
    """``groups`` packs that many (P, N x R) groups into one micro-batch; its rows say so, and the single-group
    readers (plots, RESULTS tables) leave them out."""
    from dualkv.bench.plot import latest_kernel_rows

    rows = kb.bench_shape(2, 48, 16, ["reference"], heads=2, kv_heads=1, head_dim=32, dtype=torch.float32,
                          modes=("fwd",), reps=2, device="cpu", groups=3)
    assert [(r.groups, r.status) for r in rows] == [(3, "ok")]
    assert " 3 " in kb.format_rows(rows).splitlines()[1]
    single = kb.bench_shape(2, 48, 16, ["reference"], heads=2, kv_heads=1, head_dim=32, dtype=torch.float32,
                            modes=("fwd",), reps=2, device="cpu")
    paths = [kb.write_results(single, tmp_path / "a.json"), kb.write_results(rows, tmp_path / "b.json")]
    shape = {"heads": 2, "kv_heads": 1, "head_dim": 32}
    got, _ = latest_kernel_rows(paths, **shape)
    assert [r["groups"] for r in got] == [1]
    assert [r["groups"] for r in latest_kernel_rows(paths, groups=3, **shape)[0]] == [3]
    assert latest_kernel_rows(paths)[0] == []  # not Qwen3-8B's attention shape: no Table 1 rows


def test_ragged_responses_are_seeded_and_kept_out_of_table_1(tmp_path):
    """``r_range`` draws each response's length from LO..HI, the same micro-batch for every call with one seed; the
    rows carry the range and the mean as R, and the equal-length readers (Table 1, plots) leave them out."""
    import pytest

    from dualkv.bench.plot import latest_kernel_rows

    lens = kb.response_lens(5, 0, groups=3, r_range=(7, 40), seed=4)
    assert len(lens) == 3 and all(len(g) == 5 and all(7 <= r <= 40 for r in g) for g in lens)
    assert lens == kb.response_lens(5, 0, groups=3, r_range=(7, 40), seed=4)
    assert len({r for g in lens for r in g}) > 3  # not one length
    assert kb.response_lens(2, 16, groups=2) == [[16, 16], [16, 16]]
    with pytest.raises(ValueError, match="LO <= HI"):
        kb.response_lens(2, 16, r_range=(9, 3))
    assert kb.parse_r_range("64:512") == (64, 512) and kb.parse_r_range(None) is None
    for bad in ("64", "a:b", "0:5", "9:3"):
        with pytest.raises(SystemExit, match="--R-range"):
            kb.parse_r_range(bad)

    rows = kb.bench_shape(3, 40, 16, ["reference"], heads=2, kv_heads=1, head_dim=32, dtype=torch.float32,
                          modes=("fwd",), reps=2, device="cpu", groups=2, r_range=(5, 30))
    want_R = round(sum(map(sum, kb.response_lens(3, 16, 2, (5, 30), 0))) / 6)
    assert [(r.r_range, r.R, r.status) for r in rows] == [("5-30", want_R, "ok")]
    assert " 5-30 " in kb.format_rows(rows).splitlines()[1]  # the printed table names the range
    single = kb.bench_shape(3, 40, 16, ["reference"], heads=2, kv_heads=1, head_dim=32, dtype=torch.float32,
                            modes=("fwd",), reps=2, device="cpu", r_range=(5, 30))
    paths = [kb.write_results(single, tmp_path / "a.json")]
    shape = {"heads": 2, "kv_heads": 1, "head_dim": 32}
    assert latest_kernel_rows(paths, **shape)[0] == []
    assert [r["r_range"] for r in latest_kernel_rows(paths, r_range="5-30", **shape)[0]] == ["5-30"]


def test_bench_kernel_refuses_fewer_than_one_group(monkeypatch):
    import argparse

    import pytest

    parser = argparse.ArgumentParser()
    kb.add_arguments(parser)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit, match="--groups must be at least 1"):
        kb.run(parser.parse_args(["--groups", "0", "--systems", "reference"]))


def test_default_attention_shape_is_qwen3_8bs_everywhere(tmp_path, monkeypatch):
    """The kernel benchmark's default shape (BenchRow fields, bench_shape / bench_varying / CLI defaults, the plot
    readers', analysis.compare's) is Qwen3-8B's (32, 8, 128), and only another shape tags the result file name."""
    import argparse
    import inspect

    from dualkv.analysis import compare
    from dualkv.bench import plot

    qwen = {"heads": 32, "kv_heads": 8, "head_dim": 128}

    def defaults(fn):
        return {k: p.default for k, p in inspect.signature(fn).parameters.items() if k in qwen}
    row = kb.BenchRow("dualkv", 2, 64, 16, "fwd", 1.0, None, None, None, "ok")
    assert {k: getattr(row, k) for k in qwen} == qwen
    assert defaults(kb.bench_shape) == defaults(kb.bench_varying) == defaults(plot.latest_kernel_rows) == qwen
    assert defaults(compare) == {"heads": 32, "head_dim": 128}
    assert plot._ROW_DEFAULTS == {"groups": 1, "r_range": None, **qwen}

    calls = []

    def fake_bench_shape(n, p, r, systems, **kw):
        calls.append({k: kw[k] for k in qwen})
        return [kb.BenchRow(systems[0], n, p, r, "fwd", 1.0, None, None, None, "ok",
                            **{k: kw[k] for k in qwen})]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kb, "bench_shape", fake_bench_shape)
    agreed = []
    monkeypatch.setattr(kb, "check_systems_agree", lambda systems, **kw: agreed.append(kw) or {})
    monkeypatch.setattr(kb, "environment", lambda device: {"gpu": "none"})   # is_available lies: no CUDA queries
    parser = argparse.ArgumentParser()
    kb.add_arguments(parser)
    common = ["--systems", "reference", "--shapes", "2:64", "--mode", "fwd"]
    for extra, shape, tag in (([], qwen, None), (["--kv-heads", "4"], {**qwen, "kv_heads": 4}, "h32-4-d128"),
                              (["--heads", "8", "--kv-heads", "8", "--head-dim", "64"],
                               {"heads": 8, "kv_heads": 8, "head_dim": 64}, "h8-8-d64")):
        out = tmp_path / (tag or "default")
        assert kb.run(parser.parse_args([*common, *extra, "--out", str(out)])) == 0
        (path,) = out.iterdir()
        assert calls.pop() == shape
        # the agreement check runs the timed head dim and GQA ratio (at a small head count)
        check = agreed.pop()
        assert check["head_dim"] == shape["head_dim"]
        assert check["heads"] // check["kv_heads"] == shape["heads"] // shape["kv_heads"]
        assert re.fullmatch(rf"kernel-{tag + '-' if tag else ''}\d{{8}}-\d{{6}}\.json", path.name), path.name
        assert {k: json.loads(path.read_text())["rows"][0][k] for k in qwen} == shape


def test_bench_kernel_cli_passes_the_response_range(tmp_path, monkeypatch):
    """``--R-range LO:HI`` reaches every shape's benchmark and tags the result file; a malformed one is refused."""
    import argparse

    import pytest

    seen = []

    def fake_bench_shape(n, p, r, systems, **kw):
        seen.append(kw["r_range"])
        return [kb.BenchRow(systems[0], n, p, r, "fwd", 1.0, None, None, None, "ok")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kb, "bench_shape", fake_bench_shape)
    monkeypatch.setattr(kb, "check_systems_agree", lambda systems, **kw: {})
    monkeypatch.setattr(kb, "environment", lambda device: {"gpu": "none"})
    parser = argparse.ArgumentParser()
    kb.add_arguments(parser)
    args = ["--systems", "reference", "--shapes", "2:64,4:32", "--mode", "fwd", "--out", str(tmp_path)]
    assert kb.run(parser.parse_args([*args, "--R-range", "128:4096"])) == 0
    assert seen == [(128, 4096), (128, 4096)]
    (path,) = tmp_path.iterdir()
    assert re.fullmatch(r"kernel-R128-4096-\d{8}-\d{6}\.json", path.name), path.name
    with pytest.raises(SystemExit, match="--R-range"):
        kb.run(parser.parse_args([*args, "--R-range", "4096:128"]))


def test_bench_kernel_refuses_malformed_arguments_by_name(monkeypatch):
    """A malformed --shapes / --mode / --systems / --reps / --R is refused with a message naming the argument before
    anything is timed (it was a traceback from int() or unpacking, an unknown mode's ValueError after the first
    system had been timed, an empty system list's IndexError, a duplicated system timed twice)."""
    import argparse

    import pytest

    ran = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kb, "bench_shape", lambda *a, **kw: ran.append(a) or [])
    monkeypatch.setattr(kb, "check_systems_agree", lambda systems, **kw: {})
    monkeypatch.setattr(kb, "environment", lambda device: {"gpu": "none"})
    parser = argparse.ArgumentParser()
    kb.add_arguments(parser)
    good = {"--shapes": "2:64", "--mode": "fwd", "--systems": "reference"}
    for option, value, match in (("--shapes", "28", "--shapes"), ("--shapes", "a:b", "--shapes"),
                                 ("--shapes", "2:64:1", "--shapes"), ("--shapes", "0:64", "--shapes"),
                                 ("--shapes", "2:0", "--shapes"), ("--mode", "fwd,forward", "--mode"),
                                 ("--mode", "", "--mode"), ("--systems", "reference,reference", "--systems"),
                                 ("--systems", "", "--systems"), ("--systems", "nope", "unknown system"),
                                 ("--reps", "0", "--reps"), ("--R", "0", "--R")):
        argv = [x for k, v in {**good, option: value}.items() for x in (k, v)]
        with pytest.raises(SystemExit, match=match):
            kb.run(parser.parse_args(argv))
    assert ran == []


def test_bench_shape_records_allocation_failures_as_oom(monkeypatch):
    """cuDNN / cuBLAS / compiled kernels report running out of memory as a RuntimeError, not torch.OutOfMemoryError:
    such a row is OOM (as in the layer benchmark's harness), the other systems still run; other errors still raise."""
    import pytest

    class CudnnOOM(kb.SYSTEMS["reference"]):
        def forward(self, train=False):
            raise RuntimeError("cuDNN Frontend error: CUDNN_STATUS_ALLOC_FAILED")

    class PrepareOOM(kb.SYSTEMS["reference"]):
        def prepare(self):
            raise RuntimeError("Triton Error [CUDA]: out of memory")

    class Broken(kb.SYSTEMS["reference"]):
        def forward(self, train=False):
            raise RuntimeError("bad wiring")

    for name, cls in (("cudnn_oom", CudnnOOM), ("prepare_oom", PrepareOOM), ("broken", Broken)):
        monkeypatch.setitem(kb.SYSTEMS, name, cls)
    shape = {"heads": 2, "kv_heads": 1, "head_dim": 32, "dtype": torch.float32, "reps": 1, "device": "cpu"}
    rows = kb.bench_shape(2, 24, 8, ["cudnn_oom", "prepare_oom", "reference"], modes=("fwd", "bwd"), **shape)
    assert [(r.system, r.mode, r.status) for r in rows] == [
        ("cudnn_oom", "fwd", "OOM"), ("cudnn_oom", "bwd", "OOM"), ("prepare_oom", "fwd", "OOM"),
        ("prepare_oom", "bwd", "OOM"), ("reference", "fwd", "ok"), ("reference", "bwd", "ok")]
    with pytest.raises(RuntimeError, match="bad wiring"):
        kb.bench_shape(2, 24, 8, ["broken"], modes=("fwd",), **shape)
