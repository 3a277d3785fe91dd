"""Where TB converges on multi-turn episodes: exact KL(π° ‖ π_θ) on `enumerable_turns` (two policy turns, a
random observation between them; src/tba/tasks/enumerable_turns.py), against updates — and where theory says it
must converge, computed exactly.

π° is the KL-regularised optimum over the policy's own tokens (soft Bellman: an expectation over the
environment's observation where the trajectory target π_ref(τ)·exp(r/β)/Z has a log-sum-exp). Conditions:

    stochastic, k=1 / k=16 / never   o ~ P(o|y₁), searchers synced every k updates or never (behaviour = π_ref)
    deterministic, never / k=16      o a seeded function of y₁: then π° is the trajectory target

**The predicted fixed point.** With a fixed behaviour μ (never synced), VarGrad TB minimises
Var_μ[log π_θ(τ) − log π_ref(τ) − r(τ)/β] (its log Ẑ is that quantity's group mean). In a deterministic
environment some π_θ makes it 0 for every τ — π° — whatever μ is. In a stochastic one no π_θ can (the residual
at π° varies with o as log Z₂(y₁, o) does), so the minimiser depends on μ. For each seed the script minimises
that variance exactly, over tabular policies (one free distribution per turn and history), with μ = π_ref·P and
with μ = π°·P, and reports KL(π° ‖ minimiser): the bias of never-synced TB, and 0 for on-policy data at the
optimum.

    python -m bench.claims.multiturn --seeds 0 1 2 [--conditions ...] [--workers 2] [key=value ...]

Runs are inline (deterministic per seed, one thread each). Writes bench/results/multiturn/enumerable_turns.md
(a plot goes to --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import OUT, RESULTS
from bench.lib.workers import worker_pool

CONDITIONS: dict[str, list[str]] = {
    "stochastic, k=1": ["trainer.sync_every_steps=1"],
    "stochastic, k=16": ["trainer.sync_every_steps=16"],
    "stochastic, never": ["trainer.sync_every_steps=0"],
    "deterministic, k=16": ["trainer.sync_every_steps=16", "task.options.stochastic=false"],
    "deterministic, never": ["trainer.sync_every_steps=0", "task.options.stochastic=false"],
}
SMOKE = ["trainer.steps=4", "eval.every_steps=2"]


def tabular_fixed_point(init_dir: str, options: dict, beta: float, max_new_tokens: int) -> dict:
    """KL(π° ‖ argmin_π Var_μ[log π − log π_ref − r/β]) for μ = π_ref·P and μ = π°·P, π_ref the run's start."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tba.tasks.enumerable_turns import EnumerableTurnsTask, soft_bellman

    tok, model = AutoTokenizer.from_pretrained(init_dir), AutoModelForCausalLM.from_pretrained(init_dir).eval()
    t = EnumerableTurnsTask(**options).tables(model, model, tok, max_new_tokens, 1.0)
    ref1, ref2, p_obs, r = t.ref1, t.ref2, t.p_obs, t.reward
    opt1, opt2 = soft_bellman(ref1, ref2, p_obs, r, beta)
    w_opt = opt1.exp()[:, None, None] * p_obs[..., None] * opt2.exp()

    def minimiser_kl(mu1, mu2) -> tuple[float, float]:
        w = mu1.exp()[:, None, None] * p_obs[..., None] * mu2.exp()
        a, b = opt1.clone().requires_grad_(), opt2.clone().requires_grad_()
        lbfgs = torch.optim.LBFGS([a, b], max_iter=2000, tolerance_grad=1e-12, tolerance_change=1e-15,
                                  line_search_fn="strong_wolfe")

        def variance():
            lbfgs.zero_grad()
            d = (torch.log_softmax(a, 0)[:, None, None] + torch.log_softmax(b, -1)
                 - ref1[:, None, None] - ref2 - r / beta)
            loss = (w * (d - (w * d).sum() / w.sum()) ** 2).sum() / w.sum()
            loss.backward()
            return loss

        for _ in range(5):
            lbfgs.step(variance)
        l1, l2 = torch.log_softmax(a, 0).detach(), torch.log_softmax(b, -1).detach()
        kl = (w_opt * (opt1[:, None, None] + opt2 - l1[:, None, None] - l2)).sum().item()
        return kl, variance().item()

    never, never_var = minimiser_kl(torch.log_softmax(ref1, 0), torch.log_softmax(ref2, -1))
    at_opt, opt_var = minimiser_kl(opt1, opt2)
    return {"fixed_point_kl_never": never, "residual_var_never": never_var, "fixed_point_kl_on_policy": at_opt,
            "residual_var_on_policy": opt_var}


