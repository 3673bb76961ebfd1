"""End-to-end GRPO with TRL 1.16's GRPOTrainer on one GPU: stock TRL vs dualkv (``apply_dualkv``), same seed.

Everything is real TRL: generation with ``transformers`` (``use_vllm=False``), rewards, advantages, the old/ref
log-probs and the policy update. The model is a Qwen3 with random weights built from a config, the tokenizer a
word-level one built offline ("t0 ... t{V-1}" plus <pad>/<eos>/<unk>), the data synthetic; nothing is downloaded.

Task ("target residue"): the reward of a completion is the fraction of its tokens whose id is a multiple of 8. A
random model starts near 1/8 and GRPO can push it towards 1 (a verifiable reward a random model can improve on).

Settings (``--settings``, default all three):

* ``curves`` — a small Qwen3, prompts of 8..48 tokens, N = 8, R <= 32, bf16 autocast over fp32 weights, many steps:
  reward and loss per step for both systems (overlaid in the plot);
* ``long`` — a larger Qwen3 (bf16 weights), one prompt of P >= 4K tokens per step, N = 16, R <= 128, beta > 0
  (a reference model): the training phases (ref log-probs, policy update) dominate;
* ``fp32`` — a tiny Qwen3 in float32 (dualkv runs its reference attention): the first steps' per-token log-probs,
  losses and gradients of the two systems compared (max relative difference; 1e-5 expected). Plain SGD: Adam's
  first step, lr * g / (|g| + eps), turns fp32 rounding of gradient entries near eps into lr-sized weight changes
  (seen: 1.7e-4 relative gradient differences from step 2 on with AdamW at lr 1e-3, 6e-7 at step 1).

Per step and system: reward, loss, and wall time (seconds, ``*_s``) split into ``generation`` (``_generate``),
``logprobs`` (the no-grad old/ref log-prob calls) and ``update`` (policy forward + backward + optimizer step: the
step minus input preparation); peak GPU memory per system. The result is one JSON file; the plot (if matplotlib is there) beside it;
a short table is printed last.

GPU (one H100/H200; see experiments/trl_grpo/README.md for the wheels to carry)::

    python experiments/trl_grpo/grpo_e2e.py --out $OUT

Redraw the plot of a result file (here, after the run)::

    python experiments/trl_grpo/grpo_e2e.py --plot experiments/results/trl_grpo-<gpu>-<time>.json

CPU smoke run (what the test suite runs; seconds)::

    python experiments/trl_grpo/grpo_e2e.py --tiny --out /tmp/trl_smoke
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

SYSTEMS = ("stock", "dualkv")
#: Stock-vs-stock controls for the ``curves`` setting (``--controls``): how far two stock runs drift apart, the
#: yardstick for "dualkv's curve agrees with stock's within bf16 noise". ``stock_eager`` is stock TRL with eager
#: attention (the same math, other bf16 rounding: what dualkv changes too); ``stock_seed1`` a stock run whose
#: trainer seed (sampling, data order) is one higher.
CONTROLS = {"stock_eager": {"attn_implementation": "eager"}, "stock_seed1": {"seed_offset": 1}}
TARGET_MODULUS = 8

#: Per setting: model config fields, data and trainer settings. ``tiny`` replaces them for the CPU smoke run.
SETTINGS: dict[str, dict[str, Any]] = {
    "curves": dict(vocab=512, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=64, intermediate_size=768, weights="float32", prompt_len=(8, 48), prompts=2048,
                   num_generations=8, per_device_train_batch_size=64, max_completion_length=32, steps=40,
                   learning_rate=1e-3, beta=0.0),
    "long": dict(vocab=32768, hidden_size=1536, num_hidden_layers=16, num_attention_heads=12, num_key_value_heads=4,
                 head_dim=128, intermediate_size=4608, weights="bfloat16", prompt_len=(4096, 4096), prompts=64,
                 num_generations=16, per_device_train_batch_size=16, max_completion_length=128, steps=4,
                 learning_rate=1e-5, beta=0.04),
    "fp32": dict(vocab=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, intermediate_size=128, weights="float32", autocast=False, prompt_len=(4, 24),
                 prompts=64, num_generations=4, per_device_train_batch_size=16, max_completion_length=16, steps=3,
                 learning_rate=1e-2, beta=0.04, optim="sgd", compare=True),
}
TINY = dict(vocab=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            intermediate_size=64, prompt_len=(3, 12), prompts=32, num_generations=4, per_device_train_batch_size=8,
            max_completion_length=8, steps=3)


def target_residue_reward(completions: list[str], **kwargs) -> list[float]:
    """Fraction of a completion's tokens "t<id>" with id % 8 == 0 (0 for an empty completion)."""
    out = []
    for text in completions:
        ids = [int(tok[1:]) for tok in text.split() if tok[:1] == "t" and tok[1:].isdigit()]
        out.append(sum(i % TARGET_MODULUS == 0 for i in ids) / len(ids) if ids else 0.0)
    return out


