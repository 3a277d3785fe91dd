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
from collections.abc import Callable
from dataclasses import dataclass, field

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


def _decode(model, tokens, *, greedy: bool, n: int, temperature: float, top_p: float, max_new_tokens: int,
            tokenizer) -> list[list[int]]:
    """Response ids of `tokens`: the HF model's decoding (tba.models.generation), or — `model` not a torch module —
    a Sampler's (tba.rollout.samplers, e.g. vLLM's engine: `tba eval --backend vllm`; temperature 0 is its greedy)."""
    if not isinstance(model, torch.nn.Module):
        return [r for r, _ in model.generate(tokens, num_samples=n, temperature=0.0 if greedy else temperature,
                                             top_p=1.0 if greedy else top_p, max_new_tokens=max_new_tokens)]
    return [r for r, _ in generate(model, tokens, greedy=greedy, num_samples=n, temperature=temperature, top_p=top_p,
                                   max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_token_id,
                                   pad_id=tokenizer.pad_token_id, logprobs=False)]


@torch.no_grad()
def complete(model, tokenizer, prompts: list[Prompt], *, max_new_tokens: int, batch_size: int,
             samples_per_prompt: int = 0, temperature: float = 1.0, top_p: float = 1.0) -> Completions:
    """Greedy (samples_per_prompt = 0: one per prompt) or sampled completions of `prompts`, in chunks of
    batch_size // n prompts (so splitting `prompts` at multiples of that chunk changes nothing)."""
    module = isinstance(model, torch.nn.Module)
    was_training = module and model.training
    if module:
        model.eval()
    n = max(samples_per_prompt, 1)
    chunk_size = max(1, batch_size // n)
    out = Completions([], [], [], [], [])
    for start in range(0, len(prompts), chunk_size):
        chunk = prompts[start:start + chunk_size]
        tokens = [tokenizer(p.text)["input_ids"] for p in chunk]
        responses = _decode(model, tokens, greedy=samples_per_prompt == 0, n=n, temperature=temperature,
                            top_p=top_p, max_new_tokens=max_new_tokens, tokenizer=tokenizer)
        out.prompts += [p for p in chunk for _ in range(n)]
        out.prompt_tokens += [t for t in tokens for _ in range(n)]
        out.responses += responses
        out.texts += tokenizer.batch_decode(responses, skip_special_tokens=True)
        out.finished += ended_with_eos(responses, tokenizer.eos_token_id)
    if module:
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


@dataclass
class Share:
    """One worker's part of an evaluation spread over several (a sharded trainer's ranks, each with the policy made
    whole for the moment): completions of its `prompts`; the task's exact metrics where `exact` (one worker)."""

    prompts: list[Prompt]
    exact: bool = False


@dataclass
class ShareResult:
    """What a worker sends back: plain lists and floats (they cross processes)."""

    completions: Completions | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    """A multi-turn task's whole evaluation (one worker runs every episode), or the exact metrics."""
    reference: dict[str, float] | None = None
    """reference_metrics of this share's completions (merged weighted by their tokens and completions)."""


@dataclass
class ShareEvaluation:
    """A worker's side of a spread evaluation, made in the worker's process: the same functions a one-process
    evaluation calls, on its share. `reference()` loads π_ref when the evaluation needs it (reference or exact
    metrics); it is kept in host memory between evaluations and on the worker's device during one."""

    tokenizer: object
    task: object
    cfg: EvalConfig
    limits: Limits | None = None
    scoring: Scoring | None = None
    reference: Callable[[], torch.nn.Module] | None = None
    _reference: torch.nn.Module | None = None

    def __call__(self, policy, share: Share, device) -> ShareResult:
        task, cfg = TaskAdapter.of(self.task), self.cfg
        reference = None
        exact = share.exact and self.scoring is not None and task.has("exact_metrics")
        wants_reference = (cfg.reference_metrics and not task.episodic) or exact
        if wants_reference and self.reference is not None:
            if self._reference is None:
                self._reference = self.reference().eval().requires_grad_(False)
            reference = self._reference.to(device)
        try:
            out = ShareResult()
            if task.episodic:
                if share.prompts:
                    out.metrics = episode_metrics(policy, self.tokenizer, task, share.prompts, cfg,
                                                  self.limits or Limits())
            elif share.prompts:
                out.completions = complete(policy, self.tokenizer, share.prompts, max_new_tokens=cfg.max_new_tokens,
                                           batch_size=cfg.batch_size, samples_per_prompt=cfg.samples_per_prompt,
                                           temperature=cfg.temperature, top_p=cfg.top_p)
                if cfg.reference_metrics and reference is not None:
                    out.reference = reference_metrics(policy, reference, out.completions, self.tokenizer.pad_token_id)
            if exact and reference is not None:
                out.metrics.update(task.exact_metrics(policy, reference, self.tokenizer, self.scoring))
            return out
        finally:
            if reference is not None:
                self._reference = reference.to("cpu")


def shares(prompts: list[Prompt], workers: int, episodic: bool) -> list[Share]:
    """The test prompts split into `workers` contiguous shares (a multi-turn task's episodes all on the first: its
    metrics read the episodes' environments, which stay in the worker that ran them); exact metrics on the first."""
    if episodic:
        return [Share(prompts if w == 0 else [], exact=w == 0) for w in range(workers)]
    n = math.ceil(len(prompts) / workers)
    return [Share(prompts[w * n:(w + 1) * n], exact=w == 0) for w in range(workers)]


def joined(results: list[ShareResult]) -> Completions | None:
    """The workers' completions as one list, in share order (None: no worker returned any)."""
    parts = [r.completions for r in results if r.completions is not None]
    if not parts:
        return None
    c = Completions([], [], [], [], [])
    for part in parts:
        for name in ("prompts", "prompt_tokens", "responses", "texts", "finished"):
            getattr(c, name).extend(getattr(part, name))
    return c


def merge(task, results: list[ShareResult]) -> dict[str, float]:
    """The metrics of a spread evaluation, from its workers' results in share order: the task's own metrics over
    every completion (the same `task_metrics` a one-process evaluation computes), reference metrics weighted as
    they are defined (KL by response tokens, perplexity by completions)."""
    c = joined(results)
    metrics: dict[str, float] = {}
    if c is not None:
        metrics = task_metrics(task, c)
        refs = [(r.reference, r.completions) for r in results if r.reference is not None]
        if refs:
            tokens = [sum(len(x) for x in part.responses) for _, part in refs]
            counts = [len(part.responses) for _, part in refs]
            kl = sum(m["kl_ref"] * t for (m, _), t in zip(refs, tokens, strict=True))
            perplexity = sum(m["perplexity_ref"] * n for (m, _), n in zip(refs, counts, strict=True))
            metrics["kl_ref"], metrics["perplexity_ref"] = kl / max(sum(tokens), 1), perplexity / max(sum(counts), 1)
    for r in results:
        metrics.update(r.metrics)
    return metrics or {"score": math.nan}


class SpreadEvaluator:
    """The run's evaluation over several workers (a sharded trainer's ranks): `run(shares)` carries each share out
    on its worker and returns their results; the metrics are merged here, in the run's process."""

    def __init__(self, task, cfg: EvalConfig, run: Callable[[list[Share]], list[ShareResult]], workers: int):
        self.task, self.cfg, self.run, self.workers = task, cfg, run, workers

    def __call__(self) -> dict[str, float]:
        if not self.task.test:
            return {"score": math.nan}
        task = TaskAdapter.of(self.task)
        return merge(task, self.run(shares(self.task.test, self.workers, task.episodic)))

    def describe(self, metrics: dict[str, float]) -> str:
        return describe(metrics, self.cfg, len(self.task.test))


def describe(metrics: dict[str, float], cfg: EvalConfig, problems: int) -> str:
    """One log line: the greedy pass@1 when that is all there is, else every metric."""
    if len(metrics) == 1 and cfg.samples_per_prompt == 0:
        return f"score (greedy pass@1, {problems} problems) {metrics['score']:.3f}"
    return "eval " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())


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
        return describe(metrics, self.cfg, len(self.task.test))


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
    return episode_summary(task, play_episodes(policy, tokenizer, task, prompts, cfg, limits))


@torch.no_grad()
def play_episodes(policy, tokenizer, task, prompts: list[Prompt], cfg, limits: Limits) -> list:
    """The evaluation's episodes (prompt-major, `eval.samples_per_prompt` or one greedy per prompt): what
    `episode_metrics` summarises, and what `tba eval` counts passes in."""
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
    return episodes


def episode_summary(task, episodes) -> dict[str, float]:
    """score, episode/turns_mean, episode/ended_<reason> and the task's own `episode_metrics` of `episodes`."""
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

