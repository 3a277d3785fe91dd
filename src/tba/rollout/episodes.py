"""Multi-turn episodes: the policy acts, an environment answers, until the episode ends with a reward.

A task becomes multi-turn by defining `environment(prompt)`, which returns a fresh `Environment` for one
episode (tba's protocol; TRL's environment_factory and OpenEnv servers are adapted to it: tba.tasks.factory,
tba.tasks.openenv). The environment sees the policy's turns as text and answers with text:

    env.reset(prompt)          optional; called once before the first turn
    env.step(action) -> str | None
                               the text that follows the policy's turn (a tool result, feedback, the next user
                               turn — tokenized as it is: a chat model's turn markers are the environment's to
                               write, `chat_turn` renders them) or None: the episode is over
    env.get_reward() -> float  the episode's reward, asked once it is over (also after a turn or token limit)

**Token-exact trajectories.** A policy turn's tokens are kept exactly as sampled and the context of the next
turn is built from token ids, never by re-tokenizing text; the environment's text is tokenized once, when it
arrives. An episode is one `Sample` whose `response` is everything after the prompt and whose `policy_mask`
marks the policy's tokens (1) and the environment's (0). With log π summed over the policy's tokens only,

    log π_θ(τ) − log π_ref(τ) = Σ_{policy tokens t} [log π_θ(y_t|h_t) − log π_ref(y_t|h_t)]

because the environment's transition probabilities are the same factor in both: TB's residual, every
objective and every log-prob in tba read the mask (tba.algorithm.trainer), and single-turn samples (empty mask) are
unchanged. What this does *not* make exact in a stochastic environment is the trajectory target
π_ref(τ)·exp(r/β)/Z — see tba.tasks.enumerable_turns and docs/environments.md.

**Faults end an episode, never the run.** `reset`/`step`/`get_reward` run with a timeout (`timeout_s`) in a
worker thread; an exception, a timeout, a non-string answer, the turn limit and the token budget each end the episode
with a counted reason (`END_REASONS`). An episode that failed (`error`, `timeout`, `bad_observation`) has no
trustworthy reward and is dropped; one cut by a limit is kept and scored by `get_reward`. A thread that hangs
cannot be killed from Python: it is abandoned (and counted), and the episode goes on without it.
"""

from __future__ import annotations

import math
import queue
import threading
import traceback
from dataclasses import dataclass, field
from typing import Protocol

from tba.errors import raised
from tba.tasks.base import Prompt

END_REASONS = ("done", "max_turns", "token_budget", "error", "timeout", "bad_observation")
"""Why an episode ended: the environment ended it, the turn limit, the token budget (prompt excluded), the
environment raised, did not answer within its timeout, or answered with something that is not text."""
FAILED = frozenset({"error", "timeout", "bad_observation"})


class Environment(Protocol):
    def step(self, action: str) -> str | None:
        """The text after the policy's turn `action` (decoded, special tokens removed), or None to end."""

    def get_reward(self) -> float:
        """The episode's reward, once it is over."""


@dataclass
class Limits:
    """An episode's limits: policy turns, and tokens after the prompt (policy's and environment's)."""

    max_turns: int = 4
    max_tokens: int = 256
    timeout_s: float = 10.0

    @classmethod
    def of(cls, search, max_new_tokens: int | None = None) -> Limits:
        """The limits a `search` section sets (`max_new_tokens`: another per-turn length, evaluation's); the token
        budget defaults to max_turns × the per-turn length × 2 (the policy's turns and as much environment text)."""
        per_turn = max_new_tokens or search.max_new_tokens
        return cls(max_turns=search.max_turns, timeout_s=search.env_timeout_s,
                   max_tokens=search.max_episode_tokens or search.max_turns * per_turn * 2)


@dataclass
class Episode:
    prompt: Prompt
    prompt_tokens: list[int]
    env: Environment
    tokens: list[int] = field(default_factory=list)
    """Everything after the prompt, policy and environment tokens interleaved."""
    mask: list[int] = field(default_factory=list)
    """1 for a policy token, 0 for an environment token."""
    logprobs: list[float] = field(default_factory=list)
    """Behaviour log-probs of the policy's tokens; 0.0 at the environment's."""
    versions: list[int] = field(default_factory=list)
    """The policy version of each token's turn (an environment token: the turn before it)."""
    turns: int = 0
    end: str | None = None
    reward: float | None = None
    error: str | None = None

    @property
    def context(self) -> list[int]:
        return self.prompt_tokens + self.tokens


