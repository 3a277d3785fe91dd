"""What a multi-turn recipe's starting policy does before any training: sampled episodes on its held-out prompts,
with the evaluation's metrics (score, turns, end reasons, and the task's own — for tool use, the share of
episodes that call the tool). A task whose starting policy never takes the action that earns reward gives RL
nothing to reinforce; this is the check to run before spending an hour on training.

With `--demonstrations N` it also scores N of the task's own demonstrations (`demonstrations()`, played through
the environment as `data.source: task` does) under π_ref at search.temperature, over the policy's tokens: TB's
target π* ∝ π_ref·exp(r/β) puts more weight on a demonstrated episode of reward r than on all of π_ref's
unrewarded mass together only when r/β > −log π_ref(episode), i.e. β < r / (−log π_ref): the largest β at which the
target prefers what the demonstrations do.

    python -m bench.tools.episode_base_rate tool_arith_smollm2_cpu --prompts 24 --samples 4 --temperature 0.7
    python -m bench.tools.episode_base_rate tool_arith_smollm2_cpu --prompts 24 --samples 0 --demonstrations 200

Writes bench/results/episode_base_rate/<recipe>.md (the metrics and three decoded episodes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch

from bench.lib.header import header
from bench.lib.paths import RESULTS
from tba.config import load_config
from tba.rollout.demonstrations import make_groups, read_rows
from tba.rollout.episodes import Limits, run_episodes, turns
from tba.rollout.evaluate import episode_metrics
from tba.run.build import build_models, build_task
from tba.tasks.prepare import apply_chat_template


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipe")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--demonstrations", type=int, default=0, help="score this many of the task's demonstrations")
    args = ap.parse_args()
    cfg = load_config(args.recipe, [f"task.test_size={args.prompts}", f"eval.samples_per_prompt={max(args.samples, 1)}",
                                    f"eval.temperature={args.temperature}", f"seed={args.seed}"])
    task = build_task(cfg)
    tokenizer, policy, _, _ = build_models(cfg, task)
    apply_chat_template(task, tokenizer, every_prompt=cfg.task.chat_template)
    limits = Limits.of(cfg.search, cfg.eval.max_new_tokens)
    torch.manual_seed(args.seed)
    body = ""
    if args.samples:
        metrics = episode_metrics(policy, tokenizer, task, task.test, cfg.eval, limits)
        print(json.dumps(metrics, indent=1))
        body += (f"## Sampled episodes of the starting policy ({args.prompts} held-out prompts × {args.samples} = "
                 f"{args.prompts * args.samples} episodes, T = {args.temperature})\n\n"
                 f"```json\n{json.dumps(metrics, indent=1)}\n```\n\n")
    if args.demonstrations:
        body += demonstrations_under_ref(cfg, task, tokenizer, policy, args.demonstrations) + "\n"

    def greedy(contexts, n):
        from tba.models.generation import generate
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
    body += "## Three greedy episodes, decoded\n\n" + "\n".join(examples) + "\n"
    out = RESULTS / "episode_base_rate" / f"{args.recipe}{'_demonstrations' if args.demonstrations else ''}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header(__spec__.name, f"recipe: {args.recipe}, before any training") + body)
    print(body)


def demonstrations_under_ref(cfg, task, tokenizer, reference, n: int) -> str:
    """log π_ref (search.temperature, the policy's tokens) of `n` task demonstrations, and the β below which TB's
    target weighs each above π_ref's whole unrewarded mass (r/β > −log π_ref)."""
    data = dataclasses.replace(cfg.data, source="task", bad_rows="skip")
    rows = read_rows(data, task, cfg.seed)[:n]
    groups, report = make_groups(rows, data, task=task, prompt_ids={}, tokenizer=tokenizer, reference=reference,
                                 temperature=cfg.search.temperature, max_new_tokens=cfg.search.max_new_tokens,
                                 limits=Limits.of(cfg.search))
    samples = [s for g in groups for s in g.samples]
    logp = sorted(sum(s.ref_logprobs) for s in samples)
    beta_max = sorted(s.reward / -sum(s.ref_logprobs) for s in samples if s.reward > 0)
    line = (f"{len(samples)} demonstrations kept ({report.line('task')}), reward mean "
            f"{statistics.mean(s.reward for s in samples):.3f}; log π_ref over the policy's tokens at T = "
            f"{cfg.search.temperature}: median {statistics.median(logp):.2f}, least likely {logp[0]:.2f}, most likely "
            f"{logp[-1]:.2f} nats; β below which π* weighs a rewarded demonstration above all unrewarded mass: "
            f"median {statistics.median(beta_max):.4f}, for the least likely {beta_max[0]:.4f} "
            f"(the recipe's β: {cfg.tb.beta_final})")
    print(line)
    return "## The task's demonstrations under π_ref\n\n" + line + "\n"


if __name__ == "__main__":
    main()
