"""The paper's two buffer knobs, measured: recency m and the reward-softmax inverse temperature ι, on an exact and a
graded reward, and again with more samples generated per update.

m (`buffer.online_prob`) is the probability that a prompt slot of a batch is drawn from the prompts refreshed since
the last sync; the other 1 − m come from the whole history, uniformly (ι = 0) or by softmax(ι · reward) over each
prompt's items (`buffer.offline_inverse_temperature`). The paper reports TL;DR win rates 0.67 / 0.82 / 0.80 at
m = 0.4 / 0.5 / 0.6 and uses m = 0.95 with uniform draws on GSM8K, and says reward- and recency-prioritised
sampling "enable further gains as data generation is scaled". Here:

- tasks: `exact` (the recipe's own reward — the embedded default recipe's, or `--config`'s arith recipe: 1 for the
  right sum) and `digits` (the same recipe with `task.options.reward=digits`: the share of the answer's digits
  right, a graded reward);
- cells: m over `--ms` with ι = 0; ι over `--iotas` at each m of `--iota-ms`; and `--scale` × the searcher batch
  (`search.prompts_per_batch`) at the cells of `--scale-cells` — in a sync run each update then has that many
  times more fresh samples to choose from, as if that many searchers fed one trainer;
- every run inline and sync (k = 1, one thread: the staleness is what m makes it), RL seeds over one SFT start
  (`sft.seed`), so a cell's spread is RL's alone.

    python -m bench.claims.buffer_knobs --seeds 0 1 31 [--config arith_hard_cpu] [--workers 2] [key=value ...]

The result of a run is its final held-out evaluation (exact: greedy pass@1; digits: the mean graded reward, with
exact accuracy beside it).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.claims.offpolicy import diagnostics
from bench.lib.header import header
from bench.lib.paths import OUT, RESULTS
from bench.lib.smoke import SMOKE_OVERRIDES
from bench.lib.workers import worker_pool

TASKS = {"exact": [], "digits": ["task.options.reward=digits"]}


def run_one(job: dict) -> dict:
    import torch

    from tba.config import load_config
    from tba.run.train import train

    torch.set_num_threads(1)
    cfg = load_config(job["config"], [*TASKS[job["task"]], f"seed={job['seed']}", "sft.seed=0",
                             f"buffer.online_prob={job['m']}", f"buffer.offline_inverse_temperature={job['iota']}",
                             f"output_dir={job['out']}", "runtime=inline", "mode=sync", "threads=1",
                             "search.threads=1", "logging.progress=false", "logging.tensorboard=false",
                             *job["overrides"]])
    cfg.search.prompts_per_batch *= job["scale"]
    s = train(cfg, overwrite=True)
    metrics = [json.loads(x) for x in (Path(job["out"]) / "metrics.jsonl").read_text().splitlines()]
    evals = [m for m in metrics if "eval/score" in m]
    exact = [m.get("eval/exact") for m in evals]
    return {**{k: job[k] for k in ("task", "m", "iota", "scale", "seed")}, "start": s["score_start"],
            "final": s["score_end"], "exact_final": exact[-1] if exact else None,
            "samples_received": s.get("samples_received"), "train_s": s["train_wall_clock_s"],
            "evals": s["evals"], **diagnostics(metrics)}


def build_warm_starts(config: str | None, tasks: list[str], overrides: list[str]) -> None:
    """Each task's one SFT start, trained here before the pool (why: offpolicy.build_warm_starts)."""
    from tba.config import load_config
    from tba.run.build import build_task, warm_start

    for task in tasks:
        cfg = load_config(config, [*TASKS[task], "sft.seed=0", *overrides])
        warm_start(cfg, build_task(cfg))


def cells(args) -> list[tuple[str, float, float, int]]:
    """(task, m, ι, scale) of every cell, each once, in the order the tables read."""
    out = []
    for task in args.tasks:
        out += [(task, m, 0.0, 1) for m in args.ms]
        out += [(task, m, i, 1) for m in args.iota_ms for i in args.iotas if i != 0]
        if task in args.scale_tasks:
            out += [(task, m, i, args.scale) for m, i in args.scale_cells]
    return list(dict.fromkeys(out))


