"""Held-out evaluation, independent of the runtime: the task's mean reward plus whatever else it measures.

By default one greedy completion per test prompt, so `score` is greedy pass@1 for a 0/1 verifier. A task
whose metric is a property of the *distribution* of completions (red-teaming: attack success rate and
diversity over sampled attacks) sets `eval.samples_per_prompt` and an `eval.temperature` instead. Tasks may
add metrics through `eval_metrics` (TL;DR: win rate against the reference summaries under a gold reward
model), and `eval.reference_metrics` adds the two distances to π_ref the TL;DR paper reports. A task with
`exact_metrics` (responses few enough to enumerate) adds metrics of the whole distribution π_θ, given the
run's `Scoring` (the `enumerable` task: KL to the exact target π*).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tba.config.schema import EvalConfig
from tba.models.generation import ended_with_eos, generate
from tba.models.logprobs import reference_kl
from tba.rollout.episodes import END_REASONS, Limits, run_episodes
from tba.tasks.base import Prompt, Scoring, TaskAdapter


@dataclass
class Completions:
    """Flat list of evaluation completions; prompts[i] is the prompt of completion i."""

    prompts: list[Prompt]
    prompt_tokens: list[list[int]]
    responses: list[list[int]]
    texts: list[str]
    finished: list[bool]


@torch.no_grad()
def complete(model, tokenizer, prompts: list[Prompt], *, max_new_tokens: int, batch_size: int,
             samples_per_prompt: int = 0, temperature: float = 1.0, top_p: float = 1.0) -> Completions:
    """Greedy (samples_per_prompt = 0: one per prompt) or sampled completions of `prompts`."""
    was_training = model.training
    model.eval()
    n = max(samples_per_prompt, 1)
    chunk_size = max(1, batch_size // n)
    out = Completions([], [], [], [], [])
    for start in range(0, len(prompts), chunk_size):
        chunk = prompts[start:start + chunk_size]
        tokens = [tokenizer(p.text)["input_ids"] for p in chunk]
        results = generate(model, tokens, greedy=samples_per_prompt == 0, num_samples=n, temperature=temperature,
                           top_p=top_p, max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_token_id,
                           pad_id=tokenizer.pad_token_id, logprobs=False)
        responses = [r for r, _ in results]
        out.prompts += [p for p in chunk for _ in range(n)]
        out.prompt_tokens += [t for t in tokens for _ in range(n)]
        out.responses += responses
        out.texts += tokenizer.batch_decode(responses, skip_special_tokens=True)
        out.finished += ended_with_eos(responses, tokenizer.eos_token_id)
    model.train(was_training)
    return out


@torch.no_grad()
def reference_metrics(policy, reference, c: Completions, pad_id: int, batch_size: int = 16) -> dict[str, float]:
    """The TL;DR paper's two distances of the policy's completions to π_ref (both at temperature 1):

    kl_ref:         Σ_tokens Σ_v π_ref(v) (log π_ref(v) − log π_θ(v)) / Σ_tokens 1, i.e. the full-vocabulary
                    KL(π_ref ‖ π_θ) per response token, token-weighted over all completions.
    perplexity_ref: mean over completions of exp( −Σ_{response t} log π_ref(y_t) / (prompt + response length) ).
                    The denominator counts *all* attended tokens, prompt included — the quirk of the code the
                    paper's Table 1 numbers come from (values are pushed toward 1); reproduced so they compare.
    """
    was_training = policy.training
    policy.eval()
    kl_sum, tokens, perplexities = 0.0, 0.0, []
    for start in range(0, len(c.responses), batch_size):
        prompts, responses = c.prompt_tokens[start:start + batch_size], c.responses[start:start + batch_size]
        kl_tok, ref_tok, mask = reference_kl(policy, reference, prompts, responses, pad_id)  # [N, R] each
        kl_sum += kl_tok.sum().item()
        tokens += mask.sum().item()
        nll = -ref_tok.sum(-1)  # [N]
        attended = torch.tensor([len(p) + len(r) for p, r in zip(prompts, responses, strict=True)],
                                device=nll.device)
        perplexities += torch.exp(nll / attended).tolist()
    policy.train(was_training)
    return {"kl_ref": kl_sum / max(tokens, 1.0), "perplexity_ref": sum(perplexities) / max(len(perplexities), 1)}


def evaluate(policy, tokenizer, task, prompts: list[Prompt], cfg, reference=None,
             scoring: Scoring | None = None, limits: Limits | None = None) -> dict[str, float]:
    """{score: mean reward of the evaluation completions, **task.eval_metrics, **reference_metrics,
    **task.exact_metrics (given `scoring` and `reference`)}.

    `cfg` is an EvalConfig; `limits` a multi-turn task's episode limits. A reward that raises or is not finite
    scores 0 here: evaluation must not stop a run (the searchers count such failures).
    """
    if not prompts:
        return {"score": math.nan}
    task = TaskAdapter.of(task)
    if task.episodic:
        metrics = episode_metrics(policy, tokenizer, task, prompts, cfg, limits or Limits())
    else:
        c = complete(policy, tokenizer, prompts, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
                     samples_per_prompt=cfg.samples_per_prompt, temperature=cfg.temperature, top_p=cfg.top_p)
        metrics = task_metrics(task, c)
        if cfg.reference_metrics and reference is not None:
            metrics.update(reference_metrics(policy, reference, c, tokenizer.pad_token_id))
    if scoring is not None and reference is not None:
        metrics.update(task.exact_metrics(policy, reference, tokenizer, scoring))
    return metrics


class Evaluator:
    """The held-out evaluation a run repeats: `policy` (the trainer's, updated in place) on the task's test
    prompts, with the run's `Scoring` for a task that measures π_θ exactly."""

    def __init__(self, policy, tokenizer, task, cfg: EvalConfig, *, reference=None, scoring: Scoring | None = None,
                 limits: Limits | None = None):
        self.policy, self.tokenizer, self.task, self.cfg = policy, tokenizer, task, cfg
        self.reference, self.scoring, self.limits = reference, scoring, limits

    def __call__(self) -> dict[str, float]:
        return evaluate(self.policy, self.tokenizer, self.task, self.task.test, self.cfg, reference=self.reference,
                        scoring=self.scoring, limits=self.limits)

    def describe(self, metrics: dict[str, float]) -> str:
        """One log line: the greedy pass@1 when that is all there is, else every metric."""
        if len(metrics) == 1 and self.cfg.samples_per_prompt == 0:
            return f"score (greedy pass@1, {len(self.task.test)} problems) {metrics['score']:.3f}"
        return "eval " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())


