"""Is a SmolLM2 run's fall after its peak real, or the noise of a 200-problem evaluation?

`bench/claims/smollm2_seeds.py` evaluates on the task's 200 held-out problems: one evaluation's binomial standard error
is ≈ 3.4 points at 65 %, so "final ≥ peak − 3" compares one noisy number with the best of five. This script
re-scores the checkpoints a run saved (every 50 updates) and the starting model on a held-out set several times
larger: the runs' own 200 problems, then more drawn from reasoning-gym past the train range, every question
the run trained on removed:

    python -m bench.claims.smollm2_reeval --runs bench/_out/smollm2_rg --seeds 0 1 2 --extra 1200 \
        --results bench/results/smollm2_reeval/smollm2_reeval.md

Greedy decoding, the run's own evaluation settings (max_new_tokens, batch size, chat template). Prints and writes a
table: each checkpoint's score on the whole set and on the run's own problems, and each run's change since its
first scored checkpoint with paired standard errors; every checkpoint's per-problem rewards go to a JSON file next
to the results file, and `--from-json` rewrites the table from it without scoring anything.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from bench.lib.header import command, machine, today
from bench.lib.paths import OUT
from bench.lib.reading import write_keeping_reading


def held_out(cfg, extra: int):
    """(task, prompts): the run's task, and its own held-out problems followed by up to `extra` more that no run
    trained on. reasoning-gym draws item i from Random(seed + i), so the task's test seed (seed + 1) is its train
    stream shifted by one (the overlap is removed from train); the extra problems start past the last train
    index, and any question that still occurs in train, or twice, is dropped."""
    import dataclasses

    from tba.run.build import build_task

    task = build_task(cfg)  # exactly the run's train / test split
    seen = {p.meta["entry"]["question"] for p in task.train + task.test}
    options = dict(cfg.task.options or {})
    options["seed"] = options.get("seed", 1234) + (cfg.task.train_size or 2000)
    extra_task = dataclasses.replace(cfg.task, options=options, train_size=1, test_size=extra, chat_template=False)
    more = build_task(dataclasses.replace(cfg, task=extra_task)).test
    prompts = list(task.test)
    for p in more:
        q = p.meta["entry"]["question"]
        if q not in seen:
            seen.add(q)
            prompts.append(dataclasses.replace(p, id=len(prompts)))
    task.test = prompts
    return task, prompts


def stderr(p: float, n: int) -> float:
    """Binomial standard error of a share `p` over `n` problems, in points."""
    return 100 * math.sqrt(max(p * (1 - p), 0.0) / max(n, 1))


def paired_se(a: list[float], b: list[float]) -> float:
    """Standard error (points) of mean(b) − mean(a) over the same problems: the paired difference's own spread,
    smaller than two independent errors because most problems are solved (or not) by both checkpoints."""
    d = [y - x for x, y in zip(a, b, strict=True)]
    mean = sum(d) / len(d)
    return 100 * math.sqrt(sum((x - mean) ** 2 for x in d) / max(len(d) - 1, 1) / len(d))


def score_checkpoint(path, cfg, tokenizer, task, prompts) -> list[float]:
    """Per-problem reward of one greedy completion, with the run's evaluation settings."""
    from tba.models import load_model
    from tba.rollout.evaluate import complete
    from tba.tasks.base import batch_rewards

    model = load_model(str(path), cfg.model.dtype)
    c = complete(model, tokenizer, prompts, max_new_tokens=cfg.eval.max_new_tokens, batch_size=cfg.eval.batch_size)
    values, _ = batch_rewards(task, c.prompts, c.texts, c.finished)
    return [v or 0.0 for v in values]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=OUT / "smollm2_rg", help="holds seed<N>/ run dirs")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, nargs="+", default=[50, 100], help="checkpoints to score (first: the base"
                    " of the differences)")
    ap.add_argument("--extra", type=int, default=1200, help="problems drawn past the train range, before filtering")
    ap.add_argument("--results", type=Path, default=None)
    ap.add_argument("--from-json", type=Path, default=None, help="score nothing: rewrite --results from the raw "
                    "data an earlier invocation wrote")
    args = ap.parse_args()
    if args.from_json and not args.results:
        ap.error("--from-json rewrites --results: name it")
    if args.from_json:
        write(args.results, json.loads(args.from_json.read_text()))
        return

    from tba.config import load_config
    from tba.models import load_tokenizer
    from tba.models.sources import resolve_source
    from tba.tasks.prepare import apply_chat_template

    cfg = load_config(args.runs / f"seed{args.seeds[0]}" / "config.yaml")
    task, prompts = held_out(cfg, args.extra)
    own = cfg.task.test_size
    print(f"held-out set: {len(prompts)} problems: the runs' own {own}, then {len(prompts) - own} of {args.extra} "
          f"drawn past the train range (questions in train and repeats removed)", flush=True)
    base = resolve_source(cfg.model.policy)
    tokenizer = load_tokenizer(base)
    if cfg.task.chat_template:
        apply_chat_template(task, tokenizer)
        prompts = task.test
    jobs = [("all", 0, base)]
    for seed in args.seeds:
        if load_config(args.runs / f"seed{seed}" / "config.yaml").task != cfg.task:
            raise SystemExit(f"seed {seed}: its task differs from seed {args.seeds[0]}'s")
        jobs += [(seed, s, args.runs / f"seed{seed}" / "checkpoints" / f"step_{s:07d}" / "model") for s in args.steps]
    rows = []
    for seed, step, path in jobs:
        t0 = time.perf_counter()
        rewards = score_checkpoint(path, cfg, tokenizer, task, prompts)
        rows.append({"seed": seed, "step": step, "rewards": rewards, "seconds": round(time.perf_counter() - t0, 1)})
        score, first = sum(rewards) / len(rewards), sum(rewards[:own]) / own
        print(f"seed {seed} update {step}: {100 * score:.1f} ± {stderr(score, len(rewards)):.1f} on {len(rewards)}; "
              f"{100 * first:.1f} on the run's own {own}  ({rows[-1]['seconds']} s)", flush=True)
    if args.results:
        write(args.results, {"date": today(), "machine": machine(), "command": command(__spec__.name), "own": own,
                             "first_step": args.steps[0], "rows": rows})