def fmt(values: list[float]) -> str:
    """Median and worst seed of finals in %, e.g. `84.2 (worst 80.1)`."""
    return f"{statistics.median(values) * 100:.1f} (worst {min(values) * 100:.1f})"


def summarise(rows: list[dict], args) -> str:
    lines = ["| task | m | ι | searcher batch × | final, median of seeds (worst) | exact accuracy (worst) | "
             "samples received (median) | per seed |", "|---" * 8 + "|"]
    for task, m, iota, scale in cells(args):
        rs = sorted((r for r in rows if (r["task"], r["m"], r["iota"], r["scale"]) == (task, m, iota, scale)),
                    key=lambda r: r["seed"])
        if not rs:
            continue
        exact = [r["exact_final"] for r in rs if r["exact_final"] is not None]
        per_seed = " ".join(f"{r['seed']}: {r['final'] * 100:.1f}" for r in rs)
        lines.append(f"| {task} | {m} | {iota:g} | {scale} | {fmt([r['final'] for r in rs])} | "
                     f"{fmt(exact) if exact else '—'} | "
                     f"{statistics.median(r['samples_received'] or 0 for r in rs):.0f} | {per_seed} |")
    return "\n".join(lines)


def curves(rows: list[dict]) -> str:
    lines = ["| task | m | ι | × | seed | held-out score at each evaluation (%) |", "|---" * 6 + "|"]
    for r in rows:
        evs = " ".join(f"{score * 100:.1f}" for _, score, _ in r["evals"])
        lines.append(f"| {r['task']} | {r['m']} | {r['iota']:g} | {r['scale']} | {r['seed']} | {evs} |")
    return "\n".join(lines)


def cell_pair(text: str) -> tuple[float, float]:
    m, iota = text.split(",")
    return float(m), float(iota)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=None, help="an arith recipe (default: the embedded default recipe)")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 31])
    ap.add_argument("--ms", type=float, nargs="+", default=[0.4, 0.5, 0.6, 0.8, 0.95, 1.0])
    ap.add_argument("--iotas", type=float, nargs="+", default=[1.0, 10.0])
    ap.add_argument("--iota-ms", type=float, nargs="+", default=[0.5])
    ap.add_argument("--scale", type=int, default=4, help="searcher batch multiple of the scaled cells")
    ap.add_argument("--scale-tasks", nargs="*", default=["digits"], choices=list(TASKS))
    ap.add_argument("--scale-cells", type=cell_pair, nargs="*", default=[(0.5, 0.0), (0.95, 0.0), (0.5, 10.0)],
                    metavar="M,IOTA")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT / "buffer_knobs")
    ap.add_argument("--results", type=Path, default=RESULTS / "buffer_knobs" / "buffer_knobs.md")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    ap.add_argument("overrides", nargs="*", help="config overrides for every run, e.g. trainer.steps=100")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    overrides = list(args.overrides)
    if args.smoke:
        overrides = [*SMOKE_OVERRIDES, f"sft.cache_dir={args.out / 'sft-cache'}", *overrides]
    jobs = [{"task": t, "m": m, "iota": i, "scale": x, "seed": s, "overrides": overrides, "config": args.config,
             "out": str(args.out / f"{t}-m{m}-i{i:g}-x{x}-s{s}")} for t, m, i, x in cells(args) for s in args.seeds]
    print(f"{len(jobs)} runs", flush=True)
    build_warm_starts(args.config, args.tasks, overrides)
    rows = []
    with worker_pool(args.workers) as pool:
        for row in pool.map(run_one, jobs):
            print(json.dumps({k: v for k, v in row.items() if k != "evals"}), flush=True)
            rows.append(row)
    md = summarise(rows, args) + "\n\n## Held-out score at each evaluation\n\n" + curves(rows)
    print(md)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    head = header(__spec__.name, f"recipe: {args.config or 'the embedded default'}; final: each run's last "
                  "held-out evaluation (exact: greedy pass@1; digits: mean graded reward of greedy answers), median "
                  f"and worst over RL seeds {args.seeds} from one SFT start (sft.seed=0); runs inline, sync, k = 1",
                  argv=argv)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
