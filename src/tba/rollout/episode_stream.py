"""Multi-turn episodes under continuous batching (search.batching=continuous on an episodic task).

Turn by turn in static batches (tba.rollout.episodes.run_episodes), every turn waits for the batch's slowest
environment and re-reads the whole episode so far. Here each episode is a row of the continuous batch
(tba.models.continuous) that keeps its KV cache across turns: when it ends a turn it frees its slot, its cache is
parked, and its environment is called in a worker thread while the other rows decode; when the answer arrives
the episode is queued again and prefills only the answer's tokens on top of its parked cache. A slow environment
delays its own episode, not the batch; a turn's cost is its own tokens, not the episode's.

The episode's rules are run_episodes' (the same `Limits`, end reasons, token-exact trajectories, faults that end
an episode and never the run): `answered` and `scored` are shared. What differs: every environment call
(`reset`, `step`, `get_reward`) runs in a pool of daemon threads without blocking decoding, and a call past its
timeout is abandoned with its thread (another takes its place); episodes run to their ends independently, and a
prompt's group is delivered when its last episode has its reward; each token records the policy version that
sampled it. Weights: `in_flight` loads before any decode step (a turn, and an episode, can span versions);
`between_batches` starts no new episode once newer weights are published, lets the open ones end, then loads —
an episode never spans versions (slots idle while the last episodes end: the price of that guarantee).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from tba.rollout.episodes import FAILED, Episode, Limits, _end, answered, last_action, scored
from tba.rollout.stream import Engine, WeightSync
from tba.tasks.base import Prompt

OPEN_PER_SLOT = 4
"""Episodes open at once (in a row, queued, or waiting on their environment) per slot: enough that slots stay
busy while environments answer, bounded because every waiting episode holds its parked KV cache."""


class Calls:
    """Environment calls answered without waiting: `submit` queues one for a pool of daemon worker threads, `poll`
    returns those that returned (value or fault) and faults those running past `timeout_s` (their thread is
    abandoned: Python cannot kill it, and `abandoned` counts them). The pool grows to as many workers as calls
    pending, so a slow call never queues another episode's behind it."""

    def __init__(self, workers: int, timeout_s: float):
        self.timeout_s, self.workers, self.abandoned = timeout_s, 0, 0
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._started: dict[int, float] = {}
        self.pending: dict[int, tuple[object, Callable]] = {}
        for _ in range(workers):
            self._worker()

    def _worker(self) -> None:
        self.workers += 1
        threading.Thread(target=self._work, daemon=True, name="tba-env").start()

    def _work(self) -> None:
        while (job := self._todo.get()) is not None:
            jid, fn, args = job
            with self._lock:
                self._started[jid] = time.monotonic()
            try:
                self._done.put((jid, fn(*args), None))
            except BaseException:
                self._done.put((jid, None, ("error", traceback.format_exc(limit=-2).strip())))

    def submit(self, tag, fn: Callable, *args) -> None:
        jid = next(self._ids)
        self.pending[jid] = (tag, fn)
        if len(self.pending) > self.workers - self.abandoned:
            self._worker()
        self._todo.put((jid, fn, args))

    def poll(self, wait_s: float = 0.0) -> list[tuple[object, object, tuple[str, str] | None]]:
        """(tag, value, fault) of every call that returned or timed out; waits up to `wait_s` for the first."""
        out = []
        while True:
            try:
                block = wait_s > 0 and not out
                jid, value, fault = self._done.get(timeout=wait_s) if block else self._done.get_nowait()
            except queue.Empty:
                break
            if jid in self.pending:
                out.append((self.pending.pop(jid)[0], value, fault))
            with self._lock:
                self._started.pop(jid, None)
            wait_s = 0.0
        now = time.monotonic()
        with self._lock:
            late = [jid for jid, t in self._started.items() if jid in self.pending and now - t > self.timeout_s]
            for jid in late:
                del self._started[jid]
        for jid in late:
            tag, fn = self.pending.pop(jid)
            out.append((tag, None, ("timeout", f"{getattr(fn, '__qualname__', fn)} did not return within "
                                               f"{self.timeout_s} s")))
            self.abandoned += 1
        return out

    def close(self) -> None:
        for _ in range(self.workers):
            self._todo.put(None)


@dataclass
class OpenGroup:
    """A prompt's episodes in flight."""

    prompt: Prompt
    tokens: list[int]
    walk: int
    """Its position in the searcher's prompt walk."""
    episodes: list[Episode]
    left: int
    """Episodes not over yet (over: ended, and scored unless failed)."""
    resetting: int


