"""How much the trainer waits for samples, and how stale they are, with each searcher setting: the same
asynchronous run (runtime=local, mode=async, one searcher) with static batching and between-batch updates (the
default), continuous batching with between-batch updates, and continuous batching with in-flight updates, the
caches of rows in flight kept (the default) or recomputed after each load (search.in_flight_cache: what that costs
shows in the samples received per second).

    python -m bench.perf.trainer_idle --recipe smollm2_rg_cpu --seeds 0 trainer.steps=30
    python -m bench.perf.trainer_idle --smoke      # the tiny default recipe, seconds (CI); the numbers mean nothing

Per run, from its summary.json and metrics.jsonl: trainer_busy_fraction (the share of the training clock the
trainer spent updating rather than waiting for samples: 1 − idle), samples received per second of training, the
replay ratio, the mean staleness (first token / per token) and the share of drawn samples that span versions.
Evaluation is switched off (eval.every_steps above the run; the start and end evaluations score 20 held-out
problems) so the training clock measures search and training only.
Writes --results (default bench/results/continuous/trainer_idle.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import OUT, RESULTS

SETTINGS = {
    "static, between batches": ["search.batching=static", "search.weight_update=between_batches"],
    "continuous, between batches": ["search.batching=continuous", "search.weight_update=between_batches"],
    "continuous, in flight": ["search.batching=continuous", "search.weight_update=in_flight"],
    "continuous, in flight, caches recomputed": ["search.batching=continuous", "search.weight_update=in_flight",
                                                 "search.in_flight_cache=recompute"],
    "static, prompt per sample": ["search.batching=static", "search.weight_update=between_batches",
                                  "trainer.shared_prompts=false"],
    "static, bfloat16 autocast": ["search.batching=static", "search.weight_update=between_batches",
                                  "model.autocast=bfloat16"],
}
"""The last two change the trainer's side (tba.models.logprobs.grouped_logprobs, tba.models.precision): what
a faster part of the pair is worth when searcher and trainer share the machine's cores."""
SMOKE = ["trainer.steps=4", "sft.steps=2"]


def run_one(recipe: str, setting: str, seed: int, out: Path, overrides: list[str]) -> dict:
    from tba.config import load_config
    from tba.run.train import train

    cfg = load_config(recipe, [f"seed={seed}", f"output_dir={out}", *SETTINGS[setting], "runtime=local",
                               "mode=async", "logging.progress=false", "logging.tensorboard=false",
                               "eval.every_steps=100000", "task.test_size=20", *overrides])
    s = train(cfg, overwrite=True)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {"setting": setting, "seed": seed, "busy_fraction": s["trainer_busy_fraction"],
            "train_s": s["train_wall_clock_s"], "samples": s["samples_received"],
            "samples_per_s": s["samples_received"] / s["train_wall_clock_s"], "replay_ratio": s["replay_ratio"],
            "s_per_update": s["train_wall_clock_s"] / s["trainer_steps"],
            "step_s": statistics.median(m["trainer/step_s"] for m in metrics),
            "staleness": statistics.mean(m["staleness/mean"] for m in metrics),
            "token_staleness": statistics.mean(m["staleness/token_mean"] for m in metrics),
            "mixed": statistics.mean(m["staleness/mixed_fraction"] for m in metrics)}


def per_update(rs: list[dict]) -> str:
    """Wall seconds per update over the training clock, and the trainer's own step (rows of older files lack it)."""
    if any("s_per_update" not in r for r in rs):
        return "—"
    return (f"{statistics.median(r['s_per_update'] for r in rs):.2f} "
            f"({statistics.median(r['step_s'] for r in rs):.2f})")


def table(rows: list[dict]) -> str:
    out = ["| setting | trainer busy (idle) | samples received / s | replay ratio | staleness, first token / per "
           "token | drawn samples spanning versions | training clock | s per update (trainer's step, median) |",
           "|---|---|---|---|---|---|---|---|"]
    for setting in SETTINGS:
        rs = [r for r in rows if r["setting"] == setting]
        if not rs:
            continue
        busy = statistics.median(r["busy_fraction"] for r in rs)
        out.append(f"| {setting} | {busy:.0%} ({1 - busy:.0%}) | "
                   f"{statistics.median(r['samples_per_s'] for r in rs):.2f} | "
                   f"{statistics.median(r['replay_ratio'] for r in rs):.2f} | "
                   f"{statistics.median(r['staleness'] for r in rs):.2f} / "
                   f"{statistics.median(r['token_staleness'] for r in rs):.2f} | "
                   f"{statistics.median(r['mixed'] for r in rs):.0%} | "
                   f"{statistics.median(r['train_s'] for r in rs):.0f} s | {per_update(rs)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="smollm2_rg_cpu")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS)[:4], choices=list(SETTINGS),
                    help="default: the four searcher settings")
    ap.add_argument("--out", type=Path, default=OUT / "trainer_idle")
    ap.add_argument("--results", type=Path, default=RESULTS / "continuous" / "trainer_idle.md")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. trainer.steps=30")
    args = ap.parse_args(argv)
    recipe = "arith_tiny_cpu" if args.smoke else args.recipe
    overrides = [*SMOKE, *args.overrides] if args.smoke else list(args.overrides)
    rows = []
    for seed in args.seeds:
        for setting in args.settings:
            row = run_one(recipe, setting, seed, args.out / f"{setting.replace(', ', '-').replace(' ', '_')}-s{seed}",
                          overrides)
            print(json.dumps(row), flush=True)
            rows.append(row)
    md = table(rows)
    print(md)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    head = header(__spec__.name, f"recipe {recipe} at runtime=local mode=async, evaluation off; seeds {args.seeds}; "
                  "settings run one after another", argv=argv)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