def task_metrics(task, c: Completions) -> dict[str, float]:
    """{score: mean reward of `c`, **task.eval_metrics(c)}: what the task itself says of these completions."""
    task = TaskAdapter.of(task)
    return {"score": task.accuracy(c.prompts, c.texts, c.finished, c.responses),
            **task.eval_metrics(c.prompts, c.texts, c.finished)}


@torch.no_grad()
def episode_metrics(policy, tokenizer, task, prompts: list[Prompt], cfg, limits: Limits) -> dict[str, float]:
    """A multi-turn task's evaluation: one greedy episode per test prompt (or `eval.samples_per_prompt` sampled
    ones), each turn at most eval.max_new_tokens. score = mean episode reward (a failed episode scores 0);
    episode/turns_mean; episode/ended_<reason> as fractions of the episodes; and the task's own
    `episode_metrics(episodes)` (e.g. success by turn) where it has one."""
    was_training = policy.training
    policy.eval()
    greedy, n = cfg.samples_per_prompt == 0, max(cfg.samples_per_prompt, 1)

    def policy_turns(contexts, max_new_tokens):
        out = []
        for start in range(0, len(contexts), cfg.batch_size):
            out += generate(policy, contexts[start:start + cfg.batch_size], greedy=greedy, temperature=cfg.temperature,
                            top_p=cfg.top_p, max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_token_id,
                            pad_id=tokenizer.pad_token_id, logprobs=False)
        return out

    tokens = [tokenizer(p.text)["input_ids"] for p in prompts]
    episodes = run_episodes(policy_turns, tokenizer, task, prompts, tokens, num_samples=n,
                            max_new_tokens=cfg.max_new_tokens, limits=limits)
    policy.train(was_training)
    metrics = {"score": sum(e.reward or 0.0 for e in episodes) / len(episodes),
               "episode/turns_mean": sum(e.turns for e in episodes) / len(episodes)}
    metrics.update({f"episode/ended_{r}": sum(e.end == r for e in episodes) / len(episodes) for r in END_REASONS
                    if any(e.end == r for e in episodes)})
    metrics.update(TaskAdapter.of(task).episode_metrics(episodes))
    return metrics


def greedy_accuracy(model, tokenizer, task, prompts: list[Prompt], max_new_tokens: int, batch_size: int) -> float:
    """Greedy pass@1: the mean reward of one greedy completion per prompt."""
    c = complete(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size)
    return TaskAdapter.of(task).accuracy(c.prompts, c.texts, c.finished)

