"""The benchmark code on a CPU (not timings): every system computes the same layer and the same model step as
dualkv (so the GPU numbers compare like with like), known-wrong variants of each baseline are caught, the CLI's
tiny smoke runs write the JSON schema and a plot, OOM/error/time-budget rows, and the bench-kind registry."""

import argparse
import json

import pytest
import torch

from dualkv.bench import BENCHES, register_bench
from dualkv.bench.harness import RunRecorder, sample_response_lens, sweep_configs, synthetic_packed
from dualkv.bench.layer import layer_forward
from dualkv.bench.model import model_logprobs, use_system
from dualkv.bench.qwen3 import build_layer, build_model, qwen3_config
from dualkv.bench.systems import SYSTEMS, build_batch, flex_mask, register_attention
from dualkv.cli import build_parser, main
from dualkv.testing import fp64_clean_norms, rel_err

PROMPT, RESPONSES = 11, [3, 1, 6]


@pytest.fixture(scope="module")
def tiny():
    register_attention()
    config = qwen3_config("tiny", max_positions=64)
    packed = synthetic_packed(PROMPT, RESPONSES, config.vocab_size, 0)
    return config, packed


def _layer_run(config, packed, system, mutate=None, **batch_kwargs):
    """Layer output in packed order and the parameter grads of a loss over response tokens only."""
    layer, rotary = build_layer(config, torch.device("cpu"), torch.float64, seed=0)
    fp64_clean_norms(layer)
    batch = build_batch(system, packed, "cpu", **batch_kwargs)
    if mutate is not None:
        mutate(batch.forward_kwargs)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(packed.layout.total_tokens, config.hidden_size, generator=gen, dtype=torch.float64)
    g = torch.randn(packed.layout.total_tokens, config.hidden_size, generator=gen, dtype=torch.float64)
    g[:PROMPT] = 0
    hidden = x[batch.gather].view(*batch.grid, -1).requires_grad_()
    out = layer_forward(layer, rotary, batch, hidden).reshape(-1, config.hidden_size)[batch.to_packed]
    grads = torch.autograd.grad((out * g).sum(), list(layer.parameters()))
    return out, grads


@pytest.mark.parametrize("system", [s for s in SYSTEMS if s != "dualkv"])
def test_layer_systems_compute_the_same(tiny, system):
    config, packed = tiny
    ref_out, ref_grads = _layer_run(config, packed, "dualkv")
    out, grads = _layer_run(config, packed, system)
    assert rel_err(out, ref_out) < 1e-12
    assert max(rel_err(a, b) for a, b in zip(grads, ref_grads)) < 1e-12


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_forward_through_flex_attention(tiny):
    """Without grad the CPU flex path runs flex_attention itself (with the BlockMask)."""
    config, packed = tiny
    with torch.no_grad():
        ref = _layer_run_nograd(config, packed, "dualkv")
        out = _layer_run_nograd(config, packed, "flex")
    assert rel_err(out, ref) < 1e-12


def _layer_run_nograd(config, packed, system):
    layer, rotary = build_layer(config, torch.device("cpu"), torch.float64, seed=0)
    fp64_clean_norms(layer)
    batch = build_batch(system, packed, "cpu")
    x = torch.randn(packed.layout.total_tokens, config.hidden_size, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)
    return layer_forward(layer, rotary, batch, x[batch.gather].view(*batch.grid, -1)).reshape(
        -1, config.hidden_size)[batch.to_packed]


def test_wrong_flex_mask_is_caught(tiny):
    """Negative control: a plain causal mask over the packing (responses see each other) is caught."""
    config, packed = tiny
    ref_out, _ = _layer_run(config, packed, "dualkv")

    def causal_only(group, segment):
        return lambda b, h, q, kv: kv <= q

    wrong = lambda p, d: flex_mask(p, d, mask_mod_fn=causal_only)  # noqa: E731
    out, _ = _layer_run(config, packed, "flex", flex_mask_fn=wrong)
    assert rel_err(out, ref_out) > 1e-3


