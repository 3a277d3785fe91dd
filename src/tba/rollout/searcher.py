"""Searcher: turns prompts into scored, reference-annotated samples with a (possibly stale) policy copy.

It knows nothing of processes, queues or engines: it samples through a `Sampler` (tba.rollout.samplers: HF
decode loop or vLLM), and a runtime calls `step()` in a loop and `load_weights()` — the only way new weights
reach a searcher, on every runtime — when a newer policy version is published. It owns a shard of the
train prompts (round-robin, as the paper's searchers do) and walks a seeded permutation of it, cycling
forever; `state_dict()` is that position, so a resumed or restarted searcher continues where the trainer
last heard from it.

A reward function is user code: if it raises or returns NaN/inf for a completion, that sample is dropped
and counted (`rewards_dropped`, with the last error kept for the log) and the search goes on.

Temperatures: it samples at its own `cfg.temperature` (a searcher group's T_b), and reports the behaviour
log-probs of that distribution; the reference log-probs it attaches are at the run's scoring temperature
(search.temperature), the one the trainer's log π_θ uses, so TB's target does not depend on who sampled.
Every sample carries the searcher's `source` (its group's name).

A task with an `environment` is multi-turn: each sample is then a whole episode (tba.rollout.episodes), generated turn
by turn with the same sampler, its reward the environment's; π_ref scores the whole sequence and the
environment's tokens are masked out. An episode that failed is dropped and counted by its end reason.
"""

from __future__ import annotations

import random
import time

import torch

from tba.algorithm.types import Group, Sample
from tba.config.schema import SearchConfig
from tba.models.generation import ended_with_eos, response_logprobs
from tba.rollout.episodes import END_REASONS, Limits, policy_logprobs, run_episodes
from tba.rollout.samplers.base import Sampler
from tba.tasks.base import Prompt, Task, batch_rewards


