"""The inference endpoint's throughput (tba.serve): N concurrent requests vs one at a time, and both against the
in-process batch they share, at equal rows.

    python -m bench.perf.serve                       # SmolLM2-135M (smollm2_rg_cpu), 16 concurrent, 3 repeats
    python -m bench.perf.serve --concurrency 4 16 --requests 32 --new-tokens 64
    python -m bench.perf.serve --smoke               # the tiny builtin model, seconds (CI); the numbers mean nothing

Conditions, interleaved repeat by repeat on the same prompts (the recipe's task prompts, as token ids):

  in-process, N rows      tba.serve.hf_batch driven directly, N requests in flight (no HTTP): the ceiling
  endpoint, N concurrent  N clients posting to /inference/v1/generate at once (httpx, one asyncio loop)
  endpoint, 1 at a time   the same requests one after another

tokens/s = completion tokens returned / wall seconds for all --requests requests (each up to --new-tokens, EOS
ends one early, the recipe's temperature). The issue's bar: endpoint at 16 concurrent ≥ 0.8× in-process at 16
rows. Writes --results (default bench/results/serve/serve.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch

from bench.lib.header import header
from bench.lib.paths import RESULTS
from bench.lib.smoke import SMOKE_OVERRIDES
from tba.config import load_config
from tba.run.serve import served
from tba.serve.engine import Params
from tba.serve.hf_batch import HFBatch
from tba.serve.protocol import Limits
from tba.serve.server import EngineLoop, Server, batch_for

MODEL = "bench"


def prompts_of(cfg, tokenizer, n: int) -> list[list[int]]:
    from tba.run.build import build_task

    task = build_task(cfg, tokenizer)
    texts = [p.text for p in task.test][:n] or ["1+1="]
    return [tokenizer.encode(t) for t in (texts * (n // len(texts) + 1))[:n]]


def in_process(sampler, prompts, p: Params, rows: int) -> int:
    batch, todo, tokens = HFBatch(sampler, rows), list(enumerate(prompts)), 0
    while todo or not batch.idle:
        while todo and batch.active + len(batch.queue) < rows:
            i, prompt = todo.pop(0)
            batch.add(str(i), prompt, p)
        tokens += sum(t.token >= 0 for t in batch.step(0))
    return tokens


async def through_endpoint(url: str, token: str, prompts, p: Params, concurrency: int) -> int:
    queue = list(prompts)
    sp = {"temperature": p.temperature, "max_tokens": p.max_tokens}

    async def client(c):
        done = 0
        while queue:
            prompt = queue.pop(0)
            body = {"model": MODEL, "token_ids": prompt, "sampling_params": sp}
            r = await c.post("/inference/v1/generate", json=body)
            r.raise_for_status()
            done += len(r.json()["choices"][0]["token_ids"])
        return done

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=600) as c:
        return sum(await asyncio.gather(*(client(c) for _ in range(concurrency))))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cache = tempfile.mkdtemp(prefix="tba-bench-serve-")
    cfg = load_config(None if args.smoke else args.recipe,
                      [*SMOKE_OVERRIDES, f"sft.cache_dir={cache}", "sft.enabled=false"] if args.smoke else [])
    torch.set_num_threads(args.threads)
    policy = served(cfg, None, name=MODEL, slots=max(args.concurrency))
    prompts = prompts_of(cfg, policy.tokenizer, args.requests)
    p = Params(temperature=cfg.search.temperature, max_tokens=args.new_tokens)
    engine = EngineLoop(batch_for(policy.sampler, max(args.concurrency)))
    rows = []
    with Server(engine, policy.tokenizer, model_name=MODEL, limits=Limits(max_model_len=policy.max_model_len)) as s:
        asyncio.run(through_endpoint(s.url, s.token, prompts[:2], p, 2))  # warm-up
        for rep in range(args.repeats):
            for n in args.concurrency:
                for condition in ("in-process", "endpoint", *(("endpoint, 1 at a time",) if n == args.concurrency[0]
                                                              else ())):
                    torch.manual_seed(rep)
                    t0 = time.perf_counter()
                    if condition == "in-process":
                        tokens = in_process(policy.sampler, prompts, p, n)
                    else:
                        tokens = asyncio.run(through_endpoint(s.url, s.token, prompts, p,
                                                              1 if "1 at a time" in condition else n))
                    wall = time.perf_counter() - t0
                    rows.append({"condition": condition, "concurrency": 1 if "1 at a time" in condition else n,
                                 "repeat": rep, "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall})
                    print(f"{condition:22} n={rows[-1]['concurrency']:3}  {tokens / wall:8.1f} tokens/s", flush=True)
    policy.close()
    shutil.rmtree(cache, ignore_errors=True)
    write(args, cfg, rows)


def write(args, cfg, rows: list[dict]) -> None:
    def median(condition, n):
        return statistics.median(r["tokens_per_s"] for r in rows if r["condition"] == condition
                                 and r["concurrency"] == n)

    lines = ["| condition | requests in flight | tokens/s (median) | ÷ in-process at equal rows |", "|---|---|---|---|"]
    for n in args.concurrency:
        base = median("in-process", n)
        lines.append(f"| in-process | {n} | {base:.1f} | 1.00 |")
        lines.append(f"| endpoint | {n} | {median('endpoint', n):.1f} | {median('endpoint', n) / base:.2f} |")
    one = median("endpoint, 1 at a time", 1)
    lines.append(f"| endpoint, 1 at a time | 1 | {one:.1f} | — |")
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header("bench.perf.serve", f"model: {cfg.model.policy}; {args.requests} requests of up to "
                          f"{args.new_tokens} tokens at T = {cfg.search.temperature}, {args.threads} thread(s)",
                          argv=args.argv)
                   + "\n".join(lines) + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")
    print(f"wrote {out}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="smollm2_rg_cpu")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results", default=str(RESULTS / "serve" / "serve.md"))
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.concurrency, args.requests, args.new_tokens, args.repeats = [4], 8, 8, 1
    args.argv = argv
    return args


if __name__ == "__main__":
    main()