def test_block_mask_builder_compiles_once_on_cuda_and_stays_eager_elsewhere(monkeypatch):
    """FlexAttention's BlockMask: the eager create_block_mask for CPU tensors; on CUDA torch.compile of it (PyTorch's
    advice since the deprecated _compile flag: no dense O(T^2) mask), compiled once per process."""
    from torch.nn.attention.flex_attention import create_block_mask

    from dualkv.bench import systems

    compiled = []
    monkeypatch.setattr(systems, "_COMPILED_BLOCK_MASK", [])
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn) or ("compiled", fn))
    assert systems.block_mask_builder("cpu") is create_block_mask
    first = systems.block_mask_builder("cuda")
    assert first == ("compiled", create_block_mask) and systems.block_mask_builder(torch.device("cuda", 1)) is first
    assert compiled == [create_block_mask]


def _pg_prompt_one_too_long(kwargs):
    kwargs["bench_prompt_len"] += 1


def _ncopy_rows_merged(kwargs):
    cu = kwargs["bench_cu_seqlens"]
    kwargs["bench_cu_seqlens"], kwargs["bench_max_seqlen"] = cu[[0, -1]], int(cu[-1])


def _cudnn_ncopy_copies_merged(kwargs):
    rows = kwargs["bench_slot_of_row"]
    kwargs["bench_slot_of_row"], kwargs["bench_padded_grid"] = torch.arange(len(rows)), (1, len(rows))


def _cudnn_ncopy_slots_shifted(kwargs):
    seqs, width = kwargs["bench_padded_grid"]
    copy, pos = kwargs["bench_slot_of_row"] // width, kwargs["bench_slot_of_row"] % width
    kwargs["bench_slot_of_row"], kwargs["bench_padded_grid"] = copy * (width + 1) + 1 + pos, (seqs, width + 1)


@pytest.mark.parametrize("system,mutate", [("pg_padded", _pg_prompt_one_too_long), ("fa2_ncopy", _ncopy_rows_merged),
                                           ("cudnn_ncopy", _cudnn_ncopy_copies_merged),
                                           ("cudnn_ncopy", _cudnn_ncopy_slots_shifted)])
def test_wrong_baseline_wiring_is_caught(tiny, system, mutate):
    """Negative controls: PG taking the first response token into the prompt, N-copy rows merged into one sequence
    (FA2's cu_seqlens, or cuDNN's padded batch as one row), each copy padded at its start instead of its end (a zero
    key every causal query then sees)."""
    config, packed = tiny
    ref_out, _ = _layer_run(config, packed, "dualkv")
    out, _ = _layer_run(config, packed, system, mutate=mutate)
    assert rel_err(out, ref_out) > 1e-3


def test_model_systems_compute_the_same(tiny):
    config, packed = tiny
    model = fp64_clean_norms(build_model(config, torch.device("cpu"), torch.float64, seed=0))
    params = list(model.parameters())
    before = model.config._attn_implementation
    results = {}
    for system in SYSTEMS:
        batch = build_batch(system, packed, "cpu")
        with use_system(model, system):
            lp, ent = model_logprobs(model, packed, batch, chunk_size=4)
            grads = torch.autograd.grad(-lp.mean() - 1e-3 * ent.mean(), params)
        results[system] = (lp, ent, grads)
    lp0, ent0, g0 = results["dualkv"]
    for system, (lp, ent, grads) in results.items():
        assert rel_err(lp, lp0) < 1e-12 and rel_err(ent, ent0) < 1e-12, system
        assert max(rel_err(a, b) for a, b in zip(grads, g0)) < 1e-12, system
    assert model.config._attn_implementation == before   # every system switched back


