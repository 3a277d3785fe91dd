"""Off-policy robustness: final held-out accuracy of each objective as data gets staler.

Same recipe (the embedded default, or `--config arith_hard_cpu`), same searchers and buffer; only the
objective, the sync period k (searchers generate with weights up to k−1 updates old) and the recency
probability m (1−m of the prompt slots come from the whole history, as stale as the run) change. Each row
also keeps per-quarter medians of gradient norm, TB residual std, log Ẑ, log π/π_ref and sampled reward, to
see what a collapse looks like from the inside.

    python -m bench.claims.offpolicy --seeds 0 1 2 --ks 1 4 16 --ms 0.95 0.5 [--workers 2] [key=value ...]
    python -m bench.claims.offpolicy ... --reuse bench/results/offpolicy/offpolicy_hard.md   # rerun only new cells

The inline runtime is used so that staleness is exactly what k and m make it (no scheduling noise);
runs go `--workers` at a time, one thread each. Writes bench/results/offpolicy/offpolicy.md (a plot goes to --out).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from pathlib import Path

from bench.lib.header import header, recorded_command
from bench.lib.paths import OUT, RESULTS
from bench.lib.smoke import SMOKE_OVERRIDES
from bench.lib.workers import worker_pool
from tba.algorithm.objectives import OBJECTIVES as REGISTRY

# How a results file's command line names this script: `python -m bench.claims.offpolicy …`, or in older grids
# `python bench/offpolicy.py …`. --reuse reads both.
RECORDED_AS = (f"python -m {__spec__.name} ", "python bench/offpolicy.py ")
OBJECTIVES = list(REGISTRY)  # every registered objective (tba.algorithm.objectives.OBJECTIVES)


def run_one(job: dict) -> dict:
    import torch

    from tba.config import load_config
    from tba.run.train import train

    torch.set_num_threads(1)
    cfg = load_config(job["config"], [f"seed={job['seed']}", f"objective={job['objective']}",
                                      f"trainer.sync_every_steps={job['k']}", f"buffer.online_prob={job['m']}",
                                      f"output_dir={job['out']}", "runtime=inline", "mode=sync", "threads=1",
                                      "search.threads=1", "logging.progress=false", "logging.tensorboard=false",
                                      *job["overrides"]])
    s = train(cfg, overwrite=True)
    metrics = [json.loads(x) for x in (Path(job["out"]) / "metrics.jsonl").read_text().splitlines()]
    return {**{k: job[k] for k in ("objective", "k", "m", "seed")}, "start": s["score_start"],
            "final": s["score_end"], "staleness_mean": statistics.mean(x["staleness/mean"] for x in metrics),
            "train_s": s["train_wall_clock_s"], "evals": s["evals"], **diagnostics(metrics)}


def build_warm_starts(args) -> None:
    """Train each seed's SFT warm start here, one seed at a time, before the pool starts.

    `tba.run.build.warm_start` gives SFT every core (in a normal run nothing else runs yet). With a cold cache,
    `--workers` processes would each train the same warm start at once, every one on every core:
    duplicated work, and on the 2-core machine about 14x slower per step than one at a time (measured
    2026-11-25: 2 s vs 0.14 s per SFT step)."""
    from tba.config import load_config
    from tba.run.build import build_task, warm_start

    for seed in args.seeds:
        cfg = load_config(args.config, [f"seed={seed}", *args.overrides])
        if cfg.model.policy == "builtin" and cfg.sft.enabled:
            warm_start(cfg, build_task(cfg))


def diagnostics(metrics: list[dict]) -> dict:
    """What a collapse looks like from the inside: gradient norms, TB residuals, log Ẑ and the policy's
    drift from the reference, summarised per quarter of the run (so a late blow-up is not averaged away)."""
    out = {}
    for key, name in (("trainer/grad_norm", "grad_norm"), ("trainer/residual_std", "residual_std"),
                      ("trainer/log_z_mean", "log_z"), ("trainer/log_ratio_mean", "log_ratio"),
                      ("searcher/reward_mean", "sampled_reward")):
        vals = [m[key] for m in metrics if m.get(key) is not None]
        if vals:
            q = max(1, len(vals) // 4)
            out[name] = [round(statistics.median(vals[i:i + q]), 3) for i in range(0, q * 4, q)]
    return out


def cell(row: dict) -> tuple:
    """What identifies one run of the grid (a row or a job)."""
    return row["objective"], row["k"], row["m"], row["seed"]


def reused_rows(path: Path, args) -> list[dict]:
    """Rows of an earlier results file whose cells this invocation would otherwise rerun.

    Inline runs are deterministic given their SFT warm start (one thread, seeded searchers), so a cell already
    measured under the same recipe and overrides, from the same cached warm start, is the same number; the
    earlier file's command must name the same --config and overrides, or the rows would silently mix two
    setups. The warm start itself is not bit-reproducible across environments (a cache rebuilt on a fresh
    venv on 2026-11-25 started at 15.8 % instead of 15.2 %), so reuse rows only next to the cache they came
    from: compare the reused rows' `start` with the new ones'."""
    text = path.read_text()
    recorded = recorded_command(text) or ""
    argv = next((shlex.split(recorded[len(p):]) for p in RECORDED_AS if recorded.startswith(p)), None)
    if argv is None or "```json" not in text:
        raise SystemExit(f"--reuse {path}: not a results file of this script (no command line or json block)")
    old = parse_args(argv)
    if (old.config, old.smoke, old.overrides) != (args.config, args.smoke, args.raw_overrides):
        raise SystemExit(f"--reuse {path}: measured with --config {old.config} {' '.join(old.overrides)}, "
                         f"not --config {args.config} {' '.join(args.raw_overrides)}")
    rows = json.loads(text.split("```json", 1)[1].split("```", 1)[0])
    wanted = {(o, k, m, s) for o in args.objectives for k in args.ks for m in args.ms for s in args.seeds}
    return [r for r in rows if cell(r) in wanted]


def per_seed(rows: list[dict], ks, ms) -> str:
    """Every run's held-out accuracy at each evaluation: a late collapse or a slow flip shows here, and the
    means in the summary hide both."""
    steps = [s for s, _, _ in rows[0]["evals"]]
    cols = [(k, m) for m in ms for k in ks]
    by_cell = {cell(r): r for r in rows}
    lines = [f"## Per seed: held-out accuracy (%) at updates {', '.join(map(str, steps))}\n",
             "| objective | seed | " + " | ".join(f"k={k}, m={m}" for k, m in cols) + " |",
             "|---" * (2 + len(cols)) + "|"]
    for obj in OBJECTIVES:
        for seed in sorted({r["seed"] for r in rows}):
            cells = []
            for k, m in cols:
                r = by_cell.get((obj, k, m, seed))
                cells.append("—" if r is None else
                             " ".join(f"{a * 100:.0f}" for _, a, _ in r["evals"][:-1]) + f" **{r['final'] * 100:.0f}**")
            if any(c != "—" for c in cells):
                lines.append(f"| {obj} | {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarise(rows: list[dict], ks, ms) -> str:
    head = "| objective | " + " | ".join(f"k={k}, m={m}" for m in ms for k in ks) + " |"
    lines = [head, "|---" * (1 + len(ks) * len(ms)) + "|"]
    for obj in OBJECTIVES:
        cells = []
        for m in ms:
            for k in ks:
                acc = [r["final"] * 100 for r in rows if (r["objective"], r["k"], r["m"]) == (obj, k, m)]
                cells.append(f"{statistics.mean(acc):.1f} ± {statistics.stdev(acc) if len(acc) > 1 else 0:.1f}"
                             if acc else "—")
        if any(c != "—" for c in cells):
            lines.append(f"| {obj} | " + " | ".join(cells) + " |")
    stale = {(k, m): statistics.mean(r["staleness_mean"] for r in rows if (r["k"], r["m"]) == (k, m))
             for m in ms for k in ks if any((r["k"], r["m"]) == (k, m) for r in rows)}
    lines.append("| *mean staleness of trained samples (updates)* | " +
                 " | ".join(f"{stale[(k, m)]:.1f}" if (k, m) in stale else "—" for m in ms for k in ks) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], ks, ms, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ms), figsize=(5 * len(ms), 4), sharey=True, squeeze=False)
    for ax, m in zip(axes[0], ms, strict=True):
        for obj in OBJECTIVES:
            means, sds, xs = [], [], []
            for k in ks:
                acc = [r["final"] * 100 for r in rows if (r["objective"], r["k"], r["m"]) == (obj, k, m)]
                if acc:
                    xs.append(k)
                    means.append(statistics.mean(acc))
                    sds.append(statistics.stdev(acc) if len(acc) > 1 else 0.0)
            if xs:
                ax.errorbar(xs, means, yerr=sds, marker="o", capsize=3, label=obj)
        start = statistics.mean(r["start"] * 100 for r in rows)
        ax.axhline(start, color="gray", linestyle=":", label="SFT start")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("sync period k (updates between weight publications)")
        ax.set_title(f"m = {m}")
    axes[0][0].set_ylabel("held-out accuracy after RL (%)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=None, help="recipe (path or packaged name); default: the embedded default")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--ms", type=float, nargs="+", default=[0.95, 0.5])
    ap.add_argument("--objectives", nargs="+", default=OBJECTIVES, choices=OBJECTIVES)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT / "offpolicy")
    ap.add_argument("--results", type=Path, default=RESULTS / "offpolicy" / "offpolicy.md")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    ap.add_argument("--reuse", type=Path, action="append", default=None,
                    help="an earlier results file (same --config and overrides) whose cells are not rerun; repeatable")
    ap.add_argument("overrides", nargs="*", help="extra config overrides, e.g. trainer.steps=100")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.raw_overrides = list(args.overrides)
    if args.smoke:
        args.overrides = [*SMOKE_OVERRIDES, f"sft.cache_dir={args.out / 'sft-cache'}", *args.overrides]
    jobs = [{"objective": o, "k": k, "m": m, "seed": s, "overrides": args.overrides, "config": args.config,
             "out": str(args.out / f"{o}-k{k}-m{m}-s{s}")}
            for s in args.seeds for m in args.ms for k in args.ks for o in args.objectives]
    rows = [r for path in args.reuse or [] for r in reused_rows(path, args)]
    done = {cell(r) for r in rows}
    jobs = [j for j in jobs if cell(j) not in done]
    print(f"{len(rows)} cells reused, {len(jobs)} to run", flush=True)
    if jobs:
        build_warm_starts(args)
    with worker_pool(args.workers) as pool:
        for row in pool.map(run_one, jobs):
            print(json.dumps(row), flush=True)
            rows.append(row)
    rows.sort(key=lambda r: (OBJECTIVES.index(r["objective"]), r["seed"], r["m"], r["k"]))
    md = summarise(rows, args.ks, args.ms) + "\n\n" + per_seed(rows, args.ks, args.ms)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    plot(rows, args.ks, args.ms, args.out / args.results.with_suffix(".png").name)
    head = header(__spec__.name, "cells: final held-out accuracy (%, greedy pass@1), mean ± std over seeds "
                  f"{args.seeds}; all objectives share lr, β, B, K, S and the SFT start (no per-objective tuning)",
                  argv=argv)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