def run_one(job: dict) -> dict:
    import torch

    from tba.config import load_config
    from tba.run.train import train

    torch.set_num_threads(1)
    cfg = load_config(job["config"], [f"seed={job['seed']}", f"output_dir={job['out']}", *CONDITIONS[job["condition"]],
                                      "runtime=inline", "mode=sync", "threads=1", "search.threads=1",
                                      "logging.progress=false", "logging.tensorboard=false", "buffer.persist=false",
                                      *job["overrides"]])
    s = train(cfg, overwrite=True)
    metrics = [json.loads(x) for x in (Path(job["out"]) / "metrics.jsonl").read_text().splitlines()]
    evals = [(0, s["eval_start"])] + [(m["step"], {k[5:]: v for k, v in m.items() if k.startswith("eval/")})
                                      for m in metrics if m.get("eval/kl_to_target") is not None]
    end = s["eval_end"]
    row = {"condition": job["condition"], "seed": job["seed"],
           "kl": [(step, e["kl_to_target"]) for step, e in evals],
           "kl_traj": [(step, e["kl_to_trajectory_target"]) for step, e in evals],
           "floor": end["trajectory_target_floor"], "kl_reverse": end["kl_reverse"],
           "expected_reward": end["expected_reward"], "target_expected_reward": end["target_expected_reward"],
           "policy_mass": end["policy_mass"], "train_s": s["train_wall_clock_s"],
           "episodes_failed": sum(metrics[-1].get(f"episode/ended_{r}", 0) for r in ("error", "timeout",
                                                                                      "bad_observation"))}
    if job["fixed_point"]:
        row.update(tabular_fixed_point(str(Path(job["out"]) / "init"), dict(cfg.task.options), cfg.tb.beta_final,
                                       cfg.search.max_new_tokens))
    return row


def final(row: dict, key: str = "kl") -> float:
    return row[key][-1][1]


def table(rows: list[dict], conditions: list[str]) -> str:
    out = ["| condition | final KL(π°‖π_θ): median, worst seed | KL to the trajectory target (its floor) | "
           "E_πθ[r] / E_π°[r] | predicted fixed point, never-synced μ (on-policy μ) |", "|---|---|---|---|---|"]
    for c in conditions:
        rs = [r for r in rows if r["condition"] == c]
        if not rs:
            continue
        kls = [final(r) for r in rs]
        traj = statistics.median(final(r, "kl_traj") for r in rs)
        fp = "—"
        if "fixed_point_kl_never" in rs[0]:
            fp = (f"{statistics.median(r['fixed_point_kl_never'] for r in rs):.4f} "
                  f"({max(abs(r['fixed_point_kl_on_policy']) for r in rs):.1e})")
        out.append(f"| {c} | {statistics.median(kls):.4f}, {max(kls):.4f} | {traj:.4f} "
                   f"({statistics.median(r['floor'] for r in rs):.4f}) | "
                   f"{statistics.median(r['expected_reward'] for r in rs):.3f} / "
                   f"{statistics.median(r['target_expected_reward'] for r in rs):.3f} | {fp} |")
    return "\n".join(out)


def per_seed(rows: list[dict], conditions: list[str]) -> str:
    steps = [s for s, _ in rows[0]["kl"]]
    lines = [f"## Per seed: KL(π° ‖ π_θ) at updates {', '.join(map(str, steps))}\n",
             "| condition | seed | KL along the run | final | KL to trajectory target | floor | predicted (never μ) "
             "| failed episodes | train s |", "|---|---|---|---|---|---|---|---|---|"]
    for c in conditions:
        for r in rows:
            if r["condition"] == c:
                curve = " ".join(f"{v:.3g}" for _, v in r["kl"])
                fp = f"{r['fixed_point_kl_never']:.4f}" if "fixed_point_kl_never" in r else "—"
                lines.append(f"| {c} | {r['seed']} | {curve} | **{final(r):.4f}** | {final(r, 'kl_traj'):.4f} | "
                             f"{r['floor']:.4f} | {fp} | {r['episodes_failed']:.0f} | {r['train_s']:.0f} |")
    return "\n".join(lines)


def plot(rows: list[dict], conditions: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, c in enumerate(conditions):
        for j, r in enumerate(x for x in rows if x["condition"] == c):
            xs, ys = zip(*r["kl"], strict=True)
            ax.plot(xs, [max(y, 1e-4) for y in ys], color=f"C{i}", alpha=0.8, lw=1, label=c if j == 0 else None)
    ax.axhline(0.02, color="grey", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("updates")
    ax.set_ylabel("KL(π° ‖ π_θ), nats")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="enumerable_turns_cpu", help="recipe (path or packaged name)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT / "multiturn")
    ap.add_argument("--results", type=Path, default=RESULTS / "multiturn" / "enumerable_turns.md")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    ap.add_argument("overrides", nargs="*", help="extra config overrides, e.g. trainer.steps=1000")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    overrides = [*SMOKE, *args.overrides] if args.smoke else list(args.overrides)
    jobs = [{"condition": c, "seed": s, "overrides": overrides, "config": args.config, "fixed_point": "never" in c,
             "out": str(args.out / f"{c.replace(', ', '-').replace('=', '')}-s{s}")}
            for s in args.seeds for c in args.conditions]
    rows = []
    with worker_pool(args.workers) as pool:
        for row in pool.map(run_one, jobs):
            print(json.dumps(row), flush=True)
            rows.append(row)
    rows.sort(key=lambda r: (args.conditions.index(r["condition"]), r["seed"]))
    md = table(rows, args.conditions) + "\n\n" + per_seed(rows, args.conditions)
    print(md)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(rows, args.conditions, args.out / args.results.with_suffix(".png").name)
    head = header(__spec__.name, f"recipe: {args.config} (inline runtime, one thread per run); seeds {args.seeds}",
                  "KL(π°‖π_θ): exact, over every trajectory (y₁, o, y₂) the sampler and environment can produce, "
                  "weighted by P(o|y₁); a run's result is its final evaluation", argv=argv)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