@pytest.mark.parametrize("kind", ["layer", "model"])
def test_cli_tiny_smoke_writes_schema_and_plot(kind, tmp_path):
    argv = ["bench", kind, "--device", "cpu", "--tiny", "--P", "16", "--mb", "2", "--warmup", "0", "--reps", "1",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    (path,) = tmp_path.glob(f"{kind}-*.json")
    data = json.loads(path.read_text())
    assert data["benchmark"] == kind
    assert {"gpu", "date", "commit", "torch", "cuda"} <= set(data["environment"])
    assert [r["system"] for r in data["rows"]] == list(SYSTEMS)
    for row in data["rows"]:
        assert row["status"] == "ok", row
        assert row["P"] == 16 and row["mb"] == 2 and len(row["R_list"]) == 2 and row["ms"] > 0
        assert {"R_total", "peak_mem_gib", "tokens"} <= set(row)
        assert row["ms_min"] <= row["ms"] <= row["ms_max"] and row["ms_runs"] == [row["ms"]]
    assert path.with_suffix(".png").exists()


def test_rows_record_oom_errors_and_budget(tmp_path):
    rec = RunRecorder("unit", torch.device("cpu"), {}, str(tmp_path))

    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory")

    def broken():
        raise RuntimeError("bad\nwiring")

    def cublas():
        raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)")

    assert rec.run_row("a", 8, [2, 3], oom, warmup=0, reps=1)["status"] == "OOM"
    assert rec.run_row("a2", 8, [2, 3], cublas, warmup=0, reps=1)["status"] == "OOM"
    row = rec.run_row("b", 8, [2, 3], broken, warmup=0, reps=1)
    assert row["status"] == "error" and row["error"] == "RuntimeError: bad wiring"
    assert rec.run_row("c", 8, [2, 3], lambda: ((lambda: None), 10), warmup=1, reps=3)["status"] == "ok"
    rec.time_budget_s = 0.0
    assert rec.run_row("d", 8, [2, 3], lambda: ((lambda: None), 10), warmup=0, reps=1)["status"] == "skipped"
    assert [r["status"] for r in json.loads(rec.path.read_text())["rows"]] == ["OOM", "OOM", "error", "ok", "skipped"]


def test_sweep_helpers():
    assert sample_response_lens(8192, 8, 0, 131, 2048) == sample_response_lens(8192, 8, 0, 131, 2048)
    lens = sample_response_lens(8192, 32, 0, 131, 2048)
    assert len(lens) == 32 and min(lens) >= 131 and max(lens) <= 2048
    assert sweep_configs([1, 2], [4], [(2, 4), (9, 8)]) == [(1, 4), (2, 4), (9, 8)]
    with pytest.raises(ValueError, match="lo <= hi"):
        sample_response_lens(8, 2, 0, 5, 3)


def test_bench_registry_lets_other_modules_add_kinds():
    ran = []
    register_bench("unittest-kind", "a kind added by a test", lambda p: p.add_argument("--x", type=int),
                   lambda args: ran.append(args.x) or 0)
    try:
        assert main(["bench", "unittest-kind", "--x", "3"]) == 0 and ran == [3]
        with pytest.raises(ValueError, match="already registered"):
            register_bench("unittest-kind", "again", lambda p: None, lambda args: 0)
        assert {"layer", "model", "plot"} <= set(BENCHES)
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "no-such-kind"])
    finally:
        BENCHES.pop("unittest-kind")


def test_kernel_plot_merges_runs_and_refuses_other_files(tmp_path):
    """`dualkv bench plot` on kernel results: one figure over several files, a later file replacing an earlier
    one's rows; a layer file handed to the kernel plot is refused by name."""
    from dualkv.bench.plot import latest_kernel_rows, plot_kernel_results

    def row(system, n, p, mode, ms):
        return {"system": system, "N": n, "P": p, "R": 8, "mode": mode, "ms": ms, "tflops": 1.0 / ms,
                "speedup_vs_fa2": None, "peak_mem_gib": 0.1, "status": "ok"}

    env = {"gpu": "none", "date": "today"}
    first = tmp_path / "kernel-a.json"
    first.write_text(json.dumps({"environment": env, "benchmark": "kernel", "rows": [
        row(s, 2, 64, m, 3.0) for s in ("dualkv", "cascade") for m in ("fwd", "fwdbwd")]}))
    second = tmp_path / "kernel-b.json"
    second.write_text(json.dumps({"environment": env, "benchmark": "kernel", "rows": [
        row("dualkv", 2, 64, "fwdbwd", 1.0), row("dualkv", 4, 128, "fwdbwd", 2.0)]}))
    rows, _ = latest_kernel_rows([first, second])
    ms = {(r["system"], r["N"], r["mode"]): r["ms"] for r in rows}
    assert ms[("dualkv", 2, "fwdbwd")] == 1.0 and ms[("dualkv", 2, "fwd")] == 3.0 and len(rows) == 5
    assert main(["bench", "plot", str(first), str(second), "--out", str(tmp_path)]) == 0
    assert second.with_suffix(".png").exists() and not first.with_suffix(".png").exists()
    layer = tmp_path / "layer-x.json"
    layer.write_text(json.dumps({"environment": env, "benchmark": "layer", "rows": []}))
    with pytest.raises(ValueError, match="is not a `dualkv bench kernel` result"):
        plot_kernel_results([layer], tmp_path / "x.png")
    picked = tmp_path / "picked.png"
    assert main(["bench", "plot", str(first), str(second), "--systems", "cascade", "--out", str(picked)]) == 0
    assert picked.exists()
    with pytest.raises(ValueError, match=r"no rows for system\(s\) \['flex'\]"):
        plot_kernel_results([first, second], tmp_path / "y.png", ["dualkv", "flex"])
    with pytest.raises(SystemExit, match=r"dualkv bench plot: no rows for system\(s\) \['nosuch'\]"):
        main(["bench", "plot", str(first), "--systems", "dualkv,nosuch", "--out", str(tmp_path / "z.png")])