class Searcher:
    def __init__(
        self, sampler: Sampler, reference, tokenizer, task: Task, cfg: SearchConfig, *, seed: int,
        shard: int = 0, num_shards: int = 1, source: str = "policy", scoring_temperature: float | None = None,
    ):
        """`scoring_temperature`: the T of the reference log-probs (None = cfg.temperature)."""
        self.limits = Limits.of(cfg)  # a multi-turn task's
        self.episode_ends = dict.fromkeys(END_REASONS, 0)  # episodes ever ended, by reason
        self.sampler, self.reference, self.tokenizer, self.task, self.cfg = sampler, reference, tokenizer, task, cfg
        self.source = source
        self.scoring_temperature = cfg.temperature if scoring_temperature is None else scoring_temperature
        self.reference.eval()
        self.version = 0
        self.prompts: list[Prompt] = task.train[shard::num_shards]
        if not self.prompts:
            raise ValueError(f"searcher shard {shard}/{num_shards} owns no train prompts")
        self._order = list(range(len(self.prompts)))
        self._rng = random.Random(seed)
        self._rng.shuffle(self._order)
        self._cursor = 0
        self._prompt_tokens: dict[int, list[int]] = {}
        self.samples_generated = 0
        self.batches = 0
        self.tokens_generated = 0
        self.busy_s = 0.0  # seconds in step() (generation, reference forward, rewards)
        self.generate_s = 0.0  # seconds in the sampler: tokens_generated / generate_s is its tokens/s
        self.loads = 0  # weight versions loaded
        self.rewards_dropped = 0
        self.last_reward_error: str | None = None
        self.reward_metrics: dict[str, float] = {}  # the task's own, of the last batch (each reward function's mean;
        # multi-turn: turns and tokens per episode too)

    def state_dict(self) -> dict:
        return {"cursor": self._cursor, "batches": self.batches, "samples_generated": self.samples_generated,
                "tokens_generated": self.tokens_generated, "rewards_dropped": self.rewards_dropped,
                "episode_ends": dict(self.episode_ends)}

    def load_state_dict(self, state: dict) -> None:
        self._cursor = state["cursor"] % len(self._order)
        self.batches, self.samples_generated = state["batches"], state["samples_generated"]
        self.tokens_generated, self.rewards_dropped = state["tokens_generated"], state["rewards_dropped"]
        self.episode_ends.update(state.get("episode_ends", {}))

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """The trainer's policy after `version` updates (`tba.models.synced_tensors` names), any device/dtype."""
        self.sampler.load_weights(weights, version)
        self.version = version
        self.loads += 1

    def _next_prompts(self) -> list[Prompt]:
        batch = []
        for _ in range(min(self.cfg.prompts_per_batch, len(self.prompts))):
            batch.append(self.prompts[self._order[self._cursor]])
            self._cursor = (self._cursor + 1) % len(self._order)
        return batch

    def _tokens(self, prompt: Prompt) -> list[int]:
        if prompt.id not in self._prompt_tokens:
            self._prompt_tokens[prompt.id] = self.tokenizer(prompt.text)["input_ids"]
        return self._prompt_tokens[prompt.id]

    @torch.no_grad()
    def step(self) -> list[Group]:
        """One search iteration: prompts_per_batch prompts × S samples → one Group per prompt."""
        t0 = time.perf_counter()
        self.batches += 1
        prompts = self._next_prompts()
        prompt_tokens = [self._tokens(p) for p in prompts]
        s = self.cfg.samples_per_prompt
        tok = self.tokenizer
        multi_turn = hasattr(self.task, "environment")
        if multi_turn:
            outputs, masks, rewards, episode_metrics = self._episodes(prompts, prompt_tokens)
        else:
            t_gen = time.perf_counter()
            outputs = self.sampler.generate(prompt_tokens, num_samples=s, temperature=self.cfg.temperature,
                                            top_p=self.cfg.top_p, max_new_tokens=self.cfg.max_new_tokens)
            self.generate_s += time.perf_counter() - t_gen
            masks = [[] for _ in outputs]
        flat_prompts = [pt for pt in prompt_tokens for _ in range(s)]
        responses = [r for r, _ in outputs]
        ref_logp, _ = response_logprobs(self.reference, flat_prompts, responses, self.scoring_temperature,
                                        tok.pad_token_id)  # [N, R]
        if not multi_turn:
            texts = tok.batch_decode(responses, skip_special_tokens=True)
            finished = ended_with_eos(responses, tok.eos_token_id)
            rewards, error = batch_rewards(self.task, [p for p in prompts for _ in range(s)], texts, finished,
                                           responses)
            if error is not None:
                self.rewards_dropped += sum(r is None for r in rewards)
                self.last_reward_error = error
        if hasattr(self.task, "reward_metrics"):
            self.reward_metrics = self.task.reward_metrics()
        if multi_turn:
            self.reward_metrics = {**self.reward_metrics, **episode_metrics}
        groups = []
        for i, prompt in enumerate(prompts):
            samples = []
            for j in range(i * s, (i + 1) * s):
                resp, behaviour = outputs[j]
                reward = rewards[j]
                if reward is None:
                    continue
                samples.append(Sample(
                    response=resp,
                    ref_logprobs=policy_logprobs(ref_logp[j, : len(resp)].tolist(), masks[j]),
                    reward=reward,
                    version=self.version,
                    behaviour_logprobs=behaviour,
                    source=self.source,
                    policy_mask=masks[j],
                ))
            if samples:
                groups.append(Group(prompt_id=prompt.id, prompt_tokens=prompt_tokens[i], samples=samples,
                                    source=self.source))
        self.samples_generated += len(responses)
        self.tokens_generated += sum(len(r) for r in responses)
        self.last_step_s = time.perf_counter() - t0
        self.busy_s += self.last_step_s
        return groups

    def _episodes(self, prompts: list[Prompt], prompt_tokens: list[list[int]]):
        """S episodes per prompt: ([(tokens after the prompt, behaviour log-probs)], [policy masks], [reward or
        None], metrics) prompt-major; failed episodes get None (dropped) and every end is counted by reason."""
        def generate(contexts, max_new_tokens):
            t_gen = time.perf_counter()
            out = self.sampler.generate(contexts, num_samples=1, temperature=self.cfg.temperature,
                                        top_p=self.cfg.top_p, max_new_tokens=max_new_tokens)
            self.generate_s += time.perf_counter() - t_gen
            return out

        episodes = run_episodes(generate, self.tokenizer, self.task, prompts, prompt_tokens,
                                num_samples=self.cfg.samples_per_prompt, max_new_tokens=self.cfg.max_new_tokens,
                                limits=self.limits)
        turns = [e.turns for e in episodes]
        for e in episodes:
            self.episode_ends[e.end] += 1
            if e.reward is None:
                self.rewards_dropped += 1
                self.last_reward_error = f"prompt {e.prompt.id}: episode ended by {e.end}: {e.error}"
        metrics = {"episode/turns_mean": sum(turns) / max(len(turns), 1),
                   "episode/tokens_mean": sum(len(e.tokens) for e in episodes) / max(len(episodes), 1)}
        return ([(e.tokens, e.logprobs) for e in episodes], [e.mask for e in episodes],
                [e.reward for e in episodes], metrics)
