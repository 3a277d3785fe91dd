"""In-flight weight updates need no correction for TB: exact KL(π* ‖ π_θ) on the enumerable tasks when the
trainer's weights land in the middle of responses, against the same runs with between-batch updates.

Every run is asynchronous (runtime=local, mode=async: one searcher process beside the trainer), the searcher
synced after every update (trainer.sync_every_steps=1), so a new version is published every update:

    between batches     static batching; weights load only before a batch (every sample from one version)
    in flight           enumerable: continuous batching with search.weight_update=in_flight — the searcher loads
                        a newer version before any decode step, rows in flight go on with their cached keys and
                        values; enumerable_turns: static batches, weights loaded before every turn of an episode
                        (search.weight_update=in_flight). Samples then span versions (`mixed` = the share of
                        drawn samples whose tokens came from more than one version).
    in flight, mid-turn enumerable_turns only: continuous batching of episodes (tba.rollout.episode_stream) with
                        in-flight updates — weights land before any decode step, inside a turn too, the episode's
                        KV cache kept across turns and versions.

TB reads no behaviour log-probs; Dr. GRPO's ratio uses the per-token behaviour log-probs that were actually
sampled (each token's own version's), reported as it comes for comparison.

    python -m bench.claims.in_flight --seeds 6 7 8 [--tasks enumerable enumerable_turns] [--objectives tb drgrpo]

Runs one at a time (each is two processes on two cores). Writes bench/results/in_flight/in_flight.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.claims.fixed_point import mean_sd
from bench.lib.header import header
from bench.lib.paths import OUT, RESULTS

TASKS = {"enumerable": "enumerable_cpu", "enumerable_turns": "enumerable_turns_cpu"}
CONDITIONS = {
    "between batches": {"enumerable": ["search.batching=static", "search.weight_update=between_batches"],
                        "enumerable_turns": ["search.weight_update=between_batches"]},
    "in flight": {"enumerable": ["search.batching=continuous", "search.weight_update=in_flight"],
                  "enumerable_turns": ["search.weight_update=in_flight"]},
    "in flight, mid-turn": {"enumerable_turns": ["search.batching=continuous", "search.weight_update=in_flight"]},
}
"""A condition without a task's entry is not run for that task."""
SMOKE = ["trainer.steps=4", "eval.every_steps=2"]


def run_one(job: dict) -> dict:
    from tba.config import load_config
    from tba.run.train import train

    cfg = load_config(TASKS[job["task"]], [f"seed={job['seed']}", f"objective={job['objective']}",
                                           f"output_dir={job['out']}", *CONDITIONS[job["condition"]][job["task"]],
                                           "runtime=local", "mode=async", "trainer.sync_every_steps=1",
                                           "logging.progress=false", "logging.tensorboard=false",
                                           "buffer.persist=false", *job["overrides"]])
    s = train(cfg, overwrite=True)
    metrics = [json.loads(x) for x in (Path(job["out"]) / "metrics.jsonl").read_text().splitlines()]
    curve = [(0, s["eval_start"]["kl_to_target"])]
    curve += [(m["step"], m["eval/kl_to_target"]) for m in metrics if m.get("eval/kl_to_target") is not None]
    return {**{k: job[k] for k in ("task", "condition", "objective", "seed")}, "kl": curve,
            "kl_reverse": s["eval_end"]["kl_reverse"], "expected_reward": s["eval_end"]["expected_reward"],
            "mixed": statistics.mean(m["staleness/mixed_fraction"] for m in metrics),
            "staleness_mean": statistics.mean(m["staleness/mean"] for m in metrics),
            "token_staleness_mean": statistics.mean(m["staleness/token_mean"] for m in metrics),
            "train_s": s["train_wall_clock_s"]}


def table(rows: list[dict]) -> str:
    out = ["### Final KL(π* ‖ π_θ), nats: mean ± std over seeds [worst seed]; mixed = share of drawn samples "
           "spanning versions\n",
           "| task | condition | objective | final KL | worst seed | mixed | staleness (first token / per token) |",
           "|---|---|---|---|---|---|---|"]
    keys = sorted({(r["task"], r["condition"], r["objective"]) for r in rows},
                  key=lambda k: (list(TASKS).index(k[0]), list(CONDITIONS).index(k[1]), k[2]))
    for task, cond, obj in keys:
        mine = [r for r in rows if (r["task"], r["condition"], r["objective"]) == (task, cond, obj)]
        finals = [r["kl"][-1][1] for r in mine]
        worst = max(mine, key=lambda r: r["kl"][-1][1])
        out.append(f"| {task} | {cond} | {obj} | {mean_sd(finals, '{:.4f}')} | {worst['kl'][-1][1]:.4f} "
                   f"(seed {worst['seed']}) | {statistics.mean(r['mixed'] for r in mine):.2f} | "
                   f"{statistics.mean(r['staleness_mean'] for r in mine):.2f} / "
                   f"{statistics.mean(r['token_staleness_mean'] for r in mine):.2f} |")
    out += ["", "### Per seed: KL along the run\n", "| task | condition | objective | seed | KL at each eval | final |",
            "|---|---|---|---|---|---|"]
    for r in rows:
        curve = " ".join(f"{v:.3g}" for _, v in r["kl"])
        out.append(f"| {r['task']} | {r['condition']} | {r['objective']} | {r['seed']} | {curve} | "
                   f"**{r['kl'][-1][1]:.4f}** |")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[6, 7, 8])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    ap.add_argument("--objectives", nargs="+", default=["tb", "dr_grpo"])
    ap.add_argument("--out", type=Path, default=OUT / "in_flight")
    ap.add_argument("--results", type=Path, default=RESULTS / "in_flight" / "in_flight.md")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    ap.add_argument("overrides", nargs="*", help="extra config overrides, e.g. trainer.steps=600")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    overrides = [*SMOKE, *args.overrides] if args.smoke else list(args.overrides)
    rows = []
    for task in args.tasks:
        for cond in [c for c in args.conditions if task in CONDITIONS[c]]:
            for obj in args.objectives:
                for seed in args.seeds:
                    job = {"task": task, "condition": cond, "objective": obj, "seed": seed, "overrides": overrides,
                           "out": str(args.out / f"{task}-{cond.replace(' ', '_')}-{obj}-s{seed}")}
                    row = run_one(job)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    md = table(rows)
    print(md)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    head = header(__spec__.name, "recipes enumerable_cpu / enumerable_turns_cpu at runtime=local mode=async, "
                  f"sync every update; seeds {args.seeds} (never run before this benchmark)", argv=argv)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
