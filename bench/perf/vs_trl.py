"""tba (async local runtime, default recipe) vs TRL's GRPOTrainer: wall-clock to a held-out accuracy target.

Both systems, in the same invocation and per seed, start from the SAME SFT warm start (`tba.run.build.warm_start`,
loaded with AutoModelForCausalLM / AutoTokenizer), and share: the ArithTask train prompts and reward
(`task.reward`, GSM8K last-number exact match), B = trainer.prompts_per_step prompts × K = trainer.samples_per_prompt
samples per optimizer step, search.max_new_tokens completion tokens, sampling T = search.temperature, top-k 0,
top-p search.top_p, AdamW (0.9/0.999, eps 1e-8, no weight decay, no warmup, constant lr = trainer.lr, no grad
clipping, float32), and the evaluation: `tba.rollout.evaluate.greedy_accuracy` on task.test (500 problems), every
`--eval-every` optimizer steps, on the model being trained, with evaluation time excluded from the clock.
Prompt text is the bare `a+b=`; both tokenize it with the same tokenizer call, whose post-processor prepends <bos>
(the smoke run prints both id lists to show they are identical).

    python -m bench.perf.vs_trl --seeds 0 1 --budget-s 60 --target 0.6 --eval-every 10 [key=value ...]
    python -m bench.perf.vs_trl --smoke     # seconds: shrunken task, 10-step SFT, 10 tba steps, TRL 1 thread
    python -m bench.perf.vs_trl --config arith_hard_cpu --tba-sync --seeds 0 1 2 --budget-s 150 --target 0.6

    python -m bench.perf.vs_trl --config smollm2_rg_cpu --same-updates --startup --target 0.5 --budget-s 5400 \
        --eval-every 20 --seeds 5 --results bench/results/vs_trl/vs_trl_smollm2.md

--config picks the recipe (default: the embedded default); --tba-sync adds tba's strongest synchronous
baseline (runtime=inline mode=sync: one process, generation and training alternate) on the same warm start.
A recipe with a model of its own (smollm2_rg_cpu: SmolLM2-135M-Instruct from `package:`, prompts in its chat
template, reasoning-gym's verifier as the reward) gives both systems that model and the templated prompt text.
--same-updates: TRL runs the recipe's trainer.steps updates with its learning-rate schedule (warm-up, stable,
cosine decay as transformers' warmup_stable_decay), so both end at the same update count and the final
evaluations compare; without it TRL trains at constant lr until the budget (the arithmetic comparisons).

key=value overrides go to the tba config and, through it, to TRL (B, K, lr, T, lengths, task, SFT);
model.policy=<dir> (a save_pretrained directory) replaces the SFT warm start for both systems.
Dependency: TRL is a benchmark-only dependency (the `bench` extra: `pip install -c constraints.txt -e '.[bench]'`
with torch pinned in constraints.txt; written against trl 1.16).

Clocks. tba: its own training clock (`Loop.train_s`: from the searchers being ready — their start-up is NOT included,
bench/perf/startup.py measures it — buffer prefill included, evaluation excluded); with --startup both clocks
start at launch instead: tba's adds its summary's `startup_s` (models built, searcher processes started and
ready), TRL's starts before its model is loaded (imports excluded from both: tba's searchers fork from a server that
imported tba before the first seed, as `tba train` runs it alongside its own imports — fork_server_ready);
it runs trainer.steps steps (default recipe: 200, or --tba-steps), not a budget — if it finishes before the
budget a warning is printed and its last evaluation stands. TRL: from on_train_begin, evaluation excluded; the
callback stops training when the next step would end past --budget-s, so its last evaluation is inside the budget.
Time to target and accuracy at budget use only evaluations at or before the budget (tba's last in-budget
evaluation can lie up to --eval-every steps before it). Ratio = TRL time-to-target / tba time-to-target
(the target is ≥ 4×); if only tba reaches the target it is a lower bound: budget / tba time.
Resolution: time to target is quantised to the evaluation schedule. From a ~33 % SFT start both systems were
seen to pass 90 % within 5 RL steps, so use a small --eval-every (e.g. 2) or the ratio measures start-up cost.

TRL's asynchronous GRPO (`trl.experimental.async_grpo.AsyncGRPOTrainer`, trl 1.16) is not compared: it
generates on a separate `trl vllm-serve` server and pushes weights to it only through vLLM's
NCCLWeightTransferEngine (trl/experimental/async_grpo/weight_transfer.py; no gloo or shared-memory path), and
NCCL needs CUDA devices, so it cannot run on this CPU-only machine. Compare it on a GPU machine.

Known unfairness (not tuned away; report as measured):
- Start-up: without --startup tba's clock starts once its searchers are ready, so their model load (and, spawned,
  their imports) is not on it, while TRL needs none. This favours tba async; use --startup for launch-to-accuracy
  (bench/perf/startup.py times the whole `tba train` command, imports included).
- Objectives differ by design: tba = VarGrad TB with β (an implicit KL to the SFT reference, sequence-level
  residual on summed log-probs); TRL = GRPO defaults, loss_type "dapo" (per-token normalisation, group-std
  advantages), beta = 0.0 (TRL's default: no KL, no reference model), PPO clip inactive (one update per
  generation). The same lr is therefore not the same step size (calibration.md §6: TRL collapsed at 3e-4).
- TRL defaults we override to match tba (bench/lib/trl_grpo.py): bf16 → model.autocast == bfloat16 (TRL's
  default bf16=True is accelerate's autocast, what tba's model.autocast=bfloat16 does; without it tba computes in
  float32, and so does TRL), gradient_checkpointing → False, max_grad_norm 1.0 → 0 (tba: no clipping).
  Evaluation runs under the same autocast for both.
- Threads: TRL is one process with torch threads = all cores (2, --trl-threads); tba is 1 searcher + 1 trainer
  process, one core each. Run on an IDLE machine: with another busy process on a 2-core box, 2 OpenMP threads
  oversubscribe and a TRL step measured 13-16 s instead of 0.5 s (1 thread), which would flatter tba hugely.
- Prompt draws: TRL walks a shuffled dataset; tba's searcher sweeps its shard and the buffer samples
  recent groups. TRL generates on-policy each step; tba trains on slightly stale samples (async).
- Evaluation pauses TRL's clock and everything TRL does; tba's clock pauses but its searcher keeps generating
  (one core, beside the trainer's evaluating one), so after an evaluation the buffer holds a pool of samples of
  the current policy that cost no clock. The trainer draws B·K of them per update (the recipe's searcher already
  makes ≈ 1.5× what the trainer draws), so what an evaluation gives tba is fresher samples for the next update or
  two, not more updates.
- Samples per prompt: TRL generates exactly K per prompt each step; tba's searcher generates
  search.generations_per_prompt (smollm2_rg_cpu: 6) on its own core and the trainer draws K = 4 of them
  (with buffer.online_draw=spread, one of each reward value first).
Writes bench/results/vs_trl/vs_trl.md (date, machine, command, table, raw JSON) and, in the run directory
(--out, not committed), a figure of accuracy vs wall-clock per system (median over seeds and each seed);
--replot FILE.md redraws the figure only.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.lib.header import header, raw_rows  # noqa: E402
from bench.lib.paths import OUT, RESULTS  # noqa: E402
from bench.lib.trl_grpo import run_trl  # noqa: E402
from tba.config import load_config  # noqa: E402
from tba.models import load_tokenizer  # noqa: E402
from tba.models.sources import resolve_source  # noqa: E402
from tba.run.build import build_task, warm_start  # noqa: E402
from tba.run.train import train
from tba.runtime import forkserver  # noqa: E402

SMOKE = ["task.train_size=300", "task.test_size=16", "sft.steps=10", "sft.batch_size=16", "sft.log_every_steps=10",
         "sft.cache_dir=/tmp/vs_trl_smoke_cache", "trainer.steps=10"]


def in_budget(evals: list, budget: float) -> list:
    return [e for e in evals if e[2] <= budget]


def time_to(evals: list, target: float, budget: float) -> float | None:
    return next((s for _, acc, s in in_budget(evals, budget) if acc >= target), None)


def crossing(evals: list, target: float, budget: float) -> float | None:
    """An estimate finer than the evaluations: the clock where the straight line between the last evaluation
    below `target` and the first at or above it crosses it (None: never reached; the first evaluation's clock if
    that one already is)."""
    ev = in_budget(evals, budget)
    for i, (_, acc, s) in enumerate(ev):
        if acc >= target:
            if i == 0:
                return s
            _, a0, s0 = ev[i - 1]
            return s0 + (target - a0) / (acc - a0) * (s - s0)
    return None


def fork_server_ready(cfg) -> None:
    """`tba train` starts the server its searchers fork from before its own imports (tba.runtime.forkserver), so
    the server imports while the trainer's process does. This process has imported tba already: start the server
    now and wait until it has imported too (a first fork waits for it), so that its imports are excluded from the
    clock like every other import (bench/perf/startup.py times the whole command)."""
    if forkserver.start_early(cfg):
        child = multiprocessing.get_context("forkserver").Process(target=os.getpid)
        child.start()
        child.join(timeout=300)


def run_tba(cfg, args, seed: int) -> dict:
    s = train(cfg, overwrite=True)
    if args.startup:  # launch to accuracy: models built, searcher processes started and ready
        s["evals"] = [(step, score, t + s["startup_s"]) for step, score, t in s["evals"]]
        s["train_wall_clock_s"] += s["startup_s"]
    if s["train_wall_clock_s"] < args.budget_s:
        print(f"WARNING: tba finished {s['trainer_steps']} steps in {s['train_wall_clock_s']:.0f} s < budget "
              f"{args.budget_s:.0f} s; raise --tba-steps for a full-budget comparison", flush=True)
    return {"evals": [tuple(e) for e in s["evals"]], "steps": s["trainer_steps"], "train_s": s["train_wall_clock_s"],
            "reward_end": s["train_reward_end"], "startup_s": s["startup_s"]}


def starting_point(cfg) -> tuple[Path, object]:
    """(the directory both systems load the starting policy from, the task as TRL sees it): the builtin model's
    SFT warm start, or the recipe's model (a `package:`/.gguf source resolved to its converted checkpoint, as
    tba's own loader does). With `task.chat_template` the prompts are in the policy's chat template, as tba's
    run builds them, and TRL is given that text."""
    if cfg.model.policy == "builtin":
        task = build_task(cfg)
        return warm_start(cfg, task), task
    source = Path(resolve_source(cfg.model.policy))
    return source, build_task(cfg, load_tokenizer(str(source)) if cfg.task.chat_template else None)


def summarise(system: str, seed: int, res: dict, args) -> dict:
    inside = in_budget(res["evals"], args.budget_s)
    row = {"system": system, "seed": seed, "acc_start": res["evals"][0][1],
           "time_to_target_s": time_to(res["evals"], args.target, args.budget_s),
           "acc_at_budget": inside[-1][1], "acc_at_budget_step": inside[-1][0], "steps": res["steps"],
           "train_s": res["train_s"], "s_per_step": res["train_s"] / max(res["steps"], 1),
           "reward_end": res["reward_end"], "startup_s": res.get("startup_s"), "evals": res["evals"]}
    print(json.dumps({k: v for k, v in row.items() if k != "evals"}), flush=True)
    return row


def ratio(trl: dict, tba: dict, budget: float) -> str:
    a, b = trl["time_to_target_s"], tba["time_to_target_s"]
    if a is not None and b is not None:
        return f"{a / max(b, 1e-9):.2f}×"
    if b is not None:
        return f"≥ {budget / max(b, 1e-9):.2f}× (TRL never reached it)"
    return "— (tba did not reach it)" if a is not None else "— (neither reached it)"


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def report(rows: list[dict], args) -> str:
    out = [f"| system | seed | acc start | time to {args.target:.0%} (s) | acc at {args.budget_s:.0f} s (step) | "
           "steps | train s | s/step | train reward (last 10 %) |", "|---" * 9 + "|"]
    for r in rows:
        out.append(f"| {r['system']} | {r['seed']} | {r['acc_start']:.1%} | {fmt(r['time_to_target_s'], '.1f')} | "
                   f"{r['acc_at_budget']:.1%} ({r['acc_at_budget_step']}) | {r['steps']} | {r['train_s']:.1f} | "
                   f"{r['s_per_step']:.2f} | {r['reward_end']:.2f} |")
    out.append("")
    by = {(r["system"], r["seed"]): r for r in rows}
    for seed in args.seeds:
        if ("trl-grpo", seed) in by and ("tba", seed) in by:
            out.append(f"- seed {seed}: TRL time-to-{args.target:.0%} / tba time-to-{args.target:.0%} = "
                       f"{ratio(by[('trl-grpo', seed)], by[('tba', seed)], args.budget_s)}")
        if ("tba-sync", seed) in by:
            out.append(f"- seed {seed}: tba-sync time-to-{args.target:.0%} / tba (async) time-to-{args.target:.0%} = "
                       f"{ratio(by[('tba-sync', seed)], by[('tba', seed)], args.budget_s).replace('TRL', 'sync')}")
    for system in dict.fromkeys(r["system"] for r in rows):
        accs = sorted(r["acc_at_budget"] for r in rows if r["system"] == system)
        times = sorted(r["time_to_target_s"] for r in rows if r["system"] == system and r["time_to_target_s"])
        out.append(f"- {system}: accuracy at {args.budget_s:.0f} s median {statistics.median(accs):.1%} "
                   f"(range {accs[0]:.1%}–{accs[-1]:.1%}); time to {args.target:.0%} median "
                   f"{fmt(statistics.median(times) if times else None, '.1f')} s over the "
                   f"{len(times)}/{len(accs)} seeds that reached it")
    for seed in args.seeds:
        if ("tba", seed) in by and ("trl-grpo", seed) in by:
            per = by[("trl-grpo", seed)]["s_per_step"] / max(by[("tba", seed)]["s_per_step"], 1e-9)
            out.append(f"- seed {seed}: TRL s/step / tba s/step = {per:.2f}×")
    pairs = [(by[("trl-grpo", s)], by[("tba", s)]) for s in args.seeds if ("tba", s) in by and ("trl-grpo", s) in by]
    firsts = [(a["time_to_target_s"], b["time_to_target_s"]) for a, b in pairs]
    lines = [(crossing(a["evals"], args.target, args.budget_s), crossing(b["evals"], args.target, args.budget_s))
             for a, b in pairs]
    for name, times in (("first evaluation at or above the target (the table's)", firsts),
                        ("estimate, linear between the evaluations either side of the target", lines)):
        if times and all(a is not None and b is not None for a, b in times):
            each = [a / b for a, b in times]
            trl, tba = statistics.median(a for a, _ in times), statistics.median(b for _, b in times)
            out.append(f"- over {len(times)} seeds, time to {args.target:.0%} by {name}: TRL / tba per seed "
                       + ", ".join(f"{x:.2f}×" for x in each) + f"; median of the ratios "
                       f"{statistics.median(each):.2f}×, ratio of the median times {trl / tba:.2f}× (TRL {trl:.1f} s, "
                       f"tba {tba:.1f} s)")
    out += ["", "Every evaluation (held-out score % at clock s):", "", "| system | seed | update: score % (s) |",
            "|---|---|---|"]
    out += [f"| {r['system']} | {r['seed']} | " + ", ".join(f"{e[0]}: {e[1]:.1%} ({e[2]:.0f} s)" for e in r["evals"])
            + " |" for r in rows]
    return "\n".join(out)


def score_at(evals: list, seconds: float) -> float:
    """Accuracy of the last evaluation at or before `seconds` of training clock (never a later one)."""
    return max(((e[2], e[1]) for e in evals if e[2] <= seconds), default=(0.0, evals[0][1]))[1]


def plot(rows: list[dict], path: Path, budget: float, target: float) -> None:
    """Held-out accuracy vs training wall-clock per system: the median over seeds (bold) and each seed (thin),
    which shows a bimodal outcome — some seeds learn, some do not — that a min-max band would hide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [budget * i / 200 for i in range(201)]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for system in dict.fromkeys(r["system"] for r in rows):
        runs = [r["evals"] for r in rows if r["system"] == system]
        curves = [[score_at(ev, t) for ev in runs] for t in grid]
        (line,) = ax.plot(grid, [statistics.median(c) for c in curves], linewidth=2.2,
                          label=f"{system} (median of {len(runs)}; thin: each seed)")
        for i in range(len(runs)):
            ax.plot(grid, [c[i] for c in curves], color=line.get_color(), linewidth=0.8, alpha=0.45)
    ax.axhline(target, color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="training wall-clock (s, evaluation excluded)", ylabel="held-out greedy pass@1", ylim=(0, 1))
    ax.legend(loc="center right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge(args, argv: list[str] | None = None) -> int:
    """--merge: the union of several results files' rows (a seed in two files is an error), one report."""
    if args.budget_s is None or args.results is None:
        raise SystemExit("--merge needs --budget-s (the budget the runs used) and --results")
    picks = [merge_source(x) for x in args.merge]
    rows = [r for path, system in picks for r in raw_rows(path) if system in (None, r["system"])]
    counts = collections.Counter((r["system"], r["seed"]) for r in rows)
    if dupes := sorted(k for k, n in counts.items() if n > 1):
        raise SystemExit(f"--merge: {dupes} occur in more than one file")
    args.seeds = sorted({r["seed"] for r in rows})
    md = report(rows, args)
    print(md)
    sources = ", ".join(f"[{p.name}]({p.name})" + (f" ({s} rows only)" if s else "") for p, s in picks)
    head = header(__spec__.name, f"merged from {sources} (their raw rows; each file names its command, machine "
                  "and clocks)", title="bench/perf/vs_trl.py --merge", argv=argv, packages=())
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")
    plot(rows, figure(args), args.budget_s, args.target)
    return 0


SYSTEMS = ("tba", "tba-sync", "trl-grpo")
"""The `system` of a raw row."""


def merge_source(arg: str) -> tuple[Path, str | None]:
    """A --merge argument: FILE, or FILE:SYSTEM for that system's rows only (e.g. TRL's rows of an earlier file
    beside a --no-trl run of tba with another setting)."""
    path, _, system = arg.rpartition(":")
    if path and system in SYSTEMS:
        return Path(path), system
    return Path(arg), None


def figure(args) -> Path:
    """Where the figure goes: the run directory (--out), named after the results file; never bench/results/."""
    args.out.mkdir(parents=True, exist_ok=True)
    return args.out / (args.results or args.replot).with_suffix(".png").name


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="recipe (path or packaged name); default: the embedded default")
    ap.add_argument("--tba-sync", action="store_true", help="also run tba sync (runtime=inline mode=sync)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--target", type=float, default=0.6)
    ap.add_argument("--budget-s", type=float, default=None, help="default 60 (--smoke: 10)")
    ap.add_argument("--eval-every", type=int, default=None, help="default 10 (--smoke: 5)")
    ap.add_argument("--tba-steps", type=int, default=None, help="tba trainer.steps (default: the recipe's)")
    ap.add_argument("--trl-threads", type=int, default=None, help="TRL torch threads (default all cores; --smoke 1)")
    ap.add_argument("--startup", action="store_true", help="clocks from launch: each system's start-up (tba: models "
                    "and searchers ready; TRL: model load and trainer set-up) counted")
    ap.add_argument("--same-updates", action="store_true", help="TRL runs the recipe's trainer.steps updates with its "
                    "lr schedule (default: TRL at constant lr until the budget)")
    ap.add_argument("--smoke", action="store_true", help="tiny task, 10-step SFT, 10 tba steps: seconds")
    ap.add_argument("--out", type=Path, default=OUT / "vs_trl")
    ap.add_argument("--results", type=Path, default=None,
                    help="default bench/results/vs_trl/vs_trl.md (--smoke: bench/_out/vs_trl/smoke.md)")
    ap.add_argument("overrides", nargs="*", help="tba config overrides key=value (also shape TRL's settings)")
    ap.add_argument("--replot", type=Path, default=None, help="only redraw the figure of an existing results file")
    ap.add_argument("--merge", nargs="+", default=None,
                    help="no runs: one table and figure (--results) from the raw rows of these results files, "
                         "e.g. seeds run in two invocations with the same command otherwise; FILE:SYSTEM takes "
                         "that system's rows only")
    ap.add_argument("--no-trl", action="store_true", help="run tba only (its rows can be merged with TRL's rows of "
                    "an earlier file, which TRL's settings must then match: --merge NEW.md OLD.md:trl-grpo)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        rows = raw_rows(args.replot)
        plot(rows, figure(args), args.budget_s or max(r["train_s"] for r in rows), args.target)
        return 0
    if args.merge:
        return merge(args, argv)
    args.budget_s = args.budget_s or (10.0 if args.smoke else 60.0)
    args.eval_every = args.eval_every or (5 if args.smoke else 10)
    args.trl_threads = args.trl_threads or (1 if args.smoke else os.cpu_count() or 1)
    args.results = args.results or (args.out / "smoke.md" if args.smoke else RESULTS / "vs_trl" / "vs_trl.md")
    overrides = (SMOKE if args.smoke else []) + args.overrides
    if args.tba_steps:
        overrides.append(f"trainer.steps={args.tba_steps}")
    rows = []
    fork_server_ready(load_config(args.config, overrides))
    for seed in args.seeds:
        cfg = load_config(args.config, [f"seed={seed}", f"output_dir={args.out / f'tba-seed{seed}'}",
                                        "logging.progress=false", f"eval.every_steps={args.eval_every}", *overrides])
        sft_dir, task = starting_point(cfg)
        rows.append(summarise("tba", seed, run_tba(cfg, args, seed), args))
        if args.tba_sync:
            sync = load_config(args.config, [f"seed={seed}", f"output_dir={args.out / f'tba-sync-seed{seed}'}",
                                             "logging.progress=false", f"eval.every_steps={args.eval_every}",
                                             *overrides, "runtime=inline", "mode=sync"])
            rows.append(summarise("tba-sync", seed, run_tba(sync, args, seed), args))
        if not args.no_trl:
            rows.append(summarise("trl-grpo", seed, run_trl(cfg, task, sft_dir, args, seed), args))
    md = report(rows, args)
    print(md)
    clocks = ("from launch: tba's start-up (models built, searchers started and ready) and TRL's (model load, "
              "trainer set-up) included" if args.startup else "tba from its searchers being ready (their start-up "
              "excluded), TRL from on_train_begin")
    head = header(__spec__.name, f"clocks: evaluation excluded; {clocks}; tba's prefill included; only evaluations "
                  f"at or before the {args.budget_s:.0f} s budget count. The script docstring lists every known "
                  "unfairness.", argv=argv, packages=("torch", "transformers", "trl"))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")
    plot(rows, figure(args), args.budget_s, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