def write(path: Path, raw: dict) -> None:
    """The table, computed from `raw` (also written, as `path` with .json): every checkpoint's score on the whole
    set and on the run's own problems, and each run's change since its first scored checkpoint on the whole set,
    on the run's own problems and on the others, with paired standard errors."""
    rows, own, first = raw["rows"], raw["own"], raw["first_step"]

    def pct(rs: list[float]) -> float:
        return 100 * sum(rs) / len(rs)

    def change(a: list[float], b: list[float]) -> str:
        return f"{pct(b) - pct(a):+.1f} ± {paired_se(a, b):.1f}"

    n = len(rows[0]["rewards"])
    lines = [f"# SmolLM2 checkpoints re-scored on {n} held-out problems", "",
             f"- date: {raw['date']}", f"- machine: {raw['machine']}", f"- command: `{raw['command']}`",
             f"- raw data (per-problem rewards of every checkpoint): [{path.stem}.json]({path.stem}.json)",
             f"- greedy, the runs' own evaluation settings; ± is one binomial standard error over the {n} problems; "
             "a change's ± is the paired standard error (same problems, same two checkpoints)", "",
             f"| seed | update | score on all {n} (%) | on the run's own {own} (%) | change since update {first}: "
             f"all {n} | the run's own {own} | the other {n - own} |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        s = sum(r["rewards"]) / n
        base = next((b for b in rows if b["seed"] == r["seed"] and b["step"] == first), None)
        if base is None or base is r:
            changes = "— | — | —"
        else:
            a, b = base["rewards"], r["rewards"]
            changes = f"{change(a, b)} | {change(a[:own], b[:own])} | {change(a[own:], b[own:])}"
        lines.append(f"| {r['seed']} | {r['step']} | {100 * s:.1f} ± {stderr(s, n):.1f} | "
                     f"{pct(r['rewards'][:own]):.1f} | {changes} |")
    write_keeping_reading(path, "\n".join(lines))
    path.with_suffix(".json").write_text(json.dumps(raw) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