class EpisodeStream:
    """Feeds the continuous batch `engine` with episodes of the searcher's next prompts (`feed`) and returns whole
    groups as their last episode ends (`run`), in the order they complete."""

    def __init__(self, engine: Engine, task, tokenizer, *, num_samples: int, max_new_tokens: int, weight_update: str,
                 limits: Limits):
        self.engine, self.task, self.tokenizer = engine, task, tokenizer
        self.num_samples, self.max_new_tokens, self.limits = num_samples, max_new_tokens, limits
        self.in_flight = weight_update == "in_flight"
        self.calls = Calls(min(engine.slots, 8), limits.timeout_s)
        self.open: dict[int, OpenGroup] = {}
        self.ready: list[OpenGroup] = []
        self.draining = False
        """between_batches with newer weights published: no new episode starts until the open ones are over."""
        self.serial = 0
        self.generate_s = 0.0

    def run(self, want: int, feed: Callable[[], tuple[Prompt, list[int], int]], version: Callable[[], int],
            sync: WeightSync | None) -> list[OpenGroup]:
        """Decode until at least `want` prompts have all their episodes over; `feed()` gives the next prompt (prompt,
        tokens, walk position), `version()` the searcher's policy version now."""
        t0 = time.perf_counter()
        cap = OPEN_PER_SLOT * self.engine.slots
        while len(self.ready) < want:
            if sync is not None:
                if self.in_flight:
                    sync.load()
                elif sync.pending():
                    self.draining = True
                    if not self.open:
                        sync.load()
                        self.draining = False
            while not self.draining and self._waiting() < self.engine.slots and (
                    not self.open or self._open_episodes() + self.num_samples <= cap):
                self._start(*feed())
            for f in self.engine.step(version()):
                self._turn_ended(f)
            busy = self.engine.active or self.engine.queue
            for (kind, key, index), value, fault in self.calls.poll(0.0 if busy else 0.01):
                self._answered(kind, key, index, value, fault)
        done, self.ready = self.ready, []
        self.generate_s += time.perf_counter() - t0
        return done

    def oldest(self) -> int | None:
        """The walk position of the oldest prompt in flight (None: nothing is)."""
        return min((o.walk for o in self.open.values()), default=None)

    def close(self) -> None:
        self.calls.close()

    # ---- episodes -------------------------------------------------------------------------------------------
    def _waiting(self) -> int:
        """Rows queued for a slot, counting episodes whose environment is still resetting."""
        return len(self.engine.queue) + sum(o.resetting for o in self.open.values())

    def _open_episodes(self) -> int:
        return sum(o.left for o in self.open.values())

    def _start(self, prompt: Prompt, tokens: list[int], walk: int) -> None:
        key, self.serial = self.serial, self.serial + 1
        episodes = [Episode(prompt, tokens, self.task.environment(prompt)) for _ in range(self.num_samples)]
        group = self.open[key] = OpenGroup(prompt, tokens, walk, episodes, len(episodes), 0)
        for i, e in enumerate(episodes):
            if hasattr(e.env, "reset"):  # optional in the Environment protocol
                group.resetting += 1
                self.calls.submit(("reset", key, i), e.env.reset, prompt)
        if not group.resetting:
            self._first_turn(key)

    def _first_turn(self, key: int) -> None:
        group = self.open[key]
        self.engine.submit(key, group.tokens, self.num_samples, min(self.max_new_tokens, self.limits.max_tokens),
                           keep=True)

    def _turn_ended(self, f) -> None:
        group = self.open[f.key]
        e = group.episodes[f.index]
        if e.end is not None:  # its reset failed: the turn it was queued for is discarded
            self.engine.release(f.key, f.index)
            self._over(f.key)
            return
        e.tokens += f.tokens
        e.mask += [1] * len(f.tokens)
        e.logprobs += f.logprobs
        e.versions += f.versions
        e.turns += 1
        self.calls.submit(("step", f.key, f.index), e.env.step, last_action(e, self.tokenizer))

    def _answered(self, kind: str, key: int, index: int, value, fault) -> None:
        group = self.open[key]
        e = group.episodes[index]
        if kind == "reset":
            if fault:
                _end(e, *fault)
            group.resetting -= 1
            if not group.resetting:
                self._first_turn(key)
        elif kind == "reward":
            scored(e, value, fault)
            self._over(key)
        else:
            before = len(e.tokens)
            answered(e, value, fault, self.tokenizer, self.limits)
            budget = min(self.max_new_tokens, self.limits.max_tokens - len(e.tokens))
            if e.end is None and budget <= 0:
                _end(e, "token_budget")
            if e.end is None:
                self.engine.resume(key, index, e.tokens[before:], budget)
                return
            self.engine.release(key, index)
            if e.end in FAILED:
                self._over(key)
            else:
                self.calls.submit(("reward", key, index), e.env.get_reward)

    def _over(self, key: int) -> None:
        group = self.open[key]
        group.left -= 1
        if not group.left:
            self.ready.append(self.open.pop(key))