class _Caller:
    """Calls the environment in one daemon worker thread, waiting at most `timeout_s` for each call. A worker
    that hangs is abandoned (a daemon: it cannot keep the process from exiting) and a fresh one takes over.
    One long-lived worker rather than a thread per call: starting a thread can cost more than most environments'
    whole step."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._start()

    def _start(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._work, args=(self.jobs,), daemon=True, name="tba-env").start()

    @staticmethod
    def _work(jobs: queue.SimpleQueue) -> None:
        while (job := jobs.get()) is not None:
            fn, args, box, done = job
            try:
                box["value"] = fn(*args)
            except BaseException as e:
                who = getattr(e, "raised_in", None) or getattr(fn, "__qualname__", repr(fn))  # a reward function's name
                # the first line says what raised; the traceback after it is for the log file (tba.algorithm.monitor)
                box["error"] = f"{raised(who, e)}\n{traceback.format_exc(limit=-2).strip()}"
                box["timeout"] = isinstance(e, TimeoutError)  # the environment's own timeout (a remote step's)
            done.set()

    def __call__(self, fn, *args):
        """(value, None) or (None, (reason, text)) for `fn(*args)`: its exception caught, its hang timed out."""
        box, done = {}, threading.Event()
        self.jobs.put((fn, args, box, done))
        if not done.wait(self.timeout_s):
            self._start()
            return None, ("timeout", f"{getattr(fn, '__qualname__', fn)} did not return within {self.timeout_s} s")
        if "error" in box:
            return None, ("timeout" if box["timeout"] else "error", box["error"])
        return box.get("value"), None

    def close(self) -> None:
        self.jobs.put(None)


def run_episodes(generate, tokenizer, task, prompts: list[Prompt], prompt_tokens: list[list[int]], *,
                 num_samples: int, max_new_tokens: int, limits: Limits, version=lambda: 0) -> list[Episode]:
    """`num_samples` episodes of each prompt (prompt-major), all advanced one turn at a time.

    `generate(contexts, max_new_tokens)` returns (token ids, log-probs) per context: the searcher's sampler at
    its temperature, or greedy decoding in evaluation. Each turn generates at most `max_new_tokens`, and never
    past the episode's token budget. `version()`, asked before each turn, is the policy version that samples it
    (a searcher loads newer weights there when they land in flight).
    """
    def act(episodes, n):
        return generate([e.context for e in episodes], n)

    call = _Caller(limits.timeout_s)
    try:
        return _run(call, act, tokenizer, task, prompts, prompt_tokens, num_samples, max_new_tokens, limits,
                    version=version)
    finally:
        call.close()


def replay_episodes(tokenizer, task, prompts: list[Prompt], prompt_tokens: list[list[int]],
                    scripts: list[list[list[int]]], *, max_new_tokens: int, limits: Limits) -> list[Episode]:
    """Episodes whose policy turns are given (a demonstration: each turn's token ids, ending with EOS as a
    sampled turn does, or cut at the turn's budget), played through fresh environments: the environment's
    answers are its own, tokenized as in a sampled episode, so a demonstration becomes the same token-exact
    trajectory a searcher would store.

    An episode fails (`error`, its reason in `error`) when the environment asks for a turn the script does not
    have, or ends the episode before the script's last turn: a demonstration that does not fit its environment."""
    by_episode: dict[int, list[list[int]]] = {}

    def act(episodes, n):
        out = []
        for e in episodes:
            script = by_episode[id(e)]
            if e.turns >= len(script):
                _end(e, "error", f"the demonstration has {len(script)} turns; the environment asked for another")
                out.append(([], []))
            elif len(script[e.turns]) > n:
                _end(e, "error", f"demonstration turn {e.turns + 1} has {len(script[e.turns])} tokens; the "
                                 f"turn's limit here is {n} (search.max_new_tokens, search.max_episode_tokens)")
                out.append(([], []))
            else:
                out.append((list(script[e.turns]), []))
        return out

    call = _Caller(limits.timeout_s)
    try:
        episodes = _run(call, act, tokenizer, task, prompts, prompt_tokens, 1, max_new_tokens, limits,
                        on_start=lambda e, i: by_episode.__setitem__(id(e), scripts[i]))
    finally:
        call.close()
    for e in episodes:
        script = by_episode[id(e)]
        if e.end not in FAILED and e.turns < len(script):
            e.end, e.error, e.reward = "error", (f"the environment ended the episode ({e.end}) after turn {e.turns} "
                                                 f"of the demonstration's {len(script)}"), None
    return episodes


def _run(call, act, tokenizer, task, prompts, prompt_tokens, num_samples, max_new_tokens, limits, on_start=None,
         version=lambda: 0):
    episodes = []
    for p, toks in zip(prompts, prompt_tokens, strict=True):
        for _ in range(num_samples):
            env = task.environment(p)
            episodes.append(Episode(p, toks, env))
            if on_start is not None:
                on_start(episodes[-1], len(episodes) - 1)
            if hasattr(env, "reset"):
                _, fault = call(env.reset, p)
                if fault:
                    _end(episodes[-1], *fault)
    for _ in range(limits.max_turns):
        active = [e for e in episodes if e.end is None]
        if not active:
            break
        budget = [min(max_new_tokens, limits.max_tokens - len(e.tokens)) for e in active]
        for e, n in zip(active, budget, strict=True):
            if n <= 0:
                _end(e, "token_budget")
        active = [(e, n) for e, n in zip(active, budget, strict=True) if n > 0]
        by_budget: dict[int, list[Episode]] = {}
        for e, n in active:
            by_budget.setdefault(n, []).append(e)
        turn_version = version()
        for n, group in by_budget.items():
            for e, (ids, lps) in zip(group, act(group, n), strict=True):
                if e.end is not None:  # a replayed episode whose script did not fit
                    continue
                e.tokens += ids
                e.mask += [1] * len(ids)
                e.logprobs += lps if lps else [0.0] * len(ids)
                e.versions += [turn_version] * len(ids)
                e.turns += 1
        for e, _ in active:
            if e.end is None:
                _answer(call, e, tokenizer, limits)
    for e in episodes:
        if e.end is None:
            _end(e, "max_turns")
        if e.end not in FAILED:
            scored(e, *call(e.env.get_reward))
    return episodes


def scored(e: Episode, value, fault) -> None:
    """Set the episode's reward from what `get_reward` returned (or its fault: the episode failed)."""
    try:
        reward = float(value)
    except (TypeError, ValueError):
        reward = math.nan
    if fault:
        e.end, e.error = fault
    elif not math.isfinite(reward):
        e.end, e.error = "error", f"get_reward returned {value!r}"
    else:
        e.reward = reward


def last_action(e: Episode, tokenizer) -> str:
    """The policy's last turn as the environment sees it: decoded, special tokens removed."""
    _, start, end = turns(e.mask)[-1]
    return tokenizer.decode(e.tokens[start:end], skip_special_tokens=True)


def _answer(call, e: Episode, tokenizer, limits: Limits) -> None:
    """The environment's answer to the policy's last turn, appended as environment tokens (or the episode's end)."""
    answered(e, *call(e.env.step, last_action(e, tokenizer)), tokenizer, limits)


def answered(e: Episode, text, fault, tokenizer, limits: Limits) -> None:
    """Append the environment's answer `text` (what `step` returned, or its fault) or end the episode."""
    if fault:
        _end(e, *fault)
    elif text is None:
        _end(e, "done")
    elif not isinstance(text, str):
        _end(e, "bad_observation", f"step returned {type(text).__name__}, not str or None")
    elif e.turns >= limits.max_turns:
        _end(e, "max_turns")
    else:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(e.tokens) + len(ids) >= limits.max_tokens:
            _end(e, "token_budget")  # no room for the observation and a policy turn after it
            return
        e.tokens += ids
        e.mask += [0] * len(ids)
        e.logprobs += [0.0] * len(ids)
        e.versions += [e.versions[-1] if e.versions else 0] * len(ids)


def _end(e: Episode, reason: str, error: str | None = None) -> None:
    e.end, e.error = reason, error


def policy_logprobs(logprobs: list[float], policy_mask: list[int]) -> list[float]:
    """Per-token log-probs with the environment's tokens zeroed: those tokens are conditioning, not the policy's
    choices, so no objective may count a log-prob for them (an empty mask: a single-turn sample, all policy)."""
    if not policy_mask:
        return logprobs
    return [lp if m else 0.0 for lp, m in zip(logprobs, policy_mask, strict=True)]


def turns(policy_mask: list[int]) -> list[tuple[bool, int, int]]:
    """An episode's turns: (the policy's?, start, end) spans of equal mask values, in order."""
    spans, start = [], 0
    for i in range(1, len(policy_mask) + 1):
        if i == len(policy_mask) or policy_mask[i] != policy_mask[start]:
            spans.append((bool(policy_mask[start]), start, i))
            start = i
    return spans
