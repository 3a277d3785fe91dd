"""Does the default recipe learn, and is the gain RL's rather than more SFT's?

For each seed: the default recipe's SFT warm start (cached per seed), then `tba train` (TBA RL), then a
control that continues SFT from the same warm start for the same training wall-clock as RL took.
Held-out accuracy is greedy pass@1 on the recipe's test problems (500 by default).

    python -m bench.claims.learning --seeds 0 1 2 [key=value ...]
    python -m bench.claims.learning --smoke --seeds 0      # seconds (CI); the numbers mean nothing

Writes bench/results/learning/learning.md (table + machine, date, command) and prints the table.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
from pathlib import Path

import torch

from bench.lib.header import header
from bench.lib.paths import OUT, RESULTS
from bench.lib.smoke import SMOKE_OVERRIDES
from tba.config import load_config
from tba.rollout.evaluate import greedy_accuracy
from tba.run.build import build_models, build_task, warm_start
from tba.run.sft import train_sft
from tba.run.train import train


def run_seed(seed: int, overrides: list[str], out_root: Path) -> dict:
    cfg = load_config(None, [f"seed={seed}", f"output_dir={out_root / f'rl-seed{seed}'}",
                             "logging.progress=false", *overrides])
    summary = train(cfg, overwrite=True)
    budget = summary["train_wall_clock_s"]

    # control: continue SFT from the same warm start, same wall-clock budget, all cores (RL used them all too)
    torch.set_num_threads(os.cpu_count() or 1)
    task = build_task(cfg)
    tokenizer, policy, _, _ = build_models(cfg, task)
    sft_info = json.loads((warm_start(cfg, task) / "sft.json").read_text())  # the cached start's own record
    ctrl_sft = copy.deepcopy(cfg.sft)
    ctrl_sft.log_every_steps = 10**9  # no evals inside the budget
    # the warm start ended its cosine schedule at 10 % of the peak LR: continue there until the budget is spent
    ctrl = train_sft(policy, tokenizer, task, ctrl_sft, seed=cfg.seed, evaluation=cfg.eval, steps=10**9,
                     time_budget_s=budget, constant_lr=0.1 * cfg.sft.lr)
    acc_ctrl = greedy_accuracy(policy, tokenizer, task, task.test, cfg.eval.max_new_tokens, cfg.eval.batch_size)
    plateau = [h["test_accuracy"] for h in sft_info["history"][-4:]]  # the warm start's last SFT evaluations
    row = {"seed": seed, "sft_last_evals": plateau, "sft": summary["score_start"],
           "rl": summary["score_end"], "ctrl": acc_ctrl, "rl_train_s": budget, "ctrl_s": ctrl["seconds"],
           "ctrl_steps": ctrl["steps"],
           "rl_steps": summary["trainer_steps"], "total_s": summary["wall_clock_s"], "n_test": summary["test_problems"]}
    print(f"[seed {seed}] {row}", flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| seed | SFT start (its last SFT evals) | after TBA RL | continued SFT (same wall-clock) | RL gain | "
             "RL − control | RL train s (steps) | control s (steps) | `tba train` total s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        last = ", ".join(f"{a:.0%}" for a in r["sft_last_evals"])
        lines.append(f"| {r['seed']} | {r['sft']:.1%} ({last}) | {r['rl']:.1%} | {r['ctrl']:.1%} | "
                     f"{(r['rl'] - r['sft']) * 100:+.1f} | {(r['rl'] - r['ctrl']) * 100:+.1f} | "
                     f"{r['rl_train_s']:.0f} ({r['rl_steps']}) | {r['ctrl_s']:.0f} ({r['ctrl_steps']}) | "
                     f"{r['total_s']:.0f} |")
    gain = [(r["rl"] - r["sft"]) * 100 for r in rows]
    over = [(r["rl"] - r["ctrl"]) * 100 for r in rows]

    def sd(x):
        return statistics.stdev(x) if len(x) > 1 else 0.0

    lines.append(f"| **mean** | {statistics.mean(r['sft'] for r in rows):.1%} | "
                 f"{statistics.mean(r['rl'] for r in rows):.1%} | {statistics.mean(r['ctrl'] for r in rows):.1%} | "
                 f"**{statistics.mean(gain):+.1f}** ± {sd(gain):.1f} | **{statistics.mean(over):+.1f}** ± "
                 f"{sd(over):.1f} | | | |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=OUT / "learning")
    ap.add_argument("--results", type=Path, default=RESULTS / "learning" / "learning.md")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    ap.add_argument("overrides", nargs="*")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.smoke:
        args.overrides = [*SMOKE_OVERRIDES, f"sft.cache_dir={args.out / 'sft-cache'}", *args.overrides]
    rows = [run_seed(s, args.overrides, args.out) for s in args.seeds]
    md = table(rows)
    print(md)
    head = header(__spec__.name, f"held-out: greedy pass@1 on {rows[0]['n_test']} problems; warm start cached per "
                  "seed; control = SFT continued from the same warm start, at the LR its schedule ended with (10 % "
                  "of peak), for the RL run's training wall-clock (evaluation time excluded from both)", argv=argv)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
