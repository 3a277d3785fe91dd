"""What a multi-turn recipe's starting policy does before any training: sampled episodes on its held-out prompts,
with the evaluation's metrics (score, turns, end reasons, and the task's own — for tool use, the share of
episodes that call the tool). A task whose starting policy never takes the action that earns reward gives RL
nothing to reinforce; this is the check to run before spending an hour on training.

    python -m bench.tools.episode_base_rate tool_arith_smollm2_cpu --prompts 24 --samples 4 --temperature 0.7

Writes bench/results/episode_base_rate/<recipe>.md (the metrics and three decoded episodes).
"""

from __future__ import annotations

import argparse
import json

import torch

from bench.lib.header import header
from bench.lib.paths import RESULTS
from tba.build import build_models, build_task
from tba.config import load_config
from tba.episodes import run_episodes, turns
from tba.evaluate import episode_metrics
from tba.tasks.prepare import apply_chat_template


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipe")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = load_config(args.recipe, [f"task.test_size={args.prompts}", f"eval.samples_per_prompt={args.samples}",
                                    f"eval.temperature={args.temperature}", f"seed={args.seed}"])
    task = build_task(cfg)
    tokenizer, policy, _, _ = build_models(cfg, task, log=lambda m: None)
    apply_chat_template(task, tokenizer, every_prompt=cfg.task.chat_template)
    limits = cfg.search.episode_limits(cfg.eval.max_new_tokens)
    torch.manual_seed(args.seed)
    metrics = episode_metrics(policy, tokenizer, task, task.test, cfg.eval, limits)
    print(json.dumps(metrics, indent=1))

    def greedy(contexts, n):
        from tba.generation import generate
        return generate(policy, contexts, greedy=True, max_new_tokens=n, eos_id=tokenizer.eos_token_id,
                        pad_id=tokenizer.pad_token_id, logprobs=False)

    first = task.test[:3]
    shown = run_episodes(greedy, tokenizer, task, first, [tokenizer(p.text)["input_ids"] for p in first],
                         num_samples=1, max_new_tokens=cfg.eval.max_new_tokens, limits=limits)
    examples = []
    for e in shown:
        parts = [f"[{'policy' if mine else 'environment'}] {tokenizer.decode(e.tokens[a:b])}"
                 for mine, a, b in turns(e.mask)]
        examples.append(f"- prompt {e.prompt.id} ({e.end}, reward {e.reward}): " + " ".join(parts).replace("\n", "⏎"))
    out = RESULTS / "episode_base_rate" / f"{args.recipe}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    body = (f"## Sampled episodes of the starting policy ({args.prompts} held-out prompts × {args.samples} = "
            f"{args.prompts * args.samples} episodes, "
            f"T = {args.temperature})\n\n```json\n{json.dumps(metrics, indent=1)}\n```\n\n"
            "## Three greedy episodes, decoded\n\n" + "\n".join(examples) + "\n")
    out.write_text(header(__spec__.name, f"recipe: {args.recipe}, before any training") + body)
    print(body)


if __name__ == "__main__":
    main()
