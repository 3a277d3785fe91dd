"""Episodes from outside, served: the user's agent function run N at a time against an endpoint over a sampler, each
episode's calls stitched into token-exact trajectories (the `agent` task kind: tba.tasks.agent, tba.rollout.outside).

    Harnesses     one daemon thread per episode, its own session (the API key's suffix); a function that raises ends
                  its episode (`error`, one line naming it), one that runs past task.options.timeout_s is abandoned
                  (`timeout`: Python cannot kill a thread; its session is discarded, its late result ignored)
    Gate          the engine decodes only while the searcher's step runs, and loads weights only there
    AgentStream   a searcher's endpoint and harnesses: rows fed, S episodes each, whole rows handed back
    AgentEvaluator  the run's held-out evaluation: the trainer's policy served greedily, one episode per test row

Why the gate: the searcher's weights change only in its own step (the runtime's receiver, or — inline — the trainer's
tensors, which are mid-update while the trainer trains). So the engine thread, the only code that touches the sampler,
decodes while a step is open and pauses between steps; in-flight weight updates (search.weight_update=in_flight)
load right before a decode step, on that thread, and every sampled token records its version. A harness keeps its
own pace across steps (its requests wait while the engine is paused), so one episode may span versions: TB needs no
importance ratio for that. With between_batches, weights load only when a step starts.

Nothing outlives `close()` but threads stuck in the user's own code: the engine and uvicorn stop, requests in flight
fail, so a harness waiting on the endpoint returns; what is left is daemon threads, named in one log line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tba.config.schema import EvalConfig, SearchConfig
from tba.rollout.evaluate import describe
from tba.rollout.outside import OutsideEpisode, OutsideGroup
from tba.rollout.stream import WeightSync
from tba.serve.engine import Batch, EngineLoop, Params, Token
from tba.serve.protocol import Limits
from tba.serve.server import Server, batch_for
from tba.serve.stitch import stitch
from tba.tasks.base import Prompt, raised_in

logger = logging.getLogger(__name__)

MODEL = "policy"
"""The model name an agent is given (and the endpoint serves)."""


class Gate:
    """Decode steps run only between `opened()` and its end; `shut()` lets a waiting engine thread go for good."""

    def __init__(self):
        self._open, self._lock, self.closed = threading.Event(), threading.Lock(), False
        self._load: Callable[[], None] | None = None

    @contextlib.contextmanager
    def opened(self, load: Callable[[], None] | None = None):
        """Decode while inside; `load` (a searcher's in-flight weight load) runs before each step."""
        self._load = load
        self._open.set()
        try:
            yield
        finally:
            self._open.clear()
            with self._lock:  # the step under way ends before the caller goes on
                self._load = None

    def shut(self) -> None:
        self.closed = True
        self._open.set()

    def step(self, fn: Callable[[], list[Token]]) -> list[Token]:
        while not self._open.wait(0.1):
            pass
        with self._lock:
            if self.closed or not self._open.is_set():
                return []
            if self._load is not None:
                self._load()
            return fn()


class Wrapped:
    """A serving batch (tba.serve.engine.Batch) that hands everything to `inner`; subclasses change one call."""

    def __init__(self, inner: Batch):
        self.inner = inner

    def add(self, rid: str, prompt: list[int], params: Params) -> None:
        self.inner.add(rid, prompt, params)

    def cancel(self, rid: str) -> None:
        self.inner.cancel(rid)

    def step(self, version: int) -> list[Token]:
        return self.inner.step(version)

    @property
    def active(self) -> int:
        return self.inner.active

    @property
    def idle(self) -> bool:
        return self.inner.idle


class GatedBatch(Wrapped):
    """A serving batch that steps through a Gate, at the searcher's version after any load."""

    def __init__(self, inner: Batch, gate: Gate, version: Callable[[], int]):
        super().__init__(inner)
        self.gate, self.version = gate, version

    def step(self, version: int) -> list[Token]:
        return self.gate.step(lambda: self.inner.step(self.version()))


@dataclass
class _Running:
    tag: object
    prompt: Prompt
    session: str
    started: float = field(default_factory=time.monotonic)
    abandoned: bool = False


class Harnesses:
    """The task's agent function, one thread per episode, against `server`; `poll` returns ended episodes."""

    def __init__(self, task, server: Server, tokenizer, timeout_s: float):
        self.task, self.server, self.tokenizer, self.timeout_s = task, server, tokenizer, timeout_s
        self.running: dict[str, _Running] = {}
        self.threads: list[threading.Thread] = []
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._serial = itertools.count()
        self.who = f"agent {task.agent_name}"

    def start(self, tag, prompt: Prompt) -> None:
        run = _Running(tag, prompt, f"ep{next(self._serial)}")
        self.running[run.session] = run
        thread = threading.Thread(target=self._episode, args=(run,), daemon=True, name=f"tba-agent-{run.session}")
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        thread.start()

    def _episode(self, run: _Running) -> None:
        sessions = self.server.sessions
        try:
            value = self.task.run_agent(run.prompt, base_url=self.server.url + "/v1",
                                        api_key=f"{self.server.token}.{run.session}", model=MODEL)
            calls = sessions.pop(run.session) or []
            stitched = stitch(calls, self.task.on_break)
            last = calls[-1].samples[0].token_ids if calls and calls[-1].samples else []
            completion = self.tokenizer.decode(last, skip_special_tokens=True)
            reward, _ = self.task.score(run.prompt, value, completion)
            episode = OutsideEpisode(run.prompt, stitched.trajectories, "done", reward, None, len(calls),
                                     stitched.dropped, stitched.breaks)
        except Exception as e:  # noqa: BLE001 — user code: the episode ends, the run goes on
            episode = OutsideEpisode(run.prompt, [], "error", None, raised_in(self.who, e))
        finally:
            sessions.pop(run.session)
        self._done.put((run, episode))

    def poll(self, wait_s: float = 0.0) -> list[tuple[object, OutsideEpisode]]:
        """(tag, episode) of every episode that ended or timed out since the last call; waits up to `wait_s`."""
        out = []
        while True:
            try:
                run, episode = self._done.get(timeout=wait_s) if wait_s > 0 and not out else self._done.get_nowait()
            except queue.Empty:
                break
            wait_s = 0.0
            if not run.abandoned:
                del self.running[run.session]
                out.append((run.tag, episode))
        now = time.monotonic()
        for run in [r for r in self.running.values() if now - r.started > self.timeout_s]:
            run.abandoned = True
            del self.running[run.session]
            self.server.sessions.pop(run.session)
            why = f"{self.who} did not return within {self.timeout_s:g} s (task.options.timeout_s)"
            out.append((run.tag, OutsideEpisode(run.prompt, [], "timeout", None, why)))
        return out

    def close(self, wait_s: float = 5.0) -> None:
        deadline = time.monotonic() + wait_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if left := [t.name for t in self.threads if t.is_alive()]:
            logger.warning(f"{len(left)} {self.who} thread(s) still running in the agent's own code after the "
                           f"endpoint closed ({', '.join(left[:4])}): daemon threads, they end with the process")


def serve_sampler(sampler, tokenizer, *, slots: int, version: Callable[[], int], limits: Limits,
                  wrap: Callable[[Batch], Batch] = lambda b: b) -> Server:
    """A started endpoint over `sampler`'s serving batch (each batch made passes through `wrap`), loopback only."""
    make = batch_for(sampler, slots)
    engine = EngineLoop(lambda: wrap(make()), version=version)
    return Server(engine, tokenizer, model_name=MODEL, limits=limits).start()


def stop(server: Server, harnesses: Harnesses) -> None:
    """End the engine first (requests in flight fail at once, so harnesses waiting on them return), then uvicorn,
    then wait briefly for the harness threads."""
    server.engine.stop()
    server.close()
    harnesses.close()


@dataclass
class _Open:
    prompt: Prompt
    walk: int
    episodes: list[OutsideEpisode | None]


class AgentStream:
    """A searcher's episodes from outside (tba.rollout.outside.OutsideStream): an endpoint over its sampler and the
    task's agent run `concurrency` episodes at a time, `search.generations_per_prompt` per row."""

    def __init__(self, sampler, task, tokenizer, search: SearchConfig, *, version: Callable[[], int],
                 max_model_len: int):
        self.task, self.search, self.per_row = task, search, search.generations_per_prompt
        self.concurrency = task.concurrency or search.prompts_per_batch * search.generations_per_prompt
        self.in_flight = search.weight_update == "in_flight"
        self.gate = Gate()
        limits = Limits(max_model_len=max_model_len, max_tokens=search.max_new_tokens, timeout_s=task.timeout_s,
                        max_in_flight=max(256, 4 * self.concurrency))
        self.server = serve_sampler(sampler, tokenizer, slots=search.slots or self.concurrency, version=version,
                                    limits=limits, wrap=lambda b: GatedBatch(b, self.gate, version))
        self.harnesses = Harnesses(task, self.server, tokenizer, task.timeout_s)
        self.open: dict[int, _Open] = {}
        self.ready: list[OutsideGroup] = []
        self._keys = itertools.count()

    def run(self, want: int, feed, version, sync: WeightSync | None) -> list[OutsideGroup]:
        if sync is not None:
            sync.load()  # the engine is paused here: between batches, and the first load of an in-flight step
        with self.gate.opened(sync.load if sync is not None and self.in_flight else None):
            while len(self.ready) < want:
                while not self.open or len(self.harnesses.running) + self.per_row <= self.concurrency:
                    prompt, _, walk = feed()
                    key = next(self._keys)
                    self.open[key] = _Open(prompt, walk, [None] * self.per_row)
                    for i in range(self.per_row):
                        self.harnesses.start((key, i), prompt)
                for (key, i), episode in self.harnesses.poll(0.05):
                    row = self.open[key]
                    row.episodes[i] = episode
                    if all(e is not None for e in row.episodes):
                        self.ready.append(OutsideGroup(row.prompt, row.walk, row.episodes))
                        del self.open[key]
        done, self.ready = self.ready, []
        return done

    def oldest(self) -> int | None:
        return min((o.walk for o in self.open.values()), default=None)

    def close(self) -> None:
        self.gate.shut()
        stop(self.server, self.harnesses)


class Fixed(Wrapped):
    """A serving batch whose every request samples at the evaluation's settings, whatever the harness asked:
    greedy (temperature 0) for eval.samples_per_prompt = 0, as tba's other evaluations are."""

    def __init__(self, inner: Batch, temperature: float, top_p: float):
        super().__init__(inner)
        self.temperature, self.top_p = temperature, top_p

    def add(self, rid: str, prompt: list[int], params: Params) -> None:
        self.inner.add(rid, prompt, dataclasses.replace(params, temperature=self.temperature, top_p=self.top_p))


class AgentEvaluator:
    """The held-out evaluation of an agent task: `policy` (the trainer's, as it is now) behind an endpoint of its
    own, the agent run on every test row (`eval.samples_per_prompt` times, else once, greedy), `concurrency` at a
    time. score = the mean reward (an episode that failed or was not scored counts 0); episode/ended_<reason> as
    fractions; agent/calls_mean; each reward source's mean."""

    def __init__(self, policy, tokenizer, task, cfg: EvalConfig, *, search: SearchConfig, max_model_len: int):
        self.policy, self.tokenizer, self.task, self.cfg = policy, tokenizer, task, cfg
        self.concurrency = task.concurrency or search.prompts_per_batch * search.generations_per_prompt
        self.limits = Limits(max_model_len=max_model_len, max_tokens=cfg.max_new_tokens, timeout_s=task.timeout_s,
                             max_in_flight=max(256, 4 * self.concurrency))

    @torch.no_grad()
    def __call__(self) -> dict[str, float]:
        from tba.rollout.samplers.hf import HFSampler

        prompts = [p for p in self.task.test for _ in range(max(self.cfg.samples_per_prompt, 1))]
        if not prompts:
            return {"score": float("nan")}
        greedy = self.cfg.samples_per_prompt == 0
        was_training = self.policy.training
        server = serve_sampler(HFSampler(self.policy, self.tokenizer), self.tokenizer, slots=self.concurrency,
                               version=lambda: 0, limits=self.limits,
                               wrap=lambda b: Fixed(b, 0.0 if greedy else self.cfg.temperature,
                                                    1.0 if greedy else self.cfg.top_p))
        harnesses = Harnesses(self.task, server, self.tokenizer, self.task.timeout_s)
        episodes: list[OutsideEpisode] = []
        try:
            self.task.reward_metrics()  # what training scored so far is not this evaluation's
            todo = list(enumerate(prompts))
            while len(episodes) < len(prompts):
                while todo and len(harnesses.running) < self.concurrency:
                    harnesses.start(*todo.pop(0))
                episodes += [e for _, e in harnesses.poll(0.05)]
        finally:
            stop(server, harnesses)
            self.policy.train(was_training)
        n = len(episodes)
        metrics = {"score": sum(e.reward or 0.0 for e in episodes) / n,
                   "agent/calls_mean": sum(e.calls for e in episodes) / n}
        metrics.update({f"episode/ended_{r}": sum(e.end == r for e in episodes) / n
                        for r in sorted({e.end for e in episodes})})
        metrics.update(self.task.reward_metrics())
        return metrics

    def describe(self, metrics: dict[str, float]) -> str:
        return describe(metrics, self.cfg, len(self.task.test))