def build_model_dir(root: Path, cfg: dict, seed: int) -> str:
    """Save a word-level tokenizer over ``cfg['vocab']`` ids and a random Qwen3 of ``cfg``; returns the folder."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from proofs_tests.verl_fixtures.synthetic import save_tokenizer

    path = root / "model"
    tokenizer = save_tokenizer(path, cfg["vocab"])
    config = Qwen3Config(vocab_size=cfg["vocab"], hidden_size=cfg["hidden_size"],
                         num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
                         num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
                         intermediate_size=cfg["intermediate_size"], max_position_embeddings=8192,
                         tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None, attn_implementation="sdpa")
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).to(getattr(torch, cfg["weights"])).save_pretrained(str(path))
    return str(path)


def build_dataset(cfg: dict, seed: int):
    from datasets import Dataset

    gen = torch.Generator().manual_seed(seed)
    lo, hi = cfg["prompt_len"]
    lengths = torch.randint(lo, hi + 1, (cfg["prompts"],), generator=gen).tolist()
    first = 3   # ids below are <pad> <eos> <unk>
    return Dataset.from_dict({"prompt": [" ".join(f"t{int(t)}" for t in torch.randint(first, cfg["vocab"], (n,),
                                                                                        generator=gen))
                                         for n in lengths]})


class PhaseTimer:
    """Wall time per optimizer step of generation, no-grad log-prob calls, input preparation and the whole step."""

    def __init__(self, trainer: Any, device: torch.device):
        from transformers import TrainerCallback

        self.device, self.steps, self.current = device, [], None
        self.calls: list[tuple[list, torch.Tensor]] = []
        self._wrap(trainer, "_generate", "generation")
        self._wrap(trainer, "_prepare_inputs", "prepare")
        self._wrap(trainer, "_get_per_token_logps_and_entropies", "logprobs", only_no_grad=True, record=True)
        timer = self

        class Steps(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer.sync()
                timer.current = {"generation": 0.0, "prepare": 0.0, "logprobs": 0.0, "t0": time.perf_counter()}

            def on_step_end(self, args, state, control, **kwargs):
                timer.sync()
                step = timer.current
                step["step"] = time.perf_counter() - step.pop("t0")
                step["update"] = step["step"] - step["prepare"]
                timer.steps.append(step)

        trainer.add_callback(Steps())

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _wrap(self, trainer: Any, name: str, key: str, only_no_grad: bool = False, record: bool = False) -> None:
        inner = getattr(trainer, name)
        timer = self

        def timed(*args, **kwargs):
            if only_no_grad and torch.is_grad_enabled():
                out = inner(*args, **kwargs)
            else:
                timer.sync()
                t0 = time.perf_counter()
                out = inner(*args, **kwargs)
                timer.sync()
                if timer.current is not None:
                    timer.current[key] += time.perf_counter() - t0
            if record:
                ids, mask = args[1], args[2]
                keys = [tuple((i * m).tolist()) for i, m in zip(ids.cpu(), mask.cpu())]
                order = sorted(range(len(keys)), key=keys.__getitem__)
                timer.calls.append(([keys[i] for i in order], out[0].detach().float().cpu()[order]))
            return out

        setattr(trainer, name, timed)


def run_system(system: str, setting: str, cfg: dict, model_dir: str, dataset: Any, out_dir: Path, device: torch.device,
               seed: int, stop_at: float = float("inf")) -> dict:
    """Train ``system`` for ``cfg['steps']`` steps, or until ``time.perf_counter()`` passes ``stop_at``."""
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from dualkv.integration.trl import apply_dualkv

    control = CONTROLS.get(system, {})
    seed = seed + control.get("seed_offset", 0)
    init_kwargs = {"dtype": getattr(torch, cfg["weights"])}
    if "attn_implementation" in control:
        init_kwargs["attn_implementation"] = control["attn_implementation"]
    autocast = cfg.get("autocast", True) and device.type == "cuda"
    args = GRPOConfig(output_dir=str(out_dir / f"{setting}-{system}"), per_device_train_batch_size=cfg[
        "per_device_train_batch_size"], num_generations=cfg["num_generations"],
        max_completion_length=cfg["max_completion_length"], max_steps=cfg["steps"], learning_rate=cfg["learning_rate"],
        beta=cfg["beta"], bf16=autocast, use_cpu=device.type == "cpu", report_to=[], logging_steps=1, seed=seed,
        save_strategy="no", disable_tqdm=True, max_grad_norm=1.0, optim=cfg.get("optim", "adamw_torch"),
        model_init_kwargs=init_kwargs, shuffle_dataset=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=model_dir, reward_funcs=target_residue_reward, args=args, train_dataset=dataset)
    if system == "dualkv":
        apply_dualkv(trainer)
    timer = PhaseTimer(trainer, device)
    logs: list[dict] = []
    grads: list[dict] = []

    class Logs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                logs_copy = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}
                logs_list.append(logs_copy)

        def on_step_end(self, args, state, control, **kwargs):
            if time.perf_counter() > stop_at:
                control.should_training_stop = True

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            if cfg.get("compare"):
                grads.append({n: p.grad.detach().float().cpu().clone() for n, p in model.named_parameters()
                              if p.grad is not None})

    logs_list = logs
    trainer.add_callback(Logs())
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    rows = []
    for i, phases in enumerate(timer.steps):
        log = logs[i] if i < len(logs) else {}
        rows.append({"setting": setting, "system": system, "step": i + 1, "reward": log.get("reward"),
                     "loss": log.get("loss"), "entropy": log.get("entropy"), "kl": log.get("kl"),
                     "completion_len": log.get("completions/mean_length"),
                     **{f"{k}_s": phases[k] for k in ("generation", "logprobs", "update", "step")}})
    result = {"rows": rows, "peak_mem_gib": peak, "wall_s": wall, "calls": timer.calls, "grads": grads}
    del trainer
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def compare(stock: dict, dual: dict) -> dict:
    """Max relative differences of the two systems' log-prob calls and gradients (fp32 setting)."""
    out: dict[str, Any] = {"logprob_calls": len(stock["calls"]), "same_rows": True}
    lp = []
    for (keys, a), (ref_keys, b) in zip(dual["calls"], stock["calls"]):
        if keys != ref_keys:
            out["same_rows"] = False
            break
        lp.append(_max_rel(a, b))
    out["logprob_max_rel"] = max(lp) if lp else None
    grad = [max(float((g[n] - r[n]).norm() / r[n].norm().clamp_min(1e-30)) for n in r)
            for g, r in zip(dual["grads"], stock["grads"])]
    out["grad_max_rel_per_step"] = grad
    losses = [(d["loss"], s["loss"]) for d, s in zip(dual["rows"], stock["rows"])]
    out["loss_max_abs_diff"] = max(abs(a - b) for a, b in losses) if losses else None
    return out


