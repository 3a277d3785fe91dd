"""Where one update's seconds go: tba sync-inline, tba async (local) and TRL's GRPOTrainer at equal work.

Why: bench/perf/vs_trl.py says which system reaches an accuracy first, not why; this splits one update of each system
into phases, on the same workload and in one invocation, so that a speed gap can be traced to its phase.

    python -m bench.perf.step_cost [--repeats 3] [--steps 30] [--results FILE.md] [key=value ...]
    python -m bench.perf.step_cost --smoke   # seconds: shrunken task and work, 3 updates, 1 repeat

Equal work: the recipe's SFT warm start (`tba.run.build.warm_start`, cached), task prompts and reward; B =
trainer.prompts_per_step prompts × K = trainer.samples_per_prompt samples per update; search.max_new_tokens new
tokens. One tba search batch is one update's samples (search.prompts_per_batch = B, search.samples_per_prompt = K,
buffer.prefill_samples = B·K, trainer.micro_batch_prompts = B). Both score every sample under the frozen reference
(tba: the searcher's π_ref forward; TRL: beta = --trl-beta > 0, so it loads a reference model and scores it).
TRL's other settings are bench/perf/vs_trl.py's. Evaluation and checkpoints are off while timing (tba still evaluates
before the first and after the last update: timed and excluded).

Phases, seconds per update, exclusive (a timed phase nested in another is subtracted from it):
  generation     tba: the sampler's generate (HFSampler); TRL: model.generate
  reference      tba: the searcher's response_logprobs on π_ref; TRL: _get_per_token_logps_and_entropies(ref_model)
  reward         tba: batch_rewards; TRL: GRPOTrainer._calculate_rewards
  search other   the rest of getting samples. tba: runtime.collect (inline: decode, building samples; async:
                 receiving the searchers' groups); TRL: _generate_and_score_completions (decode, masks, advantages)
  buffer insert  tba: ReplayBuffer.extend (with its SQLite write) and mark_sync; TRL: none
  buffer draw    tba: ReplayBuffer.sample; TRL: get_batch_samples (its dataloader's prompt batch)
  collation      padding into tensors. tba: tba.models.generation._pad (generation, scoring, trainer) and
                 tba.algorithm.trainer._padded; TRL: trl's pad() and _tokenize_prompts
  forward        tba: Trainer.step (policy log-probs, loss, diagnostics); TRL: compute_loss
  backward       torch.Tensor.backward, both
  optimizer      tba: Trainer._apply_gradients (grad norm, AdamW step, zero_grad); TRL: _get_grad_norm and
                 on_pre_optimizer_step → on_step_end (AdamW step, LR scheduler, zero_grad)
  publish/load   tba: Trainer.weights + runtime.publish (inline: the copy into the searcher's model; local: into
                 the transport); TRL: none (it samples with the model it trains)
  logging        tba: runtime.report, step_metrics, MetricsLogger.log; TRL: _maybe_log_save_evaluate
  other          the update's wall time minus the phases above
  total          wall time from one update's end to the next's (evaluation excluded), mean over updates 2..N (the
                 first is warm-up: its own row, "first update"). Every row is that mean per repeat, then the
                 median over --repeats.
  evaluation     one held-out pass, not in the total: tba Loop.evaluate (median of its calls); TRL
                 tba.rollout.evaluate.greedy_accuracy once on the trained model (as bench/perf/vs_trl.py evaluates it)
  start-up       launch to the first update. tba: from train(), SFT and the first evaluation excluded (models,
                 runtime, searchers ready, prefill of one search batch); TRL: from loading the model to its first
                 batch (GRPOTrainer and its reference model, train()'s set-up; its first generation is in update 1)

Processes. tba sync-inline and TRL run in this process: every row is measured. tba async (runtime=local) generates,
scores and loads weights in a spawned searcher that these wrappers (unittest.mock, in this script only) cannot
reach: its column is what the trainer process sees, and in parentheses, not in the total, the searcher's generation
seconds per batch and load seconds per load from its reported stats; "fresh samples / update" (prefill excluded)
shows how much new data each update got. Run on an IDLE machine. Threads: tba inline all cores, tba local 1 + 1,
TRL --trl-threads (default all cores). Last line: `per update (s): tba-sync X, tba-async Y, trl Z; start-up (s):
tba A, trl B`, tba A being the default runtime's (async local).

Overlap limit: tba-sync-1t is tba-sync on one torch thread (threads=1 search.threads=1); from it
and tba-sync the script prints how each side of an update scales from one thread to all cores, and the fastest
update the machine allows: min(max(S(1), T(1)), S(all) + T(all)) — see overlap_limit().
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from bench.lib.header import header  # noqa: E402
from bench.lib.paths import OUT  # noqa: E402
from bench.perf.vs_trl import SMOKE  # noqa: E402
from tba import build, searcher  # noqa: E402
from tba.algorithm import loop  # noqa: E402
from tba.algorithm import trainer as trainer_mod  # noqa: E402
from tba.algorithm.buffer import ReplayBuffer  # noqa: E402
from tba.config import load_config  # noqa: E402
from tba.models import generation  # noqa: E402
from tba.rollout.evaluate import greedy_accuracy  # noqa: E402
from tba.rollout.samplers.hf import HFSampler  # noqa: E402
from tba.run.build import build_task, warm_start  # noqa: E402
from tba.run.logger import MetricsLogger  # noqa: E402
from tba.run.train import train
from tba.runtime.inline import InlineRuntime  # noqa: E402
from tba.runtime.local import LocalRuntime  # noqa: E402

PHASES = {"generation": "generation", "reference": "reference log-probs", "reward": "reward",
          "search other": "search other / wait", "buffer insert": "buffer insert", "buffer draw": "buffer draw",
          "collation": "collation / padding", "forward": "trainer forward", "backward": "backward",
          "optimizer": "optimizer", "publish": "weight publish / load", "logging": "logging"}
SYSTEMS = ("tba-sync", "tba-async", "trl", "tba-sync-1t")
TBA_RUNTIMES = {"tba-sync": ["runtime=inline", "mode=sync"], "tba-async": ["runtime=local", "mode=async"],
                "tba-sync-1t": ["runtime=inline", "mode=sync", "threads=1", "search.threads=1"]}
SEARCH_SIDE = ("generation", "reference", "reward", "search other")  # what a searcher does for one update
EXCLUDED = ("evaluation", "sft")  # timed, never part of an update or of start-up
SMOKE_STEP = ["trainer.steps=3", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=4",
              "search.max_new_tokens=8", "eval.max_new_tokens=8", "eval.batch_size=8", "threads=1", "search.threads=1"]
clock = time.perf_counter


def sync_clock() -> float:
    if torch.cuda.is_available():  # a phase's GPU work is done when it ends
        torch.cuda.synchronize()
    return clock()


class Timer:
    """Exclusive seconds per phase of each update; an update runs from one `boundary()` to the next."""

    def reset(self, t_launch: float | None = None) -> None:
        self.t_launch, self.t_first, self.t_update, self.cur = t_launch or clock(), None, None, None
        self.updates, self.evals, self.stack, self.excluded, self.stopped = [], [], [], 0.0, False

    def boundary(self) -> None:
        if self.stopped:
            return
        now = clock()
        if self.t_update is None:
            self.t_first = now
        else:
            evaluation = self.cur.pop("evaluation", 0.0)
            self.updates.append({**self.cur, "total": now - self.t_update - evaluation})
        self.t_update, self.cur = now, {}

    def stop(self) -> None:
        self.cur, self.stopped = None, True

    def begin(self, name: str) -> None:
        self.stack.append([name, sync_clock(), 0.0])

    def end(self) -> None:
        name, t0, inner = self.stack.pop()
        elapsed = sync_clock() - t0
        if self.stack:
            self.stack[-1][2] += elapsed
        if name in EXCLUDED:
            self.excluded += elapsed if self.t_first is None else 0.0
            self.evals += [elapsed] if name == "evaluation" else []
        if self.cur is not None and not any(n in EXCLUDED for n, _, _ in self.stack):
            self.cur[name] = self.cur.get(name, 0.0) + (elapsed if name in EXCLUDED else elapsed - inner)

    @contextlib.contextmanager
    def phase(self, name: str):
        self.begin(name)
        try:
            yield
        finally:
            self.end()


TIMER, LAST = Timer(), {}


def timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        with TIMER.phase(name):
            return fn(*a, **k)
    return wrapper


def boundary(fn, *, first: bool):
    """first: the first call starts the first update (ends start-up); else: every call ends an update."""
    @functools.wraps(fn)
    def wrapper(*a, **k):
        if first and TIMER.t_update is None:
            TIMER.boundary()
        out = fn(*a, **k)
        if not first:
            TIMER.boundary()
        return out
    return wrapper


def totals_capture(fn):
    """Loop.totals (the run's end), keeping what the searchers reported and how many samples the trainer
    received."""
    @functools.wraps(fn)
    def wrapper(self):
        report = self.runtime.report()
        LAST.update(stats=report.stats, states=report.states, received=self.state.received, steps=self.state.step)
        return fn(self)
    return wrapper


@contextlib.contextmanager
def instrumented():
    """Every wrapper, set on classes and modules for the duration (tba's and TRL's module-level ones)."""
    from trl.trainer import grpo_trainer

    T = trainer_mod.Trainer
    targets = [(HFSampler, "generate", "generation"), (searcher, "response_logprobs", "reference"),
               (searcher, "batch_rewards", "reward"), (InlineRuntime, "collect", "search other"),
               (LocalRuntime, "collect", "search other"), (ReplayBuffer, "extend", "buffer insert"),
               (ReplayBuffer, "mark_sync", "buffer insert"), (ReplayBuffer, "sample", "buffer draw"),
               (generation, "_pad", "collation"), (trainer_mod, "_padded", "collation"), (T, "step", "forward"),
               (torch.Tensor, "backward", "backward"), (T, "_apply_gradients", "optimizer"), (T, "weights", "publish"),
               (InlineRuntime, "publish", "publish"), (LocalRuntime, "publish", "publish"),
               (loop, "step_metrics", "logging"), (MetricsLogger, "log", "logging"),
               (InlineRuntime, "report", "logging"), (LocalRuntime, "report", "logging"),
               (loop.Loop, "evaluate", "evaluation"), (build, "warm_start", "sft"), (grpo_trainer, "pad", "collation")]
    with contextlib.ExitStack() as stack:
        for obj, attr, name in targets:
            stack.enter_context(mock.patch.object(obj, attr, timed(name, getattr(obj, attr))))
        step = boundary(boundary(loop.Loop.step, first=True), first=False)

        def loop_step(self):
            LAST.setdefault("received0", self.state.received)  # what the prefill brought
            return step(self)

        stack.enter_context(mock.patch.object(loop.Loop, "step", loop_step))
        stack.enter_context(mock.patch.object(loop.Loop, "totals", totals_capture(loop.Loop.totals)))
        yield


def per_update(extra: dict) -> dict:
    """Mean seconds per phase over updates 2..N of the last run, `other`, start-up and evaluation."""
    ups = TIMER.updates[1:] or TIMER.updates
    mean = {p: sum(u.get(p, 0.0) for u in ups) / len(ups) for p in [*PHASES, "total"]}
    mean["other"] = mean["total"] - sum(mean[p] for p in PHASES)
    return {"per_update": mean, "updates_timed": len(ups), "startup_s": TIMER.t_first - TIMER.t_launch - TIMER.excluded,
            "first_update_s": TIMER.updates[0]["total"] if TIMER.updates else None,
            "eval_s": statistics.median(TIMER.evals) if TIMER.evals else None, **extra}


def run_tba(cfg, name: str) -> dict:
    LAST.clear()
    TIMER.reset()
    train(cfg, overwrite=True)
    TIMER.stop()
    stats, states = LAST["stats"], LAST["states"]
    extra = {"fresh_per_update": (LAST["received"] - LAST["received0"]) / max(LAST["steps"], 1)}
    if name == "tba-async":
        batches, loads = sum((s or {}).get("batches", 0) for s in states), stats.get("sync/searcher_loads", 0)
        extra["searcher_generate_per_batch"] = stats.get("searcher/generate_s", 0.0) / max(batches, 1)
        extra["searcher_load_per_load"] = stats.get("sync/searcher_load_s", 0.0) / loads if loads else None
    return per_update(extra)


def run_trl(cfg, task, sft_dir: Path, args, repeat: int) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class OptimizerPhase(TrainerCallback):
        def on_pre_optimizer_step(self, *a, **k):
            TIMER.begin("optimizer")

        def on_step_end(self, *a, **k):
            TIMER.end()

    torch.set_num_threads(args.trl_threads)
    TIMER.reset()
    tokenizer = AutoTokenizer.from_pretrained(sft_dir)
    model = AutoModelForCausalLM.from_pretrained(sft_dir, dtype=torch.float32)
    by_text = {p.text: p for p in task.train}

    def arith_reward(prompts, completions, **_):
        return [task.reward(by_text[p], c) for p, c in zip(prompts, completions, strict=True)]

    B, K, s = cfg.trainer.prompts_per_step, cfg.trainer.samples_per_prompt, cfg.search
    gconf = GRPOConfig(
        output_dir=str(args.out / f"trl-r{repeat}"), use_cpu=not torch.cuda.is_available(), report_to="none",
        save_strategy="no", seed=cfg.seed, per_device_train_batch_size=B * K, gradient_accumulation_steps=1,
        num_generations=K, max_completion_length=s.max_new_tokens, temperature=s.temperature, top_k=0,
        top_p=s.top_p, learning_rate=cfg.trainer.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=0.0, beta=args.trl_beta, bf16=False, gradient_checkpointing=False, logging_steps=1,
        max_steps=cfg.trainer.steps, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=arith_reward, args=gconf, processing_class=tokenizer,
                          train_dataset=Dataset.from_list([{"prompt": p.text} for p in task.train]),
                          callbacks=[OptimizerPhase()])
    trainer.remove_callback(PrinterCallback)
    assert trainer.ref_model is not None, "TRL built no reference model: beta must be > 0"
    model.generate = timed("generation", model.generate)
    logps = trainer._get_per_token_logps_and_entropies

    def ref_logps(m, *a, **k):  # only the reference model's scoring; the policy's is inside compute_loss
        return timed("reference", logps)(m, *a, **k) if m is trainer.ref_model else logps(m, *a, **k)

    trainer._get_per_token_logps_and_entropies = ref_logps
    for attr, name in (("_calculate_rewards", "reward"), ("_tokenize_prompts", "collation"),
                       ("_generate_and_score_completions", "search other"), ("compute_loss", "forward"),
                       ("_get_grad_norm", "optimizer")):
        setattr(trainer, attr, timed(name, getattr(trainer, attr)))
    trainer.get_batch_samples = boundary(timed("buffer draw", trainer.get_batch_samples), first=True)
    log_then_end = boundary(timed("logging", trainer._maybe_log_save_evaluate), first=False)

    def log_step(*a, **k):  # after the last update, Trainer logs once more at the epoch's end: not an update
        out = log_then_end(*a, **k)
        if trainer.state.global_step >= trainer.state.max_steps:
            TIMER.stop()
        return out

    trainer._maybe_log_save_evaluate = log_step
    trainer.train()
    TIMER.stop()
    model.eval()
    t0 = clock()
    greedy_accuracy(model, tokenizer, task, task.test, cfg.eval.max_new_tokens, cfg.eval.batch_size)
    TIMER.evals.append(clock() - t0)
    return per_update({"fresh_per_update": float(B * K)})


def cell(system: str, phase: str, value: float, runs: list[dict]) -> str:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    if system == "trl" and phase in ("buffer insert", "publish"):
        return "—"
    if system == "tba-async" and phase in ("reference", "reward"):
        return "(in searcher)"
    if system == "tba-async" and phase == "generation":
        return f"({med('searcher_generate_per_batch'):.4f} per batch, in searcher)"
    if system == "tba-async" and phase == "publish":
        loads = [r["searcher_load_per_load"] for r in runs if r["searcher_load_per_load"] is not None]
        return f"{value:.4f} (+ " + (f"{statistics.median(loads):.4f}" if loads else "no") + " load, in searcher)"
    return f"{value:.4f}"


def table(results: dict[str, list[dict]]) -> str:
    cols = [s for s in SYSTEMS if results.get(s)]
    med = {s: {p: statistics.median(r["per_update"][p] for r in results[s]) for p in [*PHASES, "other", "total"]}
           for s in cols}
    out = ["| phase (s per update) | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for p, label in [*PHASES.items(), ("other", "other (unattributed)"), ("total", "**total per update**")]:
        out.append(f"| {label} | " + " | ".join(cell(s, p, med[s][p], results[s]) for s in cols) + " |")
    rows = {"fresh samples / update": ("fresh_per_update", ".1f"), "start-up (s)": ("startup_s", ".2f"),
            "first update (s, not in total: warm-up)": ("first_update_s", ".3f"),
            "evaluation, one pass (s, not in total)": ("eval_s", ".3f")}
    for label, (key, spec) in rows.items():
        vals = [[r[key] for r in results[s] if r.get(key) is not None] for s in cols]
        out.append(f"| {label} | " + " | ".join(format(statistics.median(v), spec) if v else "—" for v in vals) + " |")
    n = {s: (len(results[s]), results[s][0]["updates_timed"]) for s in cols}
    out.append("\nMedians over " + ", ".join(f"{s}: {r} repeats × {u} timed updates" for s, (r, u) in n.items()) + ".")
    return "\n".join(out)


def overlap_limit(results: dict[str, list[dict]]) -> str:
    """The fastest an update could be on this machine, from tba-sync's phases at one and at all threads.

    S(n), T(n): an update's search side (generation, reference, reward, search other) and the rest (trainer side),
    seconds at n torch threads. Perfect overlap, one core each: max(S(1), T(1)); no overlap, all cores on each
    phase in turn: S(n) + T(n). The limit is the smaller of the two (a split of one machine's cores between the
    two sides cannot beat both)."""
    if not (results.get("tba-sync") and results.get("tba-sync-1t")):
        return ""

    def sides(runs: list[dict]) -> tuple[float, float]:
        s = statistics.median(sum(r["per_update"][p] for p in SEARCH_SIDE) for r in runs)
        return s, statistics.median(r["per_update"]["total"] for r in runs) - s

    (s1, t1), (sn, tn) = sides(results["tba-sync-1t"]), sides(results["tba-sync"])
    limit = min(max(s1, t1), sn + tn)
    out = [f"\n\n## Overlap limit (tba-sync phases at 1 and {os.cpu_count()} threads)\n",
           "| side | 1 thread (s) | all cores (s) | speed-up |", "|---|---|---|---|",
           f"| search (generation, reference, reward, search other) | {s1:.4f} | {sn:.4f} | {s1 / sn:.2f}× |",
           f"| trainer (everything else) | {t1:.4f} | {tn:.4f} | {t1 / tn:.2f}× |",
           f"\nPerfect overlap, one core each: max(S(1), T(1)) = {max(s1, t1):.4f} s; in turn on all cores: "
           f"S + T = {sn + tn:.4f} s; **limit {limit:.4f} s per update**."]
    if results.get("tba-async"):
        a = statistics.median(r["per_update"]["total"] for r in results["tba-async"])
        out.append(f" tba-async: {a:.4f} s per update, {a / limit:.2f}× the limit ({(a / limit - 1) * 100:+.0f} %).")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="recipe (path or packaged name); default: the embedded default")
    ap.add_argument("--repeats", type=int, default=None, help="runs of each system (default 3; --smoke 1)")
    ap.add_argument("--steps", type=int, default=None, help="updates per run (default 30; --smoke 3)")
    ap.add_argument("--trl-beta", type=float, default=0.04, help="TRL's KL coefficient (> 0: it scores π_ref)")
    ap.add_argument("--trl-threads", type=int, default=None, help="TRL torch threads (default all cores; --smoke 1)")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--smoke", action="store_true", help="tiny task, 10-step SFT, 3 updates, 1 repeat: seconds")
    ap.add_argument("--out", type=Path, default=OUT / "step_cost")
    ap.add_argument("--results", type=Path, default=None, help="write the table, header and raw JSON here")
    ap.add_argument("overrides", nargs="*", help="tba config overrides key=value (also shape TRL's settings)")
    args = ap.parse_args(argv)
    args.repeats = args.repeats or (1 if args.smoke else 3)
    args.trl_threads = args.trl_threads or (1 if args.smoke else os.cpu_count() or 1)
    user = [*(SMOKE + SMOKE_STEP if args.smoke else []), f"trainer.steps={args.steps or (3 if args.smoke else 30)}",
            *args.overrides]
    base = load_config(args.config, user)
    B, K = base.trainer.prompts_per_step, base.trainer.samples_per_prompt
    work = [*user, f"search.prompts_per_batch={B}", f"search.samples_per_prompt={K}", f"buffer.prefill_samples={B * K}",
            f"trainer.micro_batch_prompts={B}", "eval.every_steps=1000000", "checkpoint.every_steps=null",
            "logging.progress=false"]
    task = build_task(base)
    sft_dir = (Path(base.model.policy) if base.model.policy != "builtin"
               else warm_start(base, task))
    results: dict[str, list[dict]] = {s: [] for s in args.systems}
    with instrumented():
        for r in range(args.repeats):
            for system in args.systems:
                if system == "trl":
                    res = run_trl(base, task, sft_dir, args, r)
                else:
                    cfg = load_config(args.config, [*work, f"output_dir={args.out / f'{system}-r{r}'}",
                                                    *TBA_RUNTIMES[system]])
                    res = run_tba(cfg, system)
                results[system].append(res)
                print(f"[{system} repeat {r}] {json.dumps(res)}", flush=True)
    md = table(results) + overlap_limit(results)
    print(md)
    if args.results:
        head = header(__spec__.name, f"workload: B={B}, K={K}, {base.search.max_new_tokens} new tokens, "
                      f"{base.trainer.steps} updates, TRL beta {args.trl_beta}; phase definitions: the script's "
                      "docstring", argv=argv, packages=("torch", "transformers", "trl"))
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(head + md + "\n\n```json\n" + json.dumps(results, indent=1) + "\n```\n")
    tot = {s: (f"{statistics.median(r['per_update']['total'] for r in results[s]):.3f}" if results.get(s) else "—")
           for s in SYSTEMS}
    up = {s: (f"{statistics.median(r['startup_s'] for r in results[s]):.2f}" if results.get(s) else "—")
          for s in SYSTEMS}
    print(f"per update (s): tba-sync {tot['tba-sync']}, tba-async {tot['tba-async']}, trl {tot['trl']}; "
          f"start-up (s): tba {up['tba-async']}, trl {up['trl']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
