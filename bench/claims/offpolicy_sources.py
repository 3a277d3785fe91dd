"""Learning from data any policy produced: where each objective stands when the samples come from quantized
searchers, from several behaviour policies at once, or partly from a fixed set of demonstrations.

    python -m bench.claims.offpolicy_sources enumerable --seeds 0 1 2 [--workers 2] [key=value ...]
    python -m bench.claims.offpolicy_sources hard --seeds 0 1 2 3 4 [key=value ...]
    python -m bench.claims.offpolicy_sources smollm2 --fp DIR --int8 DIR
    python -m bench.claims.offpolicy_sources enumerable --smoke       # seconds (CI); the numbers mean nothing

`enumerable` (the task whose target π* is known exactly: KL(π* ‖ π_θ) over every response), every objective,
inline runtime (deterministic), 600 updates by default:

    k=1             the reference: searchers synced every update, full precision
    int8            the same, searchers sampling from an int8 copy of each published policy (search.quantize)
    mix of three    three behaviours feeding one buffer: the policy (synced), π_ref at T = 1.5 (fixed,
                    "pi_ref_hot") and a foreign policy (another random init of the same model, fixed)
    data 20 %, 50 % a fixed demonstration set (the task's 3 reward modes and 9 other responses, rewarded by the
                    task) drawn at that share of the samples beside the synced searchers'

An objective that needs behaviour log-probs (Dr. GRPO, TBA′) refuses demonstrations, which have none: the table
says so instead of leaving the row out.

`hard` (`arith_hard_cpu`, the async local runtime, one run at a time so its clock is its own), 300 updates by
default: TB and Dr. GRPO with full-precision and int8 searchers; TB with the task's demonstrations (its noisy SFT
teacher's, only those its reward scores correct: data.min_reward=1) at 5 % and 20 % of the draws; TB with gold
demonstrations (a jsonl file of every train prompt's correct column-addition solution, as an expert's logged data
would be) at 5 % and 20 %. Updates and training seconds to 60 % held-out accuracy, and the final accuracy.
`--reuse FILE` takes the finished (condition, seed) rows of an earlier hard results file, or of the rows.jsonl a
hard run keeps in its --out folder as each run ends, and runs only the rest.

`smollm2` compares two finished `bench.claims.smollm2_seeds` run folders (their --out, each with
seed<N>/summary.json and metrics.jsonl; SmolLM2-135M on reasoning-gym two-digit sums, `smollm2_rg_cpu`):
full-precision and int8 searchers, per seed: final held-out score, wall clock, and the searcher's generated
tokens per second of generation.

Writes bench/results/offpolicy_sources/<part>.md (enumerable and hard also a plot, in --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import OUT, RESULTS
from bench.lib.smoke import SMOKE_OVERRIDES
from bench.lib.workers import worker_pool
from tba.algorithm.objectives import OBJECTIVES as REGISTRY

OBJECTIVES = list(REGISTRY)
ENUMERABLE: dict[str, list[str]] = {
    "k=1": ["trainer.sync_every_steps=1"],
    "int8": ["trainer.sync_every_steps=1", "search.quantize=int8"],
    "mix of three": ["trainer.sync_every_steps=1", "search.generations_per_prompt=22",
                     "search.groups=[{name: policy}, {name: pi_ref_hot, temperature: 1.5, sync: false}, "
                     "{name: foreign, policy: FOREIGN}]"],
    "data 20 %": ["trainer.sync_every_steps=1", "data.source=DEMOS", "data.share=0.2"],
    "data 50 %": ["trainer.sync_every_steps=1", "data.source=DEMOS", "data.share=0.5"],
}
HARD: dict[str, tuple[str, list[str]]] = {
    "TB, fp": ("tb", []),
    "TB, int8": ("tb", ["search.quantize=int8"]),
    "Dr. GRPO, fp": ("dr_grpo", []),
    "Dr. GRPO, int8": ("dr_grpo", ["search.quantize=int8"]),
    "TB, data 5 %": ("tb", ["data.source=task", "data.min_reward=1.0", "data.bad_rows=skip", "data.share=0.05"]),
    "TB, data 20 %": ("tb", ["data.source=task", "data.min_reward=1.0", "data.bad_rows=skip", "data.share=0.2"]),
    "TB, gold 5 %": ("tb", ["data.source=GOLD", "data.name=gold", "data.share=0.05"]),
    "TB, gold 20 %": ("tb", ["data.source=GOLD", "data.name=gold", "data.share=0.2"]),
}
QUIET = ["logging.progress=false", "logging.tensorboard=false"]


# ---- enumerable ----------------------------------------------------------------------------------------------
def enumerable_inputs(out: Path, seed: int, config: str) -> dict[str, str]:
    """The foreign policy (another init of the run's model, the run's tokenizer) and the demonstration file."""
    from tba.config import load_config
    from tba.models import save_checkpoint
    from tba.run.build import build_models, build_task

    cfg = load_config(config, [f"seed={1000 + seed}"])
    task = build_task(cfg)
    foreign = out / f"foreign-s{seed}"
    if not (foreign / "config.json").is_file():
        tokenizer, policy, _, _ = build_models(cfg, task)
        save_checkpoint(policy, tokenizer, foreign)
    demos = out / "demonstrations.jsonl"
    if not demos.is_file():
        others = [s for s in ("000", "012", "111", "120", "201", "222", "02", "1", "21") if s not in task.task.centres]
        rows = [{"prompt": task.train[0].text, "completion": c} for c in [*task.task.centres, *others]]
        demos.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"FOREIGN": str(foreign), "DEMOS": str(demos)}


def run_enumerable(job: dict) -> dict:
    import torch

    from tba.config import ConfigError, load_config
    from tba.run.train import train

    torch.set_num_threads(1)
    overrides = [o.replace("FOREIGN", job["foreign"]).replace("DEMOS", job["demos"])
                 for o in ENUMERABLE[job["condition"]]]
    row = {"objective": job["objective"], "condition": job["condition"], "seed": job["seed"]}
    try:
        cfg = load_config(job["config"], [f"seed={job['seed']}", f"objective={job['objective']}",
                                          f"output_dir={job['out']}", "runtime=inline", "mode=sync", "threads=1",
                                          "search.threads=1", "buffer.persist=false", *QUIET, *overrides,
                                          *job["overrides"]])
    except ConfigError as e:
        return {**row, "refused": str(e)}
    s = train(cfg, overwrite=True)
    metrics = [json.loads(x) for x in (Path(job["out"]) / "metrics.jsonl").read_text().splitlines()]
    curve = [(0, s["eval_start"]["kl_to_target"])]
    curve += [(m["step"], m["eval/kl_to_target"]) for m in metrics if m.get("eval/kl_to_target") is not None]
    shares = {k.split("/")[1]: statistics.mean(m[k] for m in metrics if m.get(k) is not None)
              for k in metrics[-1] if k.startswith("source/") and k.endswith("/draw_share")}
    return {**row, "kl": curve, "kl_reverse": s["eval_end"]["kl_reverse"],
            "expected_reward": s["eval_end"]["expected_reward"], "draw_shares": shares,
            "quantize_s": metrics[-1].get("searcher/quantize_s", 0.0), "train_s": s["train_wall_clock_s"]}


def enumerable_table(rows: list[dict], conditions: list[str]) -> str:
    objectives = [o for o in OBJECTIVES if any(r["objective"] == o for r in rows)]
    out = ["## Final KL(π* ‖ π_θ), nats: mean over seeds [worst seed]\n",
           "| condition | " + " | ".join(objectives) + " |", "|---" * (1 + len(objectives)) + "|"]
    for c in conditions:
        cells = []
        for o in objectives:
            runs = [r for r in rows if (r["condition"], r["objective"]) == (c, o)]
            if runs and all("refused" in r for r in runs):
                cells.append("refused¹")
            else:
                finals = [r["kl"][-1][1] for r in runs if "kl" in r]
                cells.append(f"{statistics.mean(finals):.4f} [{max(finals):.4f}]" if finals else "—")
        out.append(f"| {c} | " + " | ".join(cells) + " |")
    steps = next((" ".join(str(s) for s, _ in r["kl"]) for r in rows if "kl" in r), "")
    out += ["", f"## Per seed: KL(π* ‖ π_θ) at updates {steps}\n",
            "| condition | objective | seed | KL along the run | final | draw shares by source |", "|---" * 6 + "|"]
    for c in conditions:
        for r in rows:
            if r["condition"] == c and "kl" in r:
                shares = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["draw_shares"].items())) or "—"
                curve = " ".join(f"{v:.3g}" for _, v in r["kl"])
                out.append(f"| {c} | {r['objective']} | {r['seed']} | {curve} | **{r['kl'][-1][1]:.4f}** | {shares} |")
    refused = sorted({r["refused"] for r in rows if "refused" in r})
    if refused:
        out += ["", "¹ The run stops before it starts, with: " + "; ".join(f"`{m}`" for m in refused)]
    return "\n".join(out)


def plot_enumerable(rows: list[dict], conditions: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(conditions), figsize=(4.0 * len(conditions), 3.4), sharey=True, squeeze=False)
    for ax, c in zip(axes[0], conditions, strict=True):
        for i, obj in enumerate(OBJECTIVES):
            runs = [r for r in rows if (r["condition"], r["objective"]) == (c, obj) and "kl" in r]
            for j, r in enumerate(runs):
                xs, ys = zip(*r["kl"], strict=True)
                ax.plot(xs, [max(y, 1e-4) for y in ys], color=f"C{i}", lw=1, label=obj if j == 0 else None)
        ax.set_yscale("log")
        ax.set_title(c, fontsize=10)
        ax.set_xlabel("updates")
    axes[0][0].set_ylabel("KL(π* ‖ π_θ), nats")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def enumerable(args) -> str:
    args.out.mkdir(parents=True, exist_ok=True)
    inputs = {s: enumerable_inputs(args.out, s, args.config) for s in args.seeds}
    conditions = args.conditions or list(ENUMERABLE)
    jobs = [{"objective": o, "condition": c, "seed": s, "config": args.config, "overrides": args.overrides,
             "foreign": inputs[s]["FOREIGN"], "demos": inputs[s]["DEMOS"],
             "out": str(args.out / f"{o}-{c.replace(' ', '_').replace('%', 'pc')}-s{s}")}
            for s in args.seeds for c in conditions for o in args.objectives]
    rows = []
    with worker_pool(args.workers) as pool:
        for row in pool.map(run_enumerable, jobs):
            print(json.dumps({k: v for k, v in row.items() if k != "kl"}), flush=True)
            rows.append(row)
    rows.sort(key=lambda r: (conditions.index(r["condition"]), OBJECTIVES.index(r["objective"]), r["seed"]))
    args.out.mkdir(parents=True, exist_ok=True)
    plot_enumerable(rows, conditions, args.out / args.results.with_suffix(".png").name)
    head = header(__spec__.name, f"recipe: {args.config}, inline runtime, one thread per run; seeds {args.seeds}; "
                  "every objective shares lr, β, B, K and the start π_ref", argv=args.argv)
    return head + enumerable_table(rows, conditions) + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n"


# ---- hard ----------------------------------------------------------------------------------------------------
def first_at(evals: list, target: float) -> tuple[int | None, float | None]:
    """(update, training seconds) of the first evaluation at or above `target`; (None, None) if never."""
    return next(((step, train_s) for step, score, train_s in evals if score >= target), (None, None))


def run_hard(job: dict) -> dict:
    from tba.config import load_config
    from tba.run.build import build_task as task_of
    from tba.run.build import warm_start
    from tba.run.train import train

    cfg = load_config(job["config"], [f"seed={job['seed']}", f"objective={job['objective']}",
                                      f"output_dir={job['out']}", *QUIET, *job["overrides"]])
    if cfg.model.policy == "builtin" and cfg.sft.enabled:  # cached: the same warm start for every condition
        warm_start(cfg, task_of(cfg))
    s = train(cfg, overwrite=True)
    metrics = [json.loads(x) for x in (Path(job["out"]) / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    update, seconds = first_at(s["evals"], job["target"])
    return {"condition": job["condition"], "seed": job["seed"], "start": s["score_start"], "final": s["score_end"],
            "updates_to_target": update, "seconds_to_target": seconds, "evals": s["evals"],
            "train_s": s["train_wall_clock_s"], "wall_s": s["wall_clock_s"],
            "searcher_tokens_per_s": last["searcher/tokens"] / max(last["searcher/generate_s"], 1e-9),
            "quantize_s": last.get("searcher/quantize_s", 0.0), "samples_received": s["samples_received"],
            "sources": s.get("sources"), "data": s.get("data")}


def _median(values: list) -> str:
    kept = [v for v in values if v is not None]
    if len(kept) < len(values):
        return f"— ({len(values) - len(kept)} of {len(values)} never)" if not kept else \
            f"{statistics.median(kept):.0f} ({len(values) - len(kept)} never)"
    return f"{statistics.median(kept):.0f}"


def against_tb_fp(rows: list[dict], conditions: list[str]) -> list[str]:
    """Each condition against TB with full-precision searchers on the same seed: updates to the target (a ratio;
    a run that never got there counts as the run's length, so the ratio is then a bound) and final accuracy."""
    base = {r["seed"]: r for r in rows if r["condition"] == "TB, fp"}
    if not base:
        return []
    out = ["## Against TB with full-precision searchers, seed by seed\n",
           "| condition | updates to target ÷ TB fp's: median [per seed] | final − TB fp's, points: median [worst] |",
           "|---|---|---|"]
    for c in conditions:
        runs = [r for r in rows if r["condition"] == c and r["seed"] in base and c != "TB, fp"]
        if not runs:
            continue
        ratios, diffs = [], []
        for r in runs:
            b, length = base[r["seed"]], r["evals"][-1][0]
            ratios.append((r["updates_to_target"] or length) / (b["updates_to_target"] or length))
            diffs.append(100 * (r["final"] - b["final"]))
        out.append(f"| {c} | {statistics.median(ratios):.2f} [{' '.join(f'{x:.2f}' for x in ratios)}] | "
                   f"{statistics.median(diffs):+.1f} [{min(diffs):+.1f}] |")
    return out


def hard_table(rows: list[dict], conditions: list[str], target: float) -> str:
    out = [f"## To {target:.0%} held-out accuracy, and the end (medians over seeds; worst seed in brackets)\n",
           "| condition | updates to target | training s to target | final accuracy [worst] | searcher tokens/s | "
           "quantize s per run |", "|---" * 6 + "|"]
    for c in conditions:
        runs = [r for r in rows if r["condition"] == c]
        finals = [r["final"] for r in runs]
        out.append(f"| {c} | {_median([r['updates_to_target'] for r in runs])} | "
                   f"{_median([r['seconds_to_target'] for r in runs])} | {statistics.median(finals):.1%} "
                   f"[{min(finals):.1%}] | {statistics.median(r['searcher_tokens_per_s'] for r in runs):.0f} | "
                   f"{statistics.median(r['quantize_s'] for r in runs):.1f} |")
    out += ["", *against_tb_fp(rows, conditions)]
    steps = [s for s, _, _ in rows[0]["evals"]]
    out += ["", f"## Per seed: held-out accuracy (%) at updates {', '.join(map(str, steps))}\n",
            "| condition | seed | accuracy along the run | final | updates / s to target |", "|---" * 5 + "|"]
    for c in conditions:
        for r in rows:
            if r["condition"] == c:
                curve = " ".join(f"{100 * score:.1f}" for _, score, _ in r["evals"])
                to = (f"{r['updates_to_target']} / {r['seconds_to_target']:.0f}" if r["updates_to_target"] is not None
                      else "never")
                out.append(f"| {c} | {r['seed']} | {curve} | **{100 * r['final']:.1f}** | {to} |")
    return "\n".join(out)


def plot_hard(rows: list[dict], conditions: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, c in enumerate(conditions):
        for j, r in enumerate(r for r in rows if r["condition"] == c):
            steps, scores, secs = zip(*r["evals"], strict=True)
            kw = {"color": f"C{i}", "lw": 1, "label": c if j == 0 else None}
            axes[0].plot(steps, scores, **kw)
            axes[1].plot(secs, scores, **kw)
    axes[0].set_xlabel("updates")
    axes[1].set_xlabel("training seconds (evaluation excluded)")
    for ax in axes:
        ax.set_ylabel("held-out accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def gold_demonstrations(out: Path, config: str) -> str:
    """Every train prompt with its correct solution in the task's own format (the teacher, never slipping)."""
    import random

    from tba.config import load_config
    from tba.run.build import build_task
    from tba.tasks.arith import teacher_solution

    path = out / "gold_demonstrations.jsonl"
    if not path.is_file():
        task, rng = build_task(load_config(config)), random.Random(0)
        rows = [{"prompt": p.text, "completion": teacher_solution(p.meta["a"], p.meta["b"], 0.0, rng)}
                for p in task.train]
        out.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def hard(args) -> str:
    conditions = args.conditions or list(HARD)
    args.out.mkdir(parents=True, exist_ok=True)
    done = {(r["condition"], r["seed"]): r for r in (raw_rows(args.reuse) if args.reuse else [])}
    gold = gold_demonstrations(args.out, args.config) if any("gold" in c for c in conditions) else ""
    rows = []
    for seed in args.seeds:  # seed-major: machine noise spreads over the conditions, not onto one of them
        for c in conditions:
            if (c, seed) in done:
                rows.append(done[(c, seed)])
                continue
            objective, overrides = HARD[c]
            overrides = [o.replace("GOLD", gold) for o in overrides]
            job = {"condition": c, "seed": seed, "objective": objective, "config": args.config,
                   "overrides": [*overrides, *args.overrides], "target": args.target,
                   "out": str(args.out / f"{c.replace(' ', '_').replace(',', '').replace('%', 'pc')}-s{seed}")}
            rows.append(run_hard(job))
            with open(args.out / "rows.jsonl", "a") as f:  # kept as each run ends: --reuse picks them up
                f.write(json.dumps(rows[-1]) + "\n")
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "evals"}), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    plot_hard(rows, conditions, args.out / args.results.with_suffix(".png").name)
    head = header(__spec__.name, f"recipe: {args.config} (async local runtime: one searcher process and the trainer "
                  f"on the 2 cores), one run at a time; seeds {args.seeds}", argv=args.argv)
    return head + hard_table(rows, conditions, args.target) + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n"


def raw_rows(path: Path) -> list[dict]:
    """The rows of a results file (its json block) or of a run folder's rows.jsonl."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0])


# ---- smollm2 -------------------------------------------------------------------------------------------------
def smollm2(args) -> str:
    """Per seed, from two finished smollm2_seeds run folders (--out; each seed's summary.json and metrics.jsonl)."""
    lines = ["| seed | final, fp | final, int8 | int8 − fp | wall s, fp | wall s, int8 | searcher tokens/s, fp | "
             "searcher tokens/s, int8 | quantize s (int8) |", "|---" * 9 + "|"]
    rows = []
    for seed in args.seeds:
        row = {"seed": seed}
        for name, folder in (("fp", args.fp), ("int8", args.int8)):
            summary = json.loads((folder / f"seed{seed}" / "summary.json").read_text())
            last = json.loads((folder / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()[-1])
            row[name] = {"final": summary["score_end"], "wall_s": summary["wall_clock_s"],
                         "tokens_per_s": last["searcher/tokens"] / last["searcher/generate_s"],
                         "quantize_s": last.get("searcher/quantize_s", 0.0)}
        rows.append(row)
        fp, q = row["fp"], row["int8"]
        lines.append(f"| {seed} | {100 * fp['final']:.1f} | {100 * q['final']:.1f} | "
                     f"{100 * (q['final'] - fp['final']):+.1f} | {fp['wall_s']:.0f} | {q['wall_s']:.0f} | "
                     f"{fp['tokens_per_s']:.0f} | {q['tokens_per_s']:.0f} | {q['quantize_s']:.0f} |")
    diffs = [100 * (r["int8"]["final"] - r["fp"]["final"]) for r in rows]
    ratio = [r["int8"]["tokens_per_s"] / r["fp"]["tokens_per_s"] for r in rows]
    lines += ["", f"int8 − fp final held-out score: median {statistics.median(diffs):+.1f}, worst {min(diffs):+.1f} "
              f"points; searcher tokens/s int8 ÷ fp: median {statistics.median(ratio):.2f}× (worst {min(ratio):.2f}×)."]
    head = header(__spec__.name, f"full precision: [{args.fp}]({args.fp}), int8: [{args.int8}]({args.int8}) "
                  "(each seed's summary.json and metrics.jsonl)", title="SmolLM2-135M, int8 vs full-precision "
                  "searchers (`smollm2_rg_cpu`)", argv=args.argv)
    return head + "\n".join(lines) + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["enumerable", "hard", "smollm2"])
    ap.add_argument("--config", default=None, help="recipe (default: enumerable_cpu, arith_hard_cpu)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--conditions", nargs="+", default=None, help="a subset of the part's conditions")
    ap.add_argument("--objectives", nargs="+", default=OBJECTIVES, choices=OBJECTIVES, help="enumerable only")
    ap.add_argument("--workers", type=int, default=2, help="enumerable only: runs at a time, one thread each")
    ap.add_argument("--target", type=float, default=0.6, help="hard only: the held-out accuracy to reach")
    ap.add_argument("--fp", type=Path, help="smollm2: the full-precision runs' folder (seed<N>/)")
    ap.add_argument("--int8", type=Path, help="smollm2: the int8 runs' folder (seed<N>/)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--results", type=Path, default=None)
    ap.add_argument("--reuse", type=Path, default=None, help="hard: an earlier results file whose rows are kept")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    ap.add_argument("overrides", nargs="*", help="extra config overrides, e.g. trainer.steps=600")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line as main() reads it, checked (a condition the part does not have is an error)."""
    args = build_parser().parse_intermixed_args(argv)
    args.argv = argv
    args.config = args.config or {"enumerable": "enumerable_cpu", "hard": "arith_hard_cpu"}.get(args.part)
    args.out = args.out or OUT / f"offpolicy_sources_{args.part}"
    args.results = args.results or RESULTS / "offpolicy_sources" / f"{args.part}.md"
    if args.smoke and args.part == "enumerable":
        args.overrides = ["trainer.steps=4", "eval.every_steps=2", *args.overrides]
    elif args.smoke:
        keep = [o for o in SMOKE_OVERRIDES if not o.startswith("search.max_new_tokens")]  # demonstrations fit
        args.overrides = [*keep, "trainer.steps=4", "eval.every_steps=2",
                          f"sft.cache_dir={args.out / 'sft-cache'}", *args.overrides]
    if args.conditions:
        known = list(ENUMERABLE if args.part == "enumerable" else HARD)
        if unknown := [c for c in args.conditions if c not in known]:
            raise SystemExit(f"unknown conditions {unknown}; {args.part} has {known}")
    if args.part == "smollm2" and not (args.fp and args.int8):
        raise SystemExit("smollm2: give --fp and --int8 (two finished bench.claims.smollm2_seeds --out folders)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    text = {"enumerable": enumerable, "hard": hard, "smollm2": smollm2}[args.part](args)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(text)
    print(text.split("```json")[0])


if __name__ == "__main__":
    main()