def curve_spread(results: dict[str, dict]) -> dict:
    """Per run other than stock: mean and max |reward - stock's reward| and |loss - stock's loss| over the steps
    both ran, and the mean reward of the last 10 steps (the controls put dualkv's differences in scale)."""
    ref = {r["step"]: r for r in results["stock"]["rows"]}
    out = {}
    for system, res in results.items():
        rows = [r for r in res["rows"] if r["step"] in ref and r["reward"] is not None]
        entry: dict[str, Any] = {"steps": len(rows)}
        for key in ("reward", "loss"):
            diffs = [abs(r[key] - ref[r["step"]][key]) for r in rows
                     if r[key] is not None and ref[r["step"]][key] is not None]
            entry[f"{key}_mean_abs_diff"] = statistics.fmean(diffs) if diffs else None
            entry[f"{key}_max_abs_diff"] = max(diffs) if diffs else None
        tail = [r["reward"] for r in res["rows"][-10:] if r["reward"] is not None]
        entry["reward_last10_mean"] = statistics.fmean(tail) if tail else None
        out[system] = entry
    return out


def summarize(setting: str, results: dict[str, dict]) -> dict:
    """Median phase times over the steps after the first (warm-up), peak memory, speedups."""
    summary: dict[str, Any] = {}
    for system, res in results.items():
        steps = res["rows"][1:] or res["rows"]
        med = {k: statistics.median(r[f"{k}_s"] for r in steps) for k in ("generation", "logprobs", "update", "step")}
        med["training"] = med["logprobs"] + med["update"]
        summary[system] = {**med, "peak_mem_gib": res["peak_mem_gib"],
                           "final_reward": res["rows"][-1]["reward"] if res["rows"] else None}
    if all(s in summary for s in SYSTEMS):
        summary["speedup"] = {k: summary["stock"][k] / summary["dualkv"][k] if summary["dualkv"][k] else None
                              for k in ("generation", "logprobs", "update", "training", "step")}
    if "stock" in results and any(c in results for c in CONTROLS):
        summary["curve_spread"] = curve_spread(results)
    return summary