@pytest.mark.parametrize("extra, match", [
    (["--systems", "dualkv,dualkv"], "more than once"),     # was: both timed, then a TypeError in the plot
    (["--r-range", "9,3"], "--r-range"),                      # was: a ValueError traceback from the first row
    (["--reps", "0"], "--reps"),                              # was: every row an "error", exit status 0
    (["--warmup", "-1"], "--warmup"),
    (["--extra", "0x2"], "--extra"),                          # was: a traceback from packing an empty prompt
])
def test_sweep_arguments_are_refused_by_name(extra, match, tmp_path, capsys):
    argv = ["bench", "layer", "--device", "cpu", "--tiny", "--P", "16", "--mb", "2", "--out", str(tmp_path), *extra]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code != 0
    message = str(exc.value.code) + capsys.readouterr().err
    assert match in message, message
    assert not list(tmp_path.glob("*.json"))   # refused before anything ran


@pytest.mark.parametrize("kind", ["layer", "model"])
def test_sweep_without_a_gpu_needs_tiny_or_an_explicit_cpu(kind, tmp_path, monkeypatch):
    """Without a GPU and without --device, only --tiny runs (on the CPU): the full sweep there would take hours, and it
    used to start silently (found by a README walkthrough: `bench layer --reps 1` ran the Qwen3-8B sweep on the CPU)."""
    import dualkv.bench.layer
    import dualkv.bench.model

    def started(*args, **kwargs):
        raise AssertionError("the sweep started")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dualkv.bench.layer, "build_layer", started)
    monkeypatch.setattr(dualkv.bench.model, "build_model", started)
    with pytest.raises(SystemExit, match="--tiny") as exc:
        main(["bench", kind, "--reps", "1", "--warmup", "0", "--out", str(tmp_path)])
    assert "hours" in str(exc.value.code)
    for device in ("tpu", "meta"):
        with pytest.raises(SystemExit, match="--device"):
            main(["bench", kind, "--device", device, "--tiny", "--out", str(tmp_path)])
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("spelling", ["--r-range", "--R-range"])
@pytest.mark.parametrize("text", ["5:9", "5,9"])
def test_response_range_one_spelling_for_every_kind(spelling, text):
    """``--r-range`` / ``--R-range``, ``LO:HI`` / ``LO,HI``: the layer / model sweeps and bench kernel read the same."""
    from dualkv.bench import kernel as kb
    from dualkv.bench.cli import _add_arguments

    parser = argparse.ArgumentParser()
    _add_arguments(parser)
    layer = parser.parse_args(["layer", spelling, text])
    assert layer.r_range == [5, 9]
    kernel = parser.parse_args(["kernel", spelling, text])
    assert kb.parse_r_range(kernel.R_range) == (5, 9)
    for bad in ("9:3", "5", "5:9:12", "a:b", "0:4"):
        with pytest.raises(SystemExit):
            parser.parse_args(["layer", spelling, bad])
        with pytest.raises(SystemExit, match="--R-range"):
            kb.parse_r_range(bad)


