"""What π_ref scoring of a searcher batch costs: one forward over every response padded to the longest, against
length buckets (tba.models.length_buckets: forwards each padded to their own longest).

    python -m bench.perf.scoring                     # SmolLM2-135M on smollm2_rg_long_cpu and smollm2_rg_cpu
    python -m bench.perf.scoring --smoke             # the tiny builtin model, seconds (CI); the numbers mean nothing

What runs is tba's own code at each recipe's settings, one thread (a process's share of this machine's 2 cores): a
`Searcher` (hf sampler, static batching) makes --batches batches, untimed; each batch is then scored by the
reference, `shared_prompt_logprobs` with `buckets` off and on, alternating repeat by repeat so that a busy machine
slows both alike; ratios are within one run. Padded positions = rows × longest response, summed over a call's
forwards: what length buckets cut. The largest |difference| between the two's log-probs is printed too (they are
the same computation, padded differently).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench.lib.header import header
from bench.lib.paths import RESULTS
from bench.perf.continuous import SMOKE, make
from tba.models.length_buckets import length_buckets
from tba.models.logprobs import CALL_OVERHEAD, shared_prompt_logprobs
from tba.rollout.samplers.hf import HFSampler
from tba.rollout.searcher import Searcher


def bench(recipe: str, overrides: list[str], batches: int, repeats: int) -> list[dict]:
    cfg, task, tokenizer, policy, reference = make(recipe, overrides)  # (the smoke's warm start trains: no no_grad)
    with torch.no_grad():
        return measure(cfg, task, tokenizer, policy, reference, recipe, batches, repeats)


def measure(cfg, task, tokenizer, policy, reference, recipe: str, batches: int, repeats: int) -> list[dict]:
    searcher = Searcher(HFSampler(policy, tokenizer), reference, tokenizer, task, cfg.search, seed=0,
                        autocast=cfg.model.autocast)
    torch.manual_seed(0)
    s, pad, temperature = cfg.search.generations_per_prompt, tokenizer.pad_token_id, cfg.search.temperature
    rows = []
    for b in range(batches):
        groups = searcher.step()
        prompts = [g.prompt_tokens for g in groups]
        responses = [x.response for g in groups for x in g.samples]
        if any(len(g.samples) != s for g in groups):
            continue  # a dropped sample (reward error) leaves a group short: shared_prompt_logprobs needs S each
        lengths = [len(r) for r in responses]
        runs = length_buckets(lengths, sum(len(p) for p in prompts) + CALL_OVERHEAD)
        times = {False: [], True: []}
        out = {}
        for _ in range(repeats + 1):  # the first round warms up and is dropped
            for buckets in (False, True):
                t0 = time.perf_counter()
                out[buckets] = shared_prompt_logprobs(reference, prompts, responses, s, temperature, pad, buckets)
                times[buckets].append(time.perf_counter() - t0)
        one, split = (statistics.median(times[k][1:]) for k in (False, True))
        row = {"recipe": recipe, "batch": b, "responses": len(responses), "length_median": statistics.median(lengths),
               "length_max": max(lengths), "forwards": len(runs),
               "padded_one": len(lengths) * max(lengths),
               "padded_buckets": sum(len(r) * max(lengths[i] for i in r) for r in runs),
               "one_s": one, "buckets_s": split, "speedup": one / split,
               "one_s_runs": times[False][1:], "buckets_s_runs": times[True][1:],
               "max_abs_diff": float((out[False] - out[True]).abs().max())}
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_runs")}), flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| recipe | batches | responses per batch | response length median / max (median over batches) "
           "| forwards per call (median) | padded positions, buckets ÷ one forward (median) "
           "| one forward s (median) | length buckets s (median) | speed-up (median; worst batch) "
           "| max \\|Δ log-prob\\| |", "|---|---|---|---|---|---|---|---|---|---|"]
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        rs = [r for r in rows if r["recipe"] == recipe]
        out.append(f"| {recipe} | {len(rs)} | {rs[0]['responses']} | "
                   f"{statistics.median(r['length_median'] for r in rs):g} / "
                   f"{statistics.median(r['length_max'] for r in rs):g} | "
                   f"{statistics.median(r['forwards'] for r in rs):g} | "
                   f"{statistics.median(r['padded_buckets'] / r['padded_one'] for r in rs):.2f} | "
                   f"{statistics.median(r['one_s'] for r in rs):.2f} | "
                   f"{statistics.median(r['buckets_s'] for r in rs):.2f} | "
                   f"{statistics.median(r['speedup'] for r in rs):.2f}×; {min(r['speedup'] for r in rs):.2f}× | "
                   f"{max(r['max_abs_diff'] for r in rs):.1e} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", nargs="+", default=["smollm2_rg_long_cpu", "smollm2_rg_cpu"])
    ap.add_argument("--batches", type=int, default=4, help="searcher batches scored per recipe")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per batch and variant")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--results", type=Path, default=RESULTS / "scoring" / "scoring.md")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    runs = [("arith_tiny_cpu", SMOKE)] if args.smoke else [(r, []) for r in args.recipes]
    batches, repeats = (2, 1) if args.smoke else (args.batches, args.repeats)
    rows = [row for recipe, overrides in runs for row in bench(recipe, overrides, batches, repeats)]
    md = table(rows)
    print(md)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    head = header(__spec__.name, f"one torch thread; π_ref scoring of {batches} searcher batches per recipe, "
                  f"{repeats} timed calls per batch and variant after one warm-up, the variants alternating",
                  argv=argv)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
