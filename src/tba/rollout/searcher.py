"""Searcher: turns prompts into scored, reference-annotated samples with a (possibly stale) policy copy.

It knows nothing of processes, queues or engines: it samples through a `Sampler` (tba.rollout.samplers: HF
decode loop or vLLM), and a runtime calls `step(sync)` in a loop; `load_weights()` is the only way new weights
reach a searcher, on every runtime, and `sync` (tba.rollout.stream.WeightSync) says when: before a static batch,
or — continuous batching, multi-turn episodes — between decode steps or turns (search.weight_update). It owns a
shard of the train prompts (round-robin, as the paper's searchers do) and walks a seeded permutation of it, cycling
forever; `state_dict()` is that position, so a resumed or restarted searcher continues where the trainer
last heard from it.

A reward function is user code: if it raises or returns NaN/inf for a completion, that sample is dropped
and counted (`rewards_dropped`, with the last error kept for the log) and the search goes on.

Temperatures: it samples at its own `cfg.temperature` (a searcher group's T_b), and reports the behaviour
log-probs of that distribution; the reference log-probs it attaches are at the run's scoring temperature
(search.temperature), the one the trainer's log π_θ uses, so TB's target does not depend on who sampled.
Every sample carries the searcher's `source` (its group's name).

An episodic task (one with an `environment`) is multi-turn: each sample is then a whole episode
(tba.rollout.episodes), generated turn by turn with the same sampler (continuous batching: each episode a row that
keeps its KV cache across turns, tba.rollout.episode_stream), its reward the environment's; π_ref scores
the whole sequence and the environment's tokens are masked out. An episode that failed is dropped and counted by
its end reason. The two kinds differ only in how a batch's responses and rewards are made (`_completions`,
`_episodes`); the samples are assembled and scored under π_ref alike.

An agent task's episodes come from outside (tba.rollout.outside): the runtime attaches the stream that runs the
user's agent against an endpoint over this searcher's sampler (`attach`), and a step hands back the rows whose
episodes have all ended, one group per row.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch

from tba.algorithm.types import Group, Sample
from tba.config.schema import SearchConfig
from tba.models import precision
from tba.models.generation import ended_with_eos
from tba.models.logprobs import shared_prompt_logprobs
from tba.rollout.episode_stream import EpisodeStream
from tba.rollout.episodes import END_REASONS, Episode, Limits, policy_logprobs, run_episodes
from tba.rollout.outside import OutsideGroup, OutsideStream, RowPrompts, outside_groups
from tba.rollout.samplers.base import Sampler
from tba.rollout.stream import Stream, WeightSync
from tba.tasks.base import Prompt, TaskAdapter


@dataclass
class SearcherStats:
    """What a searcher has done, for metrics and the report (tba.runtime.worker.WorkerStats carries it)."""

    batches: int = 0
    samples_generated: int = 0
    tokens_generated: int = 0
    busy_s: float = 0.0
    """Seconds in step() (generation, reference forward, rewards)."""
    generate_s: float = 0.0
    """Seconds in the sampler: tokens_generated / generate_s is its tokens/s."""
    last_step_s: float = 0.0
    loads: int = 0
    """Weight versions loaded."""
    rewards_dropped: int = 0
    last_reward_error: str | None = None
    reward_metrics: dict[str, float] = field(default_factory=dict)
    """The task's own metrics of the last batch (each reward function's mean; episodes: turns and tokens)."""
    episode_ends: dict[str, int] = field(default_factory=lambda: dict.fromkeys(END_REASONS, 0))
    """Episodes ever ended, by reason."""

    COUNTERS = ("batches", "samples_generated", "tokens_generated", "rewards_dropped", "episode_ends")
    """What a resumed or restarted searcher continues counting from (`Searcher.state_dict`)."""


@dataclass
class _Batch:
    """One batch's responses, prompt-major (S per prompt): token ids, behaviour log-probs, policy masks (empty:
    single-turn), rewards (None: dropped) and per-token versions (empty: all the searcher's version)."""

    responses: list[list[int]]
    behaviour: list[list[float]]
    masks: list[list[int]]
    rewards: list[float | None]
    versions: list[list[int]]


class Searcher:
    def __init__(
        self, sampler: Sampler, reference, tokenizer, task, cfg: SearchConfig, *, seed: int,
        shard: int = 0, num_shards: int = 1, source: str = "policy", scoring_temperature: float | None = None,
        autocast: str | None = None,
    ):
        """`scoring_temperature`: the T of the reference log-probs (None = cfg.temperature); `autocast`:
        model.autocast, the precision of sampling and scoring (tba.models.precision)."""
        self.autocast = autocast
        self.sampler, self.reference, self.tokenizer, self.cfg = sampler, reference, tokenizer, cfg
        self.task = TaskAdapter.of(task)
        self.source = source
        self.scoring_temperature = cfg.temperature if scoring_temperature is None else scoring_temperature
        self.reference.eval()
        self.version = 0
        self.stats = SearcherStats()
        self.prompts: list[Prompt] = self.task.train[shard::num_shards]
        if not self.prompts:
            raise ValueError(f"searcher shard {shard}/{num_shards} owns no train prompts")
        self._order = list(range(len(self.prompts)))
        random.Random(seed).shuffle(self._order)
        self._cursor = 0
        self._prompt_tokens: dict[int, list[int]] = {}
        self.stream = None
        self.outside: OutsideStream | None = None
        self.rows = RowPrompts()
        if cfg.batching == "continuous" and not self.task.agentic:
            engine = sampler.stream(cfg.slots or cfg.prompts_per_batch * cfg.generations_per_prompt,
                                    temperature=cfg.temperature, top_p=cfg.top_p,
                                    recompute=cfg.in_flight_cache == "recompute")
            if self.task.episodic:
                self.stream = EpisodeStream(engine, self.task, tokenizer, num_samples=cfg.generations_per_prompt,
                                            max_new_tokens=cfg.max_new_tokens, weight_update=cfg.weight_update,
                                            limits=Limits.of(cfg))
            else:
                self.stream = Stream(engine, num_samples=cfg.generations_per_prompt,
                                     max_new_tokens=cfg.max_new_tokens, weight_update=cfg.weight_update)

    def attach(self, outside: OutsideStream) -> None:
        """An agent task's episodes: `outside` runs them against an endpoint over this searcher's sampler (the
        runtime builds it: tba.serve.agents). Weights then load when its steps say (the stream's, like a continuous
        batch's)."""
        self.stream = self.outside = outside

    def close(self) -> None:
        """End what runs beside the searcher (an agent task's endpoint and harness threads)."""
        if self.outside is not None:
            self.outside.close()
            self.outside = None

    def state_dict(self) -> dict:
        oldest = self.stream.oldest() if self.stream is not None else None
        return {"cursor": self._cursor if oldest is None else oldest,
                **{k: getattr(self.stats, k) for k in SearcherStats.COUNTERS}}

    def load_state_dict(self, state: dict) -> None:
        self._cursor = state["cursor"] % len(self._order)
        for k in SearcherStats.COUNTERS:
            setattr(self.stats, k, state[k])

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """The trainer's policy after `version` updates (`tba.models.synced_tensors` names), any device/dtype."""
        self.sampler.load_weights(weights, version)
        self.loaded(version)

    def loaded(self, version: int) -> None:
        """The sampler holds the trainer's policy after `version` updates now: loaded here, or received by its engine
        directly (vLLM's weight transfer, tba.runtime.transport.vllm)."""
        self.version = version
        self.stats.loads += 1

    def _next_prompts(self) -> list[Prompt]:
        batch = []
        for _ in range(min(self.cfg.prompts_per_batch, len(self.prompts))):
            batch.append(self.prompts[self._order[self._cursor]])
            self._cursor = (self._cursor + 1) % len(self._order)
        return batch

    def _feed(self) -> tuple[Prompt, list[int], int]:
        walk = self._cursor
        prompt = self.prompts[self._order[walk]]
        self._cursor = (walk + 1) % len(self._order)
        return prompt, self._tokens(prompt), walk

    def _tokens(self, prompt: Prompt) -> list[int]:
        if prompt.id not in self._prompt_tokens:
            self._prompt_tokens[prompt.id] = self.tokenizer(prompt.text)["input_ids"]
        return self._prompt_tokens[prompt.id]

    def _generate(self, contexts: list[list[int]], num_samples: int, max_new_tokens: int):
        t = time.perf_counter()
        out = self.sampler.generate(contexts, num_samples=num_samples, temperature=self.cfg.temperature,
                                    top_p=self.cfg.top_p, max_new_tokens=max_new_tokens)
        self.stats.generate_s += time.perf_counter() - t
        return out

    @torch.no_grad()
    def step(self, sync: WeightSync | None = None) -> list[Group]:
        """One search iteration: prompts_per_batch prompts × S samples → one Group per prompt. `sync`: where the
        trainer's newest weights come from (None: a searcher that never loads them, or is loaded from outside)."""
        with precision.autocast(self.reference.device, self.autocast):
            return self._step(sync)

    def _step(self, sync: WeightSync | None) -> list[Group]:
        t0 = time.perf_counter()
        self.stats.batches += 1
        if self.task.agentic:
            groups = self._outside_groups(sync)
            self.stats.last_step_s = time.perf_counter() - t0
            self.stats.busy_s += self.stats.last_step_s
            return groups
        if self.stream is not None:
            prompts, prompt_tokens, batch = self._streamed(sync)
        else:
            if sync is not None:
                sync.load()
            prompts = self._next_prompts()
            prompt_tokens = [self._tokens(p) for p in prompts]
            batch = (self._episodes(prompts, prompt_tokens, sync) if self.task.episodic
                     else self._completions(prompts, prompt_tokens))
        groups = self._groups(prompts, prompt_tokens, batch)
        self.stats.samples_generated += len(batch.responses)
        self.stats.tokens_generated += sum(len(r) for r in batch.responses)
        self.stats.last_step_s = time.perf_counter() - t0
        self.stats.busy_s += self.stats.last_step_s
        return groups

    def _groups(self, prompts: list[Prompt], prompt_tokens: list[list[int]], batch: _Batch) -> list[Group]:
        """The batch as one Group per prompt: every kept sample with its π_ref log-probs (the environment's
        tokens zeroed) at the scoring temperature."""
        s = self.cfg.generations_per_prompt
        ref_logp = shared_prompt_logprobs(self.reference, prompt_tokens, batch.responses, s, self.scoring_temperature,
                                          self.tokenizer.pad_token_id)  # [N, R]
        groups = []
        for i, prompt in enumerate(prompts):
            samples = [Sample(response=batch.responses[j],
                              ref_logprobs=policy_logprobs(ref_logp[j, : len(batch.responses[j])].tolist(),
                                                           batch.masks[j]),
                              reward=batch.rewards[j], version=batch.versions[j][0] if batch.versions[j] else
                              self.version, behaviour_logprobs=batch.behaviour[j], source=self.source,
                              policy_mask=batch.masks[j],
                              versions=batch.versions[j] if len(set(batch.versions[j])) > 1 else [])
                       for j in range(i * s, (i + 1) * s) if batch.rewards[j] is not None]
            if samples:
                groups.append(Group(prompt_id=prompt.id, prompt_tokens=prompt_tokens[i], samples=samples,
                                    source=self.source))
        return groups

    def _streamed(self, sync: WeightSync | None) -> tuple[list[Prompt], list[list[int]], _Batch]:
        """Continuous batching: the next prompts_per_batch prompts whose samples have all ended."""
        t = self.stream.generate_s
        done = self.stream.run(self.cfg.prompts_per_batch, self._feed, lambda: self.version, sync)
        self.stats.generate_s += self.stream.generate_s - t
        prompts, prompt_tokens = [o.prompt for o in done], [o.tokens for o in done]
        if self.task.episodic:
            return prompts, prompt_tokens, self._episode_batch([e for o in done for e in o.episodes])
        finished = [o.done[i] for o in done for i in range(self.cfg.generations_per_prompt)]
        batch = self._scored(prompts, [(f.tokens, f.logprobs) for f in finished])
        batch.versions = [f.versions for f in finished]
        return prompts, prompt_tokens, batch

    def _outside_groups(self, sync: WeightSync | None) -> list[Group]:
        """An agent task: the next prompts_per_batch rows whose episodes have all ended, one group per row."""
        if self.outside is None:
            raise RuntimeError(f"task {self.task.name}: its episodes come from outside, and no endpoint is attached "
                               "(the runtime attaches one: tba.serve.agents.AgentStream)")
        t = time.perf_counter()
        done: list[OutsideGroup] = self.outside.run(self.cfg.prompts_per_batch, self._feed, lambda: self.version, sync)
        self.stats.generate_s += time.perf_counter() - t
        episodes = [e for g in done for e in g.episodes]
        for e in episodes:
            self.stats.episode_ends[e.end] += 1
            if e.reward is None:
                self.stats.rewards_dropped += 1
                why = e.error or "nothing scored it (the agent returned None and no reward function a number)"
                self.stats.last_reward_error = f"prompt {e.prompt.id}: episode ended by {e.end}: {why}"
        groups, off = outside_groups(done, self.rows, self.reference, temperature=self.scoring_temperature,
                                     pad_id=self.tokenizer.pad_token_id, source=self.source)
        samples = [s for g in groups for s in g.samples]
        self.stats.samples_generated += len(samples)
        self.stats.tokens_generated += sum(sum(s.policy_mask) for s in samples)
        n = max(len(episodes), 1)
        self.stats.reward_metrics = {
            **self.task.reward_metrics(),
            "agent/calls_mean": sum(e.calls for e in episodes) / n,
            "agent/samples_mean": sum(len(e.trajectories) for e in episodes if e.reward is not None) / n,
            "agent/calls_dropped": float(sum(e.dropped for e in episodes)),
            "agent/breaks": float(sum(e.breaks for e in episodes)),
            "agent/off_prompt": float(off)}
        return groups

    def _completions(self, prompts: list[Prompt], prompt_tokens: list[list[int]]) -> _Batch:
        """Single-turn: S completions per prompt from the sampler, scored by the task's reward."""
        outputs = self._generate(prompt_tokens, self.cfg.generations_per_prompt, self.cfg.max_new_tokens)
        return self._scored(prompts, outputs)

    def _scored(self, prompts: list[Prompt], outputs: list[tuple[list[int], list[float]]]) -> _Batch:
        """Single-turn: S completions per prompt, prompt-major, scored by the task's reward."""
        s = self.cfg.generations_per_prompt
        responses = [r for r, _ in outputs]
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        finished = ended_with_eos(responses, self.tokenizer.eos_token_id)
        rewards, error = self.task.batch_rewards([p for p in prompts for _ in range(s)], texts, finished, responses)
        if error is not None:
            self.stats.rewards_dropped += sum(r is None for r in rewards)
            self.stats.last_reward_error = error
        self.stats.reward_metrics = self.task.reward_metrics()
        return _Batch(responses, [b for _, b in outputs], [[] for _ in outputs], rewards, [[] for _ in outputs])

    def _episodes(self, prompts: list[Prompt], prompt_tokens: list[list[int]], sync: WeightSync | None) -> _Batch:
        """Multi-turn: S episodes per prompt, each turn from the sampler; failed episodes get None (dropped) and
        every end is counted by reason. In flight, each turn starts with the newest published weights."""
        def version() -> int:
            if sync is not None and self.cfg.weight_update == "in_flight":
                sync.load()
            return self.version

        episodes = run_episodes(lambda contexts, n: self._generate(contexts, 1, n), self.tokenizer, self.task,
                                prompts, prompt_tokens, num_samples=self.cfg.generations_per_prompt,
                                max_new_tokens=self.cfg.max_new_tokens, limits=Limits.of(self.cfg), version=version)
        return self._episode_batch(episodes)

    def _episode_batch(self, episodes: list[Episode]) -> _Batch:
        """Episodes (prompt-major) as a batch: every end counted by reason, failed ones dropped (reward None)."""
        for e in episodes:
            self.stats.episode_ends[e.end] += 1
            if e.reward is None:
                self.stats.rewards_dropped += 1
                self.stats.last_reward_error = f"prompt {e.prompt.id}: episode ended by {e.end}: {e.error}"
        self.stats.reward_metrics = {
            **self.task.reward_metrics(),
            "episode/turns_mean": sum(e.turns for e in episodes) / max(len(episodes), 1),
            "episode/tokens_mean": sum(len(e.tokens) for e in episodes) / max(len(episodes), 1)}
        return _Batch([e.tokens for e in episodes], [e.logprobs for e in episodes], [e.mask for e in episodes],
                      [e.reward for e in episodes], [e.versions for e in episodes])