def test_bench_plot_names_bad_files_and_systems(tmp_path):
    """Missing files, non-JSON files, JSON that is not a bench result and unknown --systems end in one line naming
    the problem (they were tracebacks)."""
    not_json = tmp_path / "notes.md"
    not_json.write_text("# not json\n")
    no_rows = tmp_path / "other.json"
    no_rows.write_text(json.dumps({"benchmark": "kernel"}))
    for files, match in (([str(tmp_path / "missing.json")], "cannot read"), ([str(not_json)], "is not JSON"),
                         ([str(no_rows)], "not a `dualkv bench` result")):
        with pytest.raises(SystemExit, match=match) as exc:
            main(["bench", "plot", *files, "--out", str(tmp_path)])
        assert str(exc.value.code).startswith("dualkv bench plot:")


def test_kernel_plot_draws_the_shape_its_files_hold(tmp_path):
    """A file of ragged multi-group rows (`bench kernel --groups 2 --r-range ...`) plots at its own shape (it ended in
    ZeroDivisionError: the figure looked for Table 1's single-group rows only, s38bench on an H200); files of several
    other shapes, and files without fwd+bwd rows, are refused by name."""
    from dualkv.bench.plot import kernel_file_shape

    def row(system, mode, ms, **shape):
        return {"system": system, "N": 8, "P": 1024, "R": 1100, "mode": mode, "ms": ms, "tflops": 100.0 / ms,
                "speedup_vs_fa2": None, "peak_mem_gib": 0.1, "status": "ok", **shape}

    env = {"gpu": "none", "date": "today"}
    ragged = {"groups": 2, "r_range": "256-2048", "heads": 32, "kv_heads": 8, "head_dim": 128}

    def write(name, rows):
        path = tmp_path / name
        path.write_text(json.dumps({"environment": env, "benchmark": "kernel", "rows": rows}))
        return str(path)

    one = write("kernel-ragged.json", [row(s, m, 2.0, **ragged) for s in ("dualkv", "cudnn_cascade")
                                       for m in ("fwd", "fwdbwd")])
    assert kernel_file_shape([one]) == ragged
    png = tmp_path / "ragged.png"
    assert main(["bench", "plot", one, "--out", str(png)]) == 0 and png.stat().st_size > 0
    other = write("kernel-d64.json", [row("dualkv", "fwdbwd", 1.0, **{**ragged, "head_dim": 64})])
    with pytest.raises(SystemExit, match="rows of 2 shapes"):
        main(["bench", "plot", one, other, "--out", str(tmp_path / "mixed.png")])
    no_fb = write("kernel-fwd-bwd.json", [row("dualkv", m, 2.0, **ragged) for m in ("fwd", "bwd")])
    with pytest.raises(SystemExit, match="no measured fwd\\+bwd rows"):
        main(["bench", "plot", no_fb, "--out", str(tmp_path / "nofb.png")])


def test_bench_plot_reads_each_file_once(tmp_path, monkeypatch):
    """`dualkv bench plot` reads every result file once and hands the data on (it read each kernel file up to four
    times: the argument check, the shape, the rows and the merge note)."""
    from pathlib import Path

    def row(system, n, mode, ms):
        return {"system": system, "N": n, "P": 64, "R": 8, "mode": mode, "ms": ms, "tflops": 1.0 / ms,
                "speedup_vs_fa2": None, "peak_mem_gib": 0.1, "status": "ok", "mb": n}

    env = {"gpu": "none", "date": "today", "commit": "abc"}
    files = []
    for name, rows, kind in (("kernel-a.json", [row("dualkv", 2, "fwdbwd", 1.0)], "kernel"),
                             ("kernel-b.json", [row("cascade", 2, "fwdbwd", 2.0)], "kernel"),
                             ("layer-c.json", [row("dualkv", 2, "fwdbwd", 1.0)], "layer")):
        path = tmp_path / name
        path.write_text(json.dumps({"environment": env, "benchmark": kind, "rows": rows}))
        files.append(str(path))
    reads: list[str] = []
    real = Path.read_text

    def counted(self, *args, **kwargs):
        reads.append(self.name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)
    assert main(["bench", "plot", *files, "--out", str(tmp_path / "figs")]) == 0
    assert sorted(reads) == ["kernel-a.json", "kernel-b.json", "layer-c.json"], reads
