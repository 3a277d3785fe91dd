"""Async vs sync on this machine: wall-clock to a fixed held-out accuracy, busy fractions, samples/s.

Same recipe (the embedded default, or `--config arith_hard_cpu`), same seeds, same SFT warm start; only the
runtime and mode change:

  async-local   the default: 1 searcher process + trainer, concurrent, shared-memory weights
  async-ray     the same on a private local Ray (runtime overhead vs local)
  sync-inline   one process with all cores, generation and training alternate (the honest sync baseline)
  sync-local    the same components as async-local, alternating (each phase gets one process' cores)
  async-bounded async-local with trainer.max_replay_ratio=1: the trainer waits for fresh samples rather
                than draw more samples than the searchers have delivered (not run unless named in --variants)

    python -m bench.perf.async_speedup --seeds 0 1 --target 0.7

Time-to-target is the training clock (prefill included, evaluation excluded) at the first evaluation that
reaches the target; evaluations run every `--eval-every` steps on the 500 held-out problems.
Writes bench/results/async_speedup/async_speedup.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import OUT, RESULTS
from bench.lib.smoke import SMOKE_OVERRIDES
from tba.config import load_config
from tba.run.train import train

VARIANTS = {
    "async-local": ["runtime=local", "mode=async"],
    "async-ray": ["runtime=ray", "mode=async"],
    "sync-inline": ["runtime=inline", "mode=sync"],
    "sync-local": ["runtime=local", "mode=sync"],
    "async-bounded": ["runtime=local", "mode=async", "trainer.max_replay_ratio=1.0"],
}
DEFAULT_VARIANTS = ["async-local", "async-ray", "sync-inline", "sync-local"]


def time_to(evals: list, target: float) -> float | None:
    for _, acc, seconds in evals:
        if acc >= target:
            return seconds
    return None


def score_at(evals: list, seconds: float) -> tuple[float, int]:
    """(accuracy, step) of the last evaluation taken within `seconds` of training clock: what that run had
    reached by then (a step function — it never credits an evaluation that came later)."""
    step, acc = max(((st, a) for st, a, sec in evals if sec <= seconds), default=(evals[0][0], evals[0][1]))
    return acc, step


def run(variant: str, seed: int, args) -> dict:
    cfg = load_config(args.config, [f"seed={seed}", f"output_dir={args.out / f'{variant}-seed{seed}'}",
                             "logging.progress=false", f"eval.every_steps={args.eval_every}",
                             *VARIANTS[variant], *args.overrides])
    s = train(cfg, overwrite=True)
    row = {"variant": variant, "seed": seed, "final_acc": s["score_end"],
           "time_to_target_s": time_to(s["evals"], args.target), "train_s": s["train_wall_clock_s"],
           "total_s": s["wall_clock_s"], "trainer_busy": s["trainer_busy_fraction"],
           "samples_per_s": s["samples_received"] / s["train_wall_clock_s"], "steps": s["trainer_steps"],
           "samples": s["samples_received"], "evals": s["evals"]}
    metrics = [json.loads(x) for x in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()]
    row["staleness_mean"] = statistics.mean(m["staleness/mean"] for m in metrics)
    busy = [m["searcher/busy_fraction"] for m in metrics if "searcher/busy_fraction" in m]
    row["searcher_busy"] = busy[-1] if busy else None
    ratios = [m["trainer/replay_ratio"] for m in metrics if "trainer/replay_ratio" in m]
    row["replay_ratio"] = ratios[-1] if ratios else None  # samples drawn / samples received, at the end
    print(json.dumps(row), flush=True)
    return row


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def table(rows: list[dict], target: float) -> str:
    out = [f"| variant | seed | time to {target:.0%} (s) | final acc | train s ({rows[0]['steps']} steps) | total s | "
           "trainer busy | searcher busy | samples/s | staleness mean | replay ratio |", "|---" * 11 + "|"]
    for r in rows:
        out.append(f"| {r['variant']} | {r['seed']} | {fmt(r['time_to_target_s'], '.0f')} | {r['final_acc']:.1%} | "
                   f"{r['train_s']:.0f} | {r['total_s']:.0f} | {r['trainer_busy']:.0%} | "
                   f"{fmt(r['searcher_busy'], '.0%')} | {r['samples_per_s']:.0f} | {r['staleness_mean']:.1f} | "
                   f"{fmt(r.get('replay_ratio'), '.2f')} |")
    return "\n".join(out)


def speedups(rows: list[dict], key: str, base: str, fast: str) -> list[float]:
    by = {(r["variant"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    out = []
    for s in seeds:
        b, f = by.get((base, s)), by.get((fast, s))
        if b and f and b[key] and f[key]:
            out.append(b[key] / f[key])
    return out


def equal_clock(rows: list[dict], fast: str = "async-local", base: str = "sync-inline") -> list[str]:
    """Accuracy at equal training wall-clock: the async run's final score against the sync run's score at
    the async run's end (sync has done fewer updates by then), per seed."""
    by = {(r["variant"], r["seed"]): r for r in rows}
    diffs, lines = [], []
    for seed in sorted({r["seed"] for r in rows}):
        f, b = by.get((fast, seed)), by.get((base, seed))
        if not (f and b):
            continue
        acc, step = score_at(b["evals"], f["train_s"])
        diffs.append((f["final_acc"] - acc) * 100)
        lines.append(f"- seed {seed}, at {fast}'s {f['train_s']:.0f} s of training: {fast} {f['final_acc']:.1%} "
                     f"(update {f['steps']}, {f['samples']} samples generated) vs {base} {acc:.1%} (update {step}); "
                     f"{fast} after all its updates vs {base} after all its updates: {f['final_acc']:.1%} vs "
                     f"{b['final_acc']:.1%}")
    if diffs:
        lines.append(f"- {fast} − {base} at equal training wall-clock (points): "
                     f"{', '.join(f'{d:+.1f}' for d in diffs)} (median {statistics.median(diffs):+.1f}, "
                     f"worst {min(diffs):+.1f})")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=None, help="recipe (path or packaged name); default: the embedded default")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--target", type=float, default=0.7)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    ap.add_argument("--out", type=Path, default=OUT / "async_speedup")
    ap.add_argument("--results", type=Path, default=RESULTS / "async_speedup" / "async_speedup.md")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    ap.add_argument("overrides", nargs="*")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.smoke:
        args.overrides = [*SMOKE_OVERRIDES, f"sft.cache_dir={args.out / 'sft-cache'}", *args.overrides]
    variants = [v for v in args.variants if v != "async-ray" or importlib.util.find_spec("ray")]
    rows = [run(v, s, args) for s in args.seeds for v in variants]
    lines = [table(rows, args.target), ""]
    for base in ("sync-inline", "sync-local"):
        tt = speedups(rows, "time_to_target_s", base, "async-local")
        if tt:
            lines.append(f"- async-local vs {base}, wall-clock to {args.target:.0%}: "
                         f"{', '.join(f'{x:.2f}×' for x in tt)} (median {statistics.median(tt):.2f}×)")
        st = speedups(rows, "train_s", base, "async-local")
        if st:
            lines.append(f"- async-local vs {base}, wall-clock for the same {rows[0]['steps']} steps: "
                         f"{', '.join(f'{x:.2f}×' for x in st)} (median {statistics.median(st):.2f}×)")
    lines += equal_clock(rows)
    lines += equal_clock(rows, fast="async-bounded")
    lines += equal_clock(rows, fast="async-bounded", base="async-local")
    ov = speedups(rows, "train_s", "async-ray", "async-local")
    if ov:
        lines.append(f"- Ray runtime overhead (async-ray train s / async-local train s): "
                     f"{', '.join(f'{x:.2f}' for x in ov)} (median {statistics.median(ov):.2f}); "
                     "total s also includes Ray's start-up")
    md = "\n".join(lines)
    print(md)
    head = header(__spec__.name, "caveat: evaluation time is excluded from the training clock; in async variants "
                  "the searcher keeps generating while the trainer evaluates, which adds fresh samples but no trainer "
                  "steps", argv=argv)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
