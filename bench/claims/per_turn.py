"""Learning per turn: `guess_number` (find a hidden number 0–7 from "+"/"-" feedback in 3 one-token guesses;
src/tba/tasks/guess_number.py), TB from the untrained builtin tiny model. The greedy policy's share of held-out
episodes solved by turn 1, 2 and 3 at every evaluation, against what ignoring the feedback (at most 1/8, 2/8, 3/8)
and halving the interval (1/8, 3/8, 7/8) achieve: a policy that uses the feedback raises the later turns' shares.

    python -m bench.claims.per_turn --seeds 0 1 2 [--workers 2] [key=value ...]
    python -m bench.claims.per_turn --smoke      # seconds (CI); the numbers mean nothing

Runs are inline (deterministic per seed, one thread each). Writes bench/results/multiturn/guess_number.md (a plot
goes to --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import OUT, RESULTS
from bench.lib.workers import worker_pool

SMOKE = ["trainer.steps=4", "eval.every_steps=2", "task.test_size=16"]
BLIND = {1: 1 / 8, 2: 2 / 8, 3: 3 / 8}  # never repeating a wrong guess, ignoring "+"/"-" (high = 7)
HALVING = {1: 1 / 8, 2: 3 / 8, 3: 7 / 8}


def run_one(job: dict) -> dict:
    import torch

    from tba.config import load_config
    from tba.run.train import train

    torch.set_num_threads(1)
    cfg = load_config(job["config"], [f"seed={job['seed']}", f"output_dir={job['out']}", "runtime=inline",
                                      "mode=sync", "threads=1", "search.threads=1", "logging.progress=false",
                                      "logging.tensorboard=false", "buffer.persist=false", *job["overrides"]])
    s = train(cfg, overwrite=True)
    metrics = [json.loads(x) for x in (Path(job["out"]) / "metrics.jsonl").read_text().splitlines()]
    evals = [(0, s["eval_start"])] + [(m["step"], {k[5:]: v for k, v in m.items() if k.startswith("eval/")})
                                      for m in metrics if m.get("eval/score") is not None]
    turns = range(1, cfg.search.max_turns + 1)
    return {"seed": job["seed"], "steps": [step for step, _ in evals], "score": [e["score"] for _, e in evals],
            "solved_by": {t: [e.get(f"solved_by_turn_{t}", 0.0) for _, e in evals] for t in turns},
            "solved_at_if_open": {t: [e.get(f"solved_at_turn_{t}_if_open", 0.0) for _, e in evals] for t in turns},
            "train_reward_start": s["train_reward_start"], "train_reward_end": s["train_reward_end"],
            "test_problems": s.get("test_problems"), "train_s": s["train_wall_clock_s"]}


def tables(rows: list[dict]) -> str:
    turns = sorted(rows[0]["solved_by"], key=int)
    out = ["## Solved by turn t, greedy, held-out (final evaluation): median over seeds [worst seed]\n",
           "| turn | start | end | ignoring the feedback (at most) | halving the interval |", "|---|---|---|---|---|"]
    for t in turns:
        start = [r["solved_by"][t][0] for r in rows]
        end = [r["solved_by"][t][-1] for r in rows]
        out.append(f"| {t} | {statistics.median(start):.3f} | **{statistics.median(end):.3f}** [{min(end):.3f}] | "
                   f"{BLIND.get(int(t), float('nan')):.3f} | {HALVING.get(int(t), float('nan')):.3f} |")
    out += ["", f"## Per seed, at updates {', '.join(map(str, rows[0]['steps']))}\n",
            "| seed | turn | solved by turn t | solved at turn t, of the episodes still open |", "|---|---|---|---|"]
    for r in rows:
        for t in turns:
            by = " ".join(f"{v:.3f}" for v in r["solved_by"][t])
            at = " ".join(f"{v:.3f}" for v in r["solved_at_if_open"][t])
            out.append(f"| {r['seed']} | {t} | {by} | {at} |")
    out += ["", "| seed | score (mean reward) along the run | train reward first / last 10 % | train s |",
            "|---|---|---|---|"]
    out += [f"| {r['seed']} | {' '.join(f'{v:.3f}' for v in r['score'])} | {r['train_reward_start']:.3f} / "
            f"{r['train_reward_end']:.3f} | {r['train_s']:.0f} |" for r in rows]
    return "\n".join(out)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    turns = sorted(rows[0]["solved_by"], key=int)
    fig, axes = plt.subplots(1, len(turns), figsize=(3.6 * len(turns), 3.4), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], turns, strict=True):
        for j, r in enumerate(rows):
            ax.plot(r["steps"], r["solved_by"][t], color=f"C{j}", lw=1, label=f"seed {r['seed']}")
        ax.axhline(BLIND.get(int(t), float("nan")), color="grey", ls=":", lw=1, label="ignoring the feedback")
        ax.axhline(HALVING.get(int(t), float("nan")), color="black", ls="--", lw=1, label="halving the interval")
        ax.set_title(f"solved by turn {t}", fontsize=10)
        ax.set_xlabel("updates")
    axes[0][0].set_ylabel("share of held-out episodes (greedy)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="guess_number_cpu", help="recipe (path or packaged name)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT / "per_turn")
    ap.add_argument("--results", type=Path, default=RESULTS / "multiturn" / "guess_number.md")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    ap.add_argument("overrides", nargs="*", help="extra config overrides, e.g. trainer.steps=2000")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    overrides = [*SMOKE, *args.overrides] if args.smoke else list(args.overrides)
    jobs = [{"seed": s, "config": args.config, "overrides": overrides, "out": str(args.out / f"s{s}")}
            for s in args.seeds]
    with worker_pool(args.workers) as pool:
        rows = sorted(pool.map(run_one, jobs), key=lambda r: r["seed"])
    md = tables(rows)
    print(md)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(rows, args.out / args.results.with_suffix(".png").name)
    head = header(__spec__.name, f"recipe: {args.config} (inline runtime, one thread per run); seeds {args.seeds}",
                  f"held-out: {rows[0]['test_problems']} secrets, greedy; a run's result is its final evaluation",
                  argv=argv)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