def plot(path: Path, data: dict) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in data["rows"] if r["setting"] == "curves"] or data["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, key in zip(axes, ("reward", "loss")):
        for system, style in zip((*SYSTEMS, *CONTROLS), ("-", "--", ":", "-.")):
            pts = [(r["step"], r[key]) for r in rows if r["system"] == system and r[key] is not None]
            if pts:
                ax.plot(*zip(*pts), style, label=system)
        ax.set_xlabel("step")
        ax.set_title(key)
        ax.legend()
    fig.suptitle(f"TRL GRPO, stock vs dualkv ({data['environment']['gpu']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def table(data: dict) -> str:
    lines = [f"{'setting':8} {'system':11} {'gen s':>7} {'logp s':>7} {'upd s':>7} {'train x':>8} {'peak GiB':>9} "
             f"{'reward':>7}"]
    for setting, summary in data["summary"].items():
        if not isinstance(summary, dict) or "stock" not in summary:
            lines.append(f"{setting:8} {summary}")
            continue
        for system in (*SYSTEMS, *CONTROLS):
            s = summary.get(system)
            if s is None:
                continue
            speed = summary.get("speedup", {}).get("training") if system == "dualkv" else None
            peak = f"{s['peak_mem_gib']:.1f}" if s["peak_mem_gib"] is not None else "-"
            reward = f"{s['final_reward']:.3f}" if s["final_reward"] is not None else "-"
            lines.append(f"{setting:8} {system:11} {s['generation']:7.3f} {s['logprobs']:7.3f} {s['update']:7.3f} "
                         f"{(f'{speed:.2f}x' if speed else ''):>8} {peak:>9} {reward:>7}")
    for setting, summary in data["summary"].items():
        for system, sp in (summary.get("curve_spread", {}) if isinstance(summary, dict) else {}).items():
            if system != "stock" and sp["reward_mean_abs_diff"] is not None:
                lines.append(f"{setting}: {system:11} vs stock: reward |diff| mean {sp['reward_mean_abs_diff']:.3f} "
                             f"max {sp['reward_max_abs_diff']:.3f}, last-10 mean reward {sp['reward_last10_mean']:.3f}")
    for setting, cmp in data.get("comparisons", {}).items():
        lines.append(f"{setting}: logprob max rel {cmp['logprob_max_rel']}, grad max rel per step "
                     f"{[f'{g:.1e}' for g in cmp['grad_max_rel_per_step']]}, same rows {cmp['same_rows']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", default="fp32,long,curves", help="comma-separated: fp32, long, curves")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "experiments" / "results"))
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny models, 3 steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget-s", type=float, default=360.0,
                        help="start no new setting after this many seconds")
    parser.add_argument("--deadline-s", type=float, default=500.0,
                        help="stop training (each system its share of what is left) after this many seconds")
    parser.add_argument("--steps", type=int, default=None, help="override every setting's step count")
    parser.add_argument("--plot", metavar="JSON", help="only redraw the plot (and table) of a result file")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated runs per setting: {', '.join((*SYSTEMS, *CONTROLS))} (the controls "
                             "are stock-vs-stock yardsticks, best in the curves setting)")
    args = parser.parse_args(argv)
    unknown = {s.strip() for s in args.systems.split(",") if s.strip()} - {*SYSTEMS, *CONTROLS}
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose from {[*SYSTEMS, *CONTROLS]}")
    if args.plot:
        data = json.loads(Path(args.plot).read_text())
        print(plot(Path(args.plot).with_suffix(".png"), data))
        print(table(data))
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.logging.set_verbosity_error()
    from dualkv.bench.harness import environment

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    import datasets
    import trl

    env = {**environment(device), "trl": trl.__version__, "datasets": datasets.__version__}
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    tag = "cpu-tiny" if args.tiny else (torch.cuda.get_device_name(device).split()[-1].lower()
                                        if device.type == "cuda" else "cpu")
    result_path = out_dir / f"trl_grpo-{tag}-{stamp}.json"
    data: dict[str, Any] = {"benchmark": "trl_grpo_e2e", "environment": env, "config": {}, "rows": [],
                            "summary": {}, "comparisons": {}}
    began = time.perf_counter()
    for setting in [s.strip() for s in args.settings.split(",") if s.strip()]:
        if setting not in SETTINGS:
            parser.error(f"unknown setting {setting!r}; choose from {sorted(SETTINGS)}")
        if time.perf_counter() - began > args.time_budget_s:
            data["summary"][setting] = "skipped (time budget)"
            continue
        cfg = {**SETTINGS[setting], **(TINY if args.tiny else {})}
        if args.steps:
            cfg["steps"] = args.steps
        data["config"][setting] = cfg
        results = {}
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = build_model_dir(Path(tmp), cfg, args.seed)
            dataset = build_dataset(cfg, args.seed)
            systems = [s.strip() for s in args.systems.split(",") if s.strip()]
            for i, system in enumerate(systems):
                now = time.perf_counter()
                stop_at = now + max(0.0, began + args.deadline_s - now) / (len(systems) - i)
                try:
                    results[system] = run_system(system, setting, cfg, model_dir, dataset, Path(tmp), device,
                                                 args.seed, stop_at)
                except torch.cuda.OutOfMemoryError:
                    data["rows"].append({"setting": setting, "system": system, "status": "OOM"})
                    gc.collect()
                    torch.cuda.empty_cache()
        for res in results.values():
            data["rows"].extend(res["rows"])
        data["summary"][setting] = summarize(setting, results)
        if cfg.get("compare") and all(s in results for s in SYSTEMS):
            data["comparisons"][setting] = compare(results["stock"], results["dualkv"])
        result_path.write_text(json.dumps(data, indent=1))     # a killed run keeps the finished settings
    data["plot"] = plot(result_path.with_suffix(".png"), data)
    result_path.write_text(json.dumps(data, indent=1))
    print(f"wrote {result_path}")
    print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
