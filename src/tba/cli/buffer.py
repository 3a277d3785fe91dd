"""`tba buffer stats|dump RUN_DIR`: what a run's durable replay buffer holds, read-only."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from tba.cli.command import Command
from tba.rollout.episodes import turns

logger = logging.getLogger(__name__)


def buffer(ns: argparse.Namespace) -> int:
    action, run_dir, limit = ns.action, ns.run_dir, ns.limit
    from tba.algorithm.store import BufferStore

    store = BufferStore(run_dir, readonly=True)
    if action == "stats":
        print(json.dumps(store.stats(), indent=1))
        return 0
    tokenizer = run_tokenizer(store.path.parent)
    if tokenizer is None:
        logger.warning(f"no tokenizer found for {store.path.parent} (its config's model.policy, init/ or a "
                       "checkpoint): token ids only")
    for n, (seq, step, g) in enumerate(store.iter_groups()):
        if limit is not None and n >= limit:
            break
        row = {"seq": seq, "step": step, "source": g.source, "prompt_id": g.prompt_id, "prompt_tokens": g.prompt_tokens,
               "samples": [{"version": s.version, "reward": s.reward, "response": s.response,
                            "ref_logprob": s.ref_logprob_sum,
                            **({"policy_mask": s.policy_mask} if s.policy_mask else {}),
                            **({"versions": version_spans(s.versions)} if s.versions else {})}
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


def run_tokenizer(run: Path):
    """The tokenizer a run's samples were tokenized with: the run's own copy (its final policy, its start in init/, a
    checkpoint), else the one its config names (model.policy: a hub name, a directory or a .gguf, loaded offline) —
    a run that stopped before writing either still has its config. None when there is none to find."""
    from tba.models import load_tokenizer

    for c in [run / "checkpoint", run / "init", *sorted((run / "checkpoints").glob("step_*/model"))]:
        if (c / "tokenizer.json").is_file() or (c / "tokenizer_config.json").is_file():
            return load_tokenizer(str(c))
    if not (run / "config.yaml").is_file():
        return None
    from tba.config import load_config
    from tba.errors import UserError

    try:
        policy = load_config(run / "config.yaml").model.policy
        return None if policy in ("builtin", "<in memory>") else load_tokenizer(policy)
    except (UserError, OSError, ValueError) as e:
        logger.warning(f"the tokenizer of {run}'s model.policy could not be loaded: {e}")
        return None


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("stats", "dump"), help="stats: counts, rewards, sources; dump: JSON lines")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (or a buffer.sqlite file)")
    parser.add_argument("--limit", type=int, metavar="N", help="dump: at most N groups")


COMMAND = Command("buffer", "What a run's durable replay buffer holds (stats), or its groups as JSON lines (dump).",
                  arguments, buffer)


def version_spans(versions: list[int]) -> list[list[int]]:
    """Per-token versions as [first token, version] spans: [[0, 3], [17, 4]] = tokens 0–16 by version 3, the
    rest by version 4."""
    return [[i, v] for i, v in enumerate(versions) if i == 0 or versions[i - 1] != v]
