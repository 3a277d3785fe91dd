"""What one searcher batch and one trainer update cost on this machine's CPU: float32 against `model.autocast`
(bfloat16), and the trainer's forward over prompt + response per sample against each group's prompt run once
(`trainer.shared_prompts`); and how far autocast moves the π_ref log-probs the searchers store.

    python -m bench.perf.update_cost                 # SmolLM2-135M on smollm2_rg_cpu's shapes, 3 repeats
    python -m bench.perf.update_cost --smoke         # a tiny model, seconds (CI); the numbers mean nothing

What runs is tba's own code at the recipe's settings, one thread (a process's share of this machine's 2 cores):
a `Searcher` (hf sampler) makes one batch — prompts_per_batch prompts × generations_per_prompt samples, π_ref
scoring included — and a `Trainer` takes one update on B prompts × K of those samples (the recipe's objective,
micro-batches and lr). The variants (VARIANTS: trainer.shared_prompts off and on in float32, then on under
model.autocast=bfloat16) each have their own searcher and trainer built from the same weights, and alternate
repeat by repeat with the same seed, so that a busy machine slows them alike; ratios (to the first) are within
one run. |Δ log π_ref| = mean over the autocast searcher's sampled tokens of
|its stored π_ref log-prob − float32's of the same token|: how far the target TB trains towards is moved by
rounding (the trainer's log π_θ is computed under the same autocast). Writes --results (default
bench/results/update_cost/update_cost.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.lib.header import header
from bench.lib.paths import RESULTS
from bench.perf.quantized_sampler import load
from tba.algorithm.trainer import Trainer
from tba.algorithm.types import Draw
from tba.models.logprobs import shared_prompt_logprobs
from tba.rollout.samplers.hf import HFSampler
from tba.rollout.searcher import Searcher
from tba.run.build import trainer_args

VARIANTS = {"float32, prompt per sample": (None, False), "float32, shared prompts": (None, True),
            "bfloat16 autocast, shared prompts": ("bfloat16", True)}
"""name: (model.autocast, trainer.shared_prompts)."""


def cpu_flags() -> str:
    """Whether this CPU has the bfloat16 matrix units autocast's speed depends on."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    return ", ".join(f"{f} {'yes' if f' {f}' in flags else 'no'}" for f in ("avx512_bf16", "amx_bf16"))


def build(m: dict, cfg, autocast: str | None, shared: bool, seed: int):
    model, tok = m["model"], m["tokenizer"]
    cfg = copy.deepcopy(cfg)
    cfg.model.autocast, cfg.trainer.shared_prompts = autocast, shared
    searcher = Searcher(HFSampler(copy.deepcopy(model), tok), copy.deepcopy(model), tok, m["task"], cfg.search,
                        seed=seed, autocast=autocast)
    trainer = Trainer(copy.deepcopy(model), **trainer_args(cfg, None, tok.pad_token_id))
    return searcher, trainer


@torch.no_grad()
def ref_drift(reference, groups, temperature: float, pad_id: int) -> float:
    """Mean |stored π_ref log-prob − float32's| over the groups' sampled tokens."""
    out = []
    for g in groups:
        exact = shared_prompt_logprobs(reference, [g.prompt_tokens], [s.response for s in g.samples], len(g.samples),
                                       temperature, pad_id)
        for i, s in enumerate(g.samples):
            out += (torch.tensor(s.ref_logprobs) - exact[i, :len(s.response)]).abs().tolist()
    return statistics.mean(out) if out else 0.0


def bench(name: str, args, smoke_dir) -> list[dict]:
    m = load(name, smoke_dir)
    cfg = m["cfg"]
    torch.set_num_threads(args.threads)
    t = cfg.trainer
    pairs = {name: build(m, cfg, *v, seed=0) for name, v in VARIANTS.items()}
    runs = {v: {"search_s": [], "train_s": [], "tokens": [], "reward": [], "drift": [], "loss": []} for v in VARIANTS}
    for rep in range(args.repeats + 1):  # repeat 0 warms up and is dropped
        for v, (searcher, trainer) in pairs.items():
            torch.manual_seed(rep)
            t0 = time.perf_counter()
            groups = searcher.step()
            search_s = time.perf_counter() - t0
            draws = [Draw(g.prompt_id, g.prompt_tokens, g.samples[:t.samples_per_prompt], online=True)
                     for g in groups[:t.prompts_per_step]]
            t0 = time.perf_counter()
            metrics = trainer.step(draws)
            train_s = time.perf_counter() - t0
            if rep == 0:
                continue
            r = runs[v]
            r["search_s"].append(search_s)
            r["train_s"].append(train_s)
            r["tokens"].append(sum(len(s.response) for g in groups for s in g.samples))
            r["reward"] += [s.reward for g in groups for s in g.samples]
            r["drift"].append(ref_drift(m["model"], groups, cfg.search.temperature, m["tokenizer"].pad_token_id))
            r["loss"].append(metrics["trainer/loss"])
    rows = []
    for v, r in runs.items():
        rows.append({"model": name, "source": m["source"], "variant": v, "threads": args.threads,
                     "search_batch": f"{cfg.search.prompts_per_batch}×{cfg.search.generations_per_prompt}",
                     "update": f"{t.prompts_per_step}×{t.samples_per_prompt}",
                     "search_s": statistics.median(r["search_s"]), "search_s_runs": r["search_s"],
                     "search_tokens_per_s": statistics.median(n / s for n, s in zip(r["tokens"], r["search_s"],
                                                                                       strict=True)),
                     "train_s": statistics.median(r["train_s"]), "train_s_runs": r["train_s"],
                     "reward": statistics.mean(r["reward"]), "samples": len(r["reward"]),
                     "ref_drift": statistics.median(r["drift"]), "loss_runs": r["loss"], "repeats": args.repeats})
    for row in rows:
        row["search_speedup"] = rows[0]["search_s"] / row["search_s"]
        row["train_speedup"] = rows[0]["train_s"] / row["train_s"]
        print(json.dumps({k: x for k, x in row.items() if not k.endswith("_runs")}), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| model | variant | searcher batch s (median) | × first | searcher tokens/s | trainer update s (median) "
           "| × first | task reward of the samples (n) | \\|Δ log π_ref\\| per token |", "|---" * 9 + "|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['variant']} | {r['search_s']:.2f} | {r['search_speedup']:.2f} | "
                   f"{r['search_tokens_per_s']:.0f} | {r['train_s']:.2f} | {r['train_speedup']:.2f} | "
                   f"{r['reward']:.3f} ({r['samples']}) | {r['ref_drift']:.4f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1, help="a process's share of this machine's 2 cores")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, seconds (CI); the numbers mean nothing")
    ap.add_argument("--results", type=Path, default=RESULTS / "update_cost" / "update_cost.md")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench("smoke" if args.smoke else "smollm2", args, Path(tmp) / "tiny" if args.smoke else None)
    head = header(__spec__.name, f"one searcher batch (prompts × samples: {rows[0]['search_batch']}, π_ref scoring "
                  f"included) and one trainer update (B × K: {rows[0]['update']}) per variant and repeat, "
                  f"{args.threads} thread(s), medians of {args.repeats} interleaved repeats after one warm-up",
                  f"CPU: {cpu_flags()}", argv=argv)
    text = head + table(rows) + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n"
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(text)
    print(text.split("```json")[0])


if __name__ == "__main__":
    main()
