"""`tba buffer stats|dump RUN_DIR`: what a run's durable replay buffer holds, read-only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tba.cli.command import Command
from tba.rollout.episodes import turns


def buffer(ns: argparse.Namespace) -> int:
    action, run_dir, limit = ns.action, ns.run_dir, ns.limit
    from tba.algorithm.store import BufferStore

    store = BufferStore(run_dir, readonly=True)
    if action == "stats":
        print(json.dumps(store.stats(), indent=1))
        return 0
    tokenizer = None
    run = Path(run_dir)
    candidates = [run / "checkpoint", run / "init", *sorted((run / "checkpoints").glob("step_*/model"))]
    for c in candidates:
        if (c / "tokenizer.json").is_file():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(c))
            break
    for n, (seq, step, g) in enumerate(store.iter_groups()):
        if limit is not None and n >= limit:
            break
        row = {"seq": seq, "step": step, "source": g.source, "prompt_id": g.prompt_id, "prompt_tokens": g.prompt_tokens,
               "samples": [{"version": s.version, "reward": s.reward, "response": s.response,
                            "ref_logprob": s.ref_logprob_sum,
                            **({"policy_mask": s.policy_mask} if s.policy_mask else {})}
                           for s in g.samples]}
        if tokenizer is not None:
            row["prompt"] = tokenizer.decode(g.prompt_tokens, skip_special_tokens=True)
            for d, s in zip(row["samples"], g.samples, strict=True):
                d["text"] = tokenizer.decode(s.response, skip_special_tokens=True)
                if s.policy_mask:  # an episode: its turns, whose they are, each decoded
                    d["turns"] = [{"by": "policy" if mine else "environment",
                                   "text": tokenizer.decode(s.response[a:b], skip_special_tokens=False)}
                                  for mine, a, b in turns(s.policy_mask)]
        try:
            print(json.dumps(row))
        except BrokenPipeError:  # `| head`
            return 0
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("stats", "dump"), help="stats: counts, rewards, sources; dump: JSON lines")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (or a buffer.sqlite file)")
    parser.add_argument("--limit", type=int, metavar="N", help="dump: at most N groups")


COMMAND = Command("buffer", "What a run's durable replay buffer holds (stats), or its groups as JSON lines (dump).",
                  arguments, buffer)
