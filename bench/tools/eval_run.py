"""Re-evaluate a finished run: its starting policy and its final one, on the run's own held-out prompts.

`tba train` logs `eval/score` (mean reward) and whatever the task's `eval_metrics` returned *at the time of
the run*. This script evaluates again with today's task code (e.g. a metric added after the run, such as
`exact` for reasoning-gym tasks) and prints a few responses before and after, so that a reader can see
what RL changed (the format of the answer, the answer itself, or both).

    python -m bench.tools.eval_run RUN_DIR [--examples 8] [--results FILE]

Greedy decoding, the run's eval.max_new_tokens and batch size; models on CPU. Full-model runs only: for a
LoRA run, `tba export` it first and evaluate the export.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bench.lib.header import header
from tba.config import load_config
from tba.models import load_model, load_tokenizer
from tba.models.sources import resolve_source
from tba.rollout.evaluate import complete, task_metrics
from tba.run.build import build_task
from tba.run.export import policy_source


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--examples", type=int, default=8, help="responses shown before/after")
    ap.add_argument("--results", type=Path, default=None, help="also write the markdown here")
    args = ap.parse_args()
    cfg = load_config(args.run_dir / "config.yaml")
    if cfg.model.lora.enabled:
        sys.exit(f"{args.run_dir} is a LoRA run: `tba export` it and evaluate the export (model.policy=EXPORT)")
    torch.manual_seed(cfg.seed)
    tok = load_tokenizer(resolve_source(cfg.model.policy))
    task = build_task(cfg, tok)
    prompts = task.test
    rows, shown = [], {}
    for label, source in (("start", resolve_source(cfg.model.policy)), ("end", str(policy_source(args.run_dir)))):
        c = complete(load_model(source), tok, prompts, max_new_tokens=cfg.eval.max_new_tokens,
                     batch_size=cfg.eval.batch_size)
        metrics = task_metrics(task, c)
        rows.append((label, source, metrics))
        shown[label] = c.texts[:args.examples]
        print(f"{label}: {metrics}", flush=True)
    names = sorted({k for _, _, m in rows for k in m})
    head = header(__spec__.name, f"task: {task.name}, {len(prompts)} held-out prompts, greedy, max_new_tokens "
                  f"{cfg.eval.max_new_tokens}", title=f"Re-evaluation of `{args.run_dir}` (`bench/tools/eval_run.py`)")
    lines = [head.rstrip("\n"), "", "| policy | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {label} (`{Path(src).name}`) | " + " | ".join(f"{m.get(k, float('nan')):.3f}" for k in names) + " |"
              for label, src, m in rows]
    lines += ["", "| answer | response at start | response at end |", "|---|---|---|"]
    for p, a, b in zip(prompts, shown["start"], shown["end"], strict=False):  # the first --examples prompts
        def cell(s):
            return "`" + s.strip().replace("\n", " ⏎ ").replace("|", "\\|")[:80] + "`"
        lines.append(f"| {p.answer} | {cell(a)} | {cell(b)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results:
        args.results.write_text(text)


if __name__ == "__main__":
    main()
