"""Where each objective converges as the data get staler or come from elsewhere: exact KL(π* ‖ π_θ) on the
`enumerable` task (every response enumerated; src/tba/tasks/enumerable.py), against updates.

TB's fixed point is π* ∝ π_ref·exp(r/β) whatever policy produced its samples, provided that policy gives every
response a chance; the ratio-based objectives (Dr. GRPO, TBA′) weight by π_θ/μ with clipping, RLOO and online
DPO use no ratio at all. Each condition changes only where the samples come from:

    k=1, k=16, k=64     searchers synced every k updates (k = trainer.sync_every_steps)
    never               never synced (k = 0): the behaviour is π_ref for the whole run
    never, T_b=1.5      never synced, sampling π_ref at T = 1.5 while the trainer scores at T = 1 (a behaviour
                        unlike π_ref; its log-probs are reported honestly, at 1.5)
    k=1, T_b=0.7 @T=1   synced, sampling at T = 0.7 but reporting behaviour log-probs at T = 1 (the mismatch
                        importance-ratio peers correct with TIS; TB reads no behaviour log-probs)
    k=1, top-p 0.8      synced, nucleus sampling: responses outside the nucleus are never sampled

search.temperature is both the sampling and the scoring temperature in tba (the trainer divides logits by it,
the searchers score π_ref with it), so the two T_b conditions patch the HF sampler in the benchmark's own
worker process: it samples at T_b, and returns log-probs at T_b (honest) or at the scoring T (the mismatch).

    python -m bench.claims.fixed_point --seeds 0 1 2 [--conditions ...] [--objectives ...] [--workers 1] [key=value ...]

The inline runtime makes every run deterministic; runs go `--workers` at a time, one thread each. Writes
bench/results/fixed_point/fixed_point.md (a plot goes to --out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import OUT, RESULTS
from bench.lib.workers import worker_pool
from tba.algorithm.objectives import OBJECTIVES as REGISTRY

OBJECTIVES = list(REGISTRY)
CONDITIONS: dict[str, dict] = {
    "k=1": {"overrides": ["trainer.sync_every_steps=1"]},
    "k=16": {"overrides": ["trainer.sync_every_steps=16"]},
    "k=64": {"overrides": ["trainer.sync_every_steps=64"]},
    "never": {"overrides": ["trainer.sync_every_steps=0"]},
    "never, T_b=1.5": {"overrides": ["trainer.sync_every_steps=0"], "sample_temperature": 1.5},
    "k=1, T_b=0.7 @T=1": {"overrides": ["trainer.sync_every_steps=1"], "sample_temperature": 0.7,
                          "report_scoring_logprobs": True},
    "k=1, top-p 0.8": {"overrides": ["trainer.sync_every_steps=1", "search.top_p=0.8"]},
}
SMOKE = ["trainer.steps=4", "eval.every_steps=2"]


@contextlib.contextmanager
def sampler_patched(sample_temperature: float | None, report_scoring_logprobs: bool):
    """For one run: the HF sampler draws at `sample_temperature` instead of the run's T; its behaviour log-probs
    are those of the distribution it drew from, or (`report_scoring_logprobs`) those at the run's T: the
    mismatch. The class is restored afterwards — pool workers run many jobs, and a patch left in place would
    leak into the next (it did, in a first grid that had to be rerun)."""
    from tba.models.logprobs import response_logprobs
    from tba.rollout.samplers.hf import HFSampler

    original = HFSampler.generate

    def generate(self, prompts, *, num_samples, temperature, top_p, max_new_tokens):
        out = original(self, prompts, num_samples=num_samples, temperature=sample_temperature, top_p=top_p,
                       max_new_tokens=max_new_tokens)
        if not report_scoring_logprobs:
            return out
        flat = [p for p in prompts for _ in range(num_samples)]
        logp, _ = response_logprobs(self.model, flat, [r for r, _ in out], temperature, self.pad_id)  # [N, R]
        return [(r, logp[i, :len(r)].tolist()) for i, (r, _) in enumerate(out)]

    if sample_temperature is not None:
        HFSampler.generate = generate
    try:
        yield
    finally:
        HFSampler.generate = original


def run_one(job: dict) -> dict:
    import torch

    from tba.config import load_config
    from tba.run.train import train

    torch.set_num_threads(1)
    condition = CONDITIONS[job["condition"]]
    cfg = load_config(job["config"], [f"seed={job['seed']}", f"objective={job['objective']}",
                                      f"output_dir={job['out']}", *condition["overrides"], "runtime=inline",
                                      "mode=sync", "threads=1", "search.threads=1", "logging.progress=false",
                                      "logging.tensorboard=false", "buffer.persist=false", *job["overrides"]])
    with sampler_patched(condition.get("sample_temperature"), condition.get("report_scoring_logprobs", False)):
        s = train(cfg, overwrite=True)
    metrics = [json.loads(x) for x in (Path(job["out"]) / "metrics.jsonl").read_text().splitlines()]
    curve = [(0, s["eval_start"]["kl_to_target"])]
    curve += [(m["step"], m["eval/kl_to_target"]) for m in metrics if m.get("eval/kl_to_target") is not None]
    end = s["eval_end"]
    return {"objective": job["objective"], "condition": job["condition"], "seed": job["seed"], "kl": curve,
            "kl_reverse": end["kl_reverse"], "expected_reward": end["expected_reward"],
            "target_expected_reward": end["target_expected_reward"], "policy_mass": end["policy_mass"],
            "staleness_mean": statistics.mean(m["staleness/mean"] for m in metrics),
            "train_s": s["train_wall_clock_s"]}


def slug(condition: str) -> str:
    """A condition's name as a directory name."""
    return "".join(ch if ch.isalnum() or ch in "=." else "_" for ch in condition)


def final(row: dict) -> float:
    return row["kl"][-1][1]


def mean_sd(values: list[float], fmt: str = "{:.3f}") -> str:
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(sd)}"


def summarise(rows: list[dict], conditions: list[str]) -> str:
    """Final KL(π*‖π_θ) per condition (rows) and objective (columns), then E_πθ[r] the same way."""
    objectives = [o for o in OBJECTIVES if any(r["objective"] == o for r in rows)]
    out = []
    for title, value in (("final KL(π* ‖ π_θ), nats", final), ("final KL(π_θ ‖ π*), nats", lambda r: r["kl_reverse"]),
                         ("final E_πθ[r]", lambda r: r["expected_reward"])):
        out += [f"### {title}: mean ± std over seeds\n", "| condition | " + " | ".join(objectives) + " |",
                "|---" * (1 + len(objectives)) + "|"]
        for c in conditions:
            cells = [mean_sd([value(r) for r in rows if (r["condition"], r["objective"]) == (c, o)])
                     for o in objectives]
            out.append(f"| {c} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def per_seed(rows: list[dict], conditions: list[str]) -> str:
    steps = [s for s, _ in rows[0]["kl"]]
    lines = [f"## Per seed: KL(π* ‖ π_θ) at updates {', '.join(map(str, steps))}\n",
             "| condition | objective | seed | KL along the run | final | KL(π_θ‖π*) | E[r] | staleness |",
             "|---|---|---|---|---|---|---|---|"]
    for c in conditions:
        for r in rows:
            if r["condition"] == c:
                curve = " ".join(f"{v:.3g}" for _, v in r["kl"])
                lines.append(f"| {c} | {r['objective']} | {r['seed']} | {curve} | **{final(r):.4f}** | "
                             f"{r['kl_reverse']:.4f} | {r['expected_reward']:.3f} | {r['staleness_mean']:.1f} |")
    return "\n".join(lines)


def plot(rows: list[dict], conditions: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(conditions))
    nrows = -(-len(conditions) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), sharey=True, squeeze=False)
    for ax, c in zip(axes.flat, conditions, strict=False):
        for i, obj in enumerate(OBJECTIVES):
            runs = [r for r in rows if (r["condition"], r["objective"]) == (c, obj)]
            for j, r in enumerate(runs):
                xs, ys = zip(*r["kl"], strict=True)
                ax.plot(xs, [max(y, 1e-4) for y in ys], color=f"C{i}", alpha=0.8, lw=1,
                        label=obj if j == 0 else None)
        ax.set_yscale("log")
        ax.set_title(c, fontsize=10)
        ax.set_xlabel("updates")
    for ax in axes.flat[len(conditions):]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("KL(π* ‖ π_θ), nats")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="enumerable_cpu", help="recipe (path or packaged name)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    ap.add_argument("--objectives", nargs="+", default=OBJECTIVES, choices=OBJECTIVES)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT / "fixed_point")
    ap.add_argument("--results", type=Path, default=RESULTS / "fixed_point" / "fixed_point.md")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    ap.add_argument("overrides", nargs="*", help="extra config overrides, e.g. trainer.steps=600")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    overrides = [*SMOKE, *args.overrides] if args.smoke else list(args.overrides)
    jobs = [{"objective": o, "condition": c, "seed": s, "overrides": overrides, "config": args.config,
             "out": str(args.out / f"{o}-{slug(c)}-s{s}")}
            for s in args.seeds for c in args.conditions for o in args.objectives]
    rows = []
    with worker_pool(args.workers) as pool:
        for row in pool.map(run_one, jobs):
            print(json.dumps(row), flush=True)
            rows.append(row)
    rows.sort(key=lambda r: (args.conditions.index(r["condition"]), OBJECTIVES.index(r["objective"]), r["seed"]))
    md = summarise(rows, args.conditions) + "\n" + per_seed(rows, args.conditions)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    plot(rows, args.conditions, args.out / args.results.with_suffix(".png").name)
    head = header(__spec__.name, f"recipe: {args.config} (inline runtime, one thread per run); every objective shares "
                  f"lr, β, B, K, S and the start π_ref (no per-objective tuning); seeds {args.seeds}", argv=argv)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
