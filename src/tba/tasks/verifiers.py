"""`verifiers:<env id>`: a verifiers v1 environment (PyPI `verifiers` 0.4, Prime Intellect's Environments Hub) as
an agent task — its episodes run by verifiers itself against the endpoint in front of each searcher's sampler.

Why an agent task: a verifiers environment drives the model itself (its harness decides the turns, its taskset the
stop rule and the reward), exactly as the user's function does in `task.name=agent` (tba.tasks.agent). So this task
is that function: `run_agent` runs `Env.run_episode(task, ctx)` with verifiers' own *training* client
(`TrainClientConfig`), which renders prompts to ids client-side and calls the endpoint's token route
(`POST /inference/v1/generate`, `GET /v1/models`; later turns extend the previous ids, `bridge_to_next_turn`, so
sampled ids are never re-tokenized). Everything else is the agent task's machinery: the endpoint records each
episode's calls under its session (the API key's suffix), and the ids it served are stitched into samples by
prefix extension (tba.serve.stitch), one group per verifiers task (VarGrad's log Ẑ over that task's episodes).

Why stitch from the endpoint and not take verifiers' branches: the endpoint's record is the ids tba itself served,
with each token's behaviour log-prob and policy version — what TB's loss needs, checked nowhere else. verifiers'
`Episode.traces[0].branches` (`token_ids`, `sampled_mask`, `logprobs`) are then a cross-check: before an episode is
handed back, its session is read (`GET /tba/v1/sessions/{id}`) and every branch must be the served calls stitched
the same way — ids, policy mask and log-probs — and every served call must be in a branch; otherwise the episode
ends as an error with one line saying where they differ (a per-agent retry, a harness that edited the history).

Branches: verifiers makes a new branch where a turn does not extend the ids before it (each branch "becomes one
training sample"). With `on_break="new_sample"` (the default) each branch is its own sample with the episode's
whole reward: TB then treats each branch as a trajectory that earned that reward by itself — its log π covers only
its own tokens, so the target is not the episode's distribution but a product over branches. `on_break="drop"`
keeps the first branch only. Episodes with several traces (multi-agent environments) are refused, one line each.

The `null` harness (the default here) runs verifiers' chat program as a subprocess, which verifiers prepares with
`uv sync --script` — on first use it installs `uv` (pip --user) and the script's dependencies from the package
registries. The renderer tokenizes with the run's tokenizer (saved to a temporary directory) unless
`renderer_model` names another; `renderer` is verifiers' `RendererConfig` (default: resolved from the model,
falling back to its DefaultRenderer, no tool parsing).
"""

from __future__ import annotations

import asyncio
import math
import shutil
import sys
import tempfile
import threading
import weakref
from pathlib import Path

from tba.errors import ConfigError
from tba.tasks.agent import check_episode_options
from tba.tasks.base import Prompt
from tba.tasks.factory import ScoreLog

NO_KEY = "TBA_VERIFIERS_NO_KEY"
"""An environment variable that is never set: the API key travels in the Authorization header instead (it names
the episode's session, so each episode needs its own), and verifiers reads keys only from the environment."""


class Mismatch(RuntimeError):
    """verifiers' branches are not the calls the endpoint served for the episode."""


def importable(env_id: str) -> str:
    """A taskset given as a package's folder (`examples/vf_sums`) is imported by its name with the folder's parent on
    sys.path — a local taskset needs no install and no PYTHONPATH, here and in every searcher process (each builds
    its task from the config, so each puts the folder there itself)."""
    folder = Path(env_id)
    if not (folder / "__init__.py").is_file():
        return env_id
    parent = str(folder.resolve().parent)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    return folder.name


class VerifiersTask:
    name = "verifiers"

    def __init__(self, env_id: str, env: dict | None = None, sampling: dict | None = None,
                 renderer: dict | None = None, renderer_model: str | None = None, train_size: int | None = None,
                 test_size: int | None = 100, concurrency: int | None = None, timeout_s: float = 600.0,
                 on_break: str = "new_sample", episodes_per_env: int = 512):
        """env_id: the taskset (a module name, a package's folder, or a Hub id `owner/name@version`); env: the rest of
        verifiers' EnvConfig (merged over `{"taskset": {"id": env_id}, "agent": {"harness": {"id": "null"}, "runtime":
        {"type": "subprocess"}}}`, e.g. `{"taskset": {"num_tasks": 64}}`); sampling: verifiers' Sampling (default
        temperature 1.0; max_tokens unset: the endpoint's search.max_new_tokens) — keep its temperature equal to
        search.temperature, at which the trainer scores; test_size: the last tasks held out (at most a tenth);
        episodes_per_env: verifiers keeps one client per episode until its serving ends, so after this many episodes new
        ones go to a freshly loaded environment and the old one closes when its episodes end. The rest as the agent
        task's."""
        check_episode_options(on_break, concurrency, timeout_s)
        try:
            import verifiers.v1 as vf
            from verifiers.v1.utils.loaders import resolve_env_config
        except ImportError as e:
            raise ConfigError(f"task.name=verifiers:{env_id} needs the `verifiers` package (pip install "
                              f"'tba[verifiers]'): {e}") from None
        env_id = importable(env_id)
        self.env_id, self.agent_name = env_id, f"verifiers:{env_id}"
        self.concurrency = None if concurrency is None else int(concurrency)
        self.timeout_s, self.on_break = float(timeout_s), on_break
        base = {"taskset": {"id": env_id}, "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}}
        try:
            self.config = resolve_env_config(_merged(base, env or {}))
            self.sampling = vf.Sampling(**{"temperature": 1.0, **(sampling or {})})
        except Exception as e:
            raise ConfigError(f"task.options: verifiers refused the environment config of {env_id!r}: "
                              f"{type(e).__name__}: {e}") from None
        self.renderer = renderer
        self.renderer_model = renderer_model
        self.envs = Environments(self.config, int(episodes_per_env))
        tasks = list(self.envs.taskset())
        held = min(test_size or 0, max(len(tasks) // 10, 1)) if len(tasks) > 1 else 0
        self.tasks = tasks
        self.train = [self._prompt(i, j) for i, j in enumerate(range(len(tasks) - held)[:train_size])]
        self.test = [self._prompt(i, j) for i, j in enumerate(range(len(tasks) - held, len(tasks)))]
        self._scored = ScoreLog()

    def _prompt(self, i: int, j: int) -> Prompt:
        data = self.tasks[j].data
        return Prompt(i, _text(data.prompt) or f"{self.env_id} task {data.idx}", "", {"task": j, "idx": data.idx})

    def use_tokenizer(self, tokenizer) -> None:
        """The renderer tokenizes with the run's own tokenizer: saved once to a temporary directory (removed with
        this task) that verifiers loads by path, unless task.options.renderer_model names another."""
        if self.renderer_model is not None:
            return
        where = tempfile.mkdtemp(prefix="tba-verifiers-tokenizer-")
        weakref.finalize(self, shutil.rmtree, where, True)
        tokenizer.save_pretrained(where)
        self.renderer_model = where

    def run_agent(self, prompt: Prompt, *, base_url: str, api_key: str, model: str):
        """One verifiers episode of `prompt`'s task through the endpoint at `base_url`, checked against what it
        served; returns its single trace."""
        from verifiers.v1.clients import ModelContext, TrainClientConfig

        if self.renderer_model is None:
            raise ConfigError("task.options.renderer_model: no tokenizer for verifiers' renderer (the run gives its "
                              "own through use_tokenizer; outside a run, name a tokenizer directory or Hub id)")
        client = TrainClientConfig(base_url=base_url, api_key_var=NO_KEY, renderer=self.renderer,
                                   renderer_model_name=self.renderer_model,
                                   headers={"Authorization": f"Bearer {api_key}"})
        ctx = ModelContext(model=model, client=client, sampling=self.sampling)
        episode = self.envs.run(self.tasks[prompt.meta["task"]], ctx, self.timeout_s)
        if episode.errors:
            e = episode.errors[-1]
            raise RuntimeError(f"verifiers episode failed: {e.type}: {e.message}".splitlines()[0])
        if len(episode.traces) != 1:
            raise Mismatch(f"a verifiers episode with {len(episode.traces)} traces (a multi-agent environment): "
                           "tba trains single-agent episodes only")
        (trace,) = episode.traces
        if why := mismatch(trace.branches, served_calls(base_url, api_key)):
            raise Mismatch(f"verifiers' branches are not what the endpoint served: {why}")
        return trace

    def score(self, prompt: Prompt, value, completion: str) -> tuple[float | None, dict[str, float]]:
        """The trace's reward (verifiers' weighted sum) and each named reward's score."""
        values = {name: float(r.score) for name, r in value.rewards.items() if r is not None}
        reward = float(value.reward) if values and math.isfinite(value.reward) else None
        self._scored.add(values)
        return reward, values

    def reward_metrics(self) -> dict[str, float]:
        """Each named reward's mean over the episodes scored since the last call (`reward/<name>`)."""
        return self._scored.means()


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _text(prompt) -> str:
    """A task's prompt as one line of text (for logs and the prompt list): a string, or its last message's."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        last = prompt[-1]
        content = last.get("content") if isinstance(last, dict) else getattr(last, "content", None)
        return content if isinstance(content, str) else ""
    return ""


def served_calls(base_url: str, api_key: str) -> list[dict]:
    """The calls the endpoint recorded for the session `api_key` names (`<token>.<session>`, tba.serve.sessions),
    read through its own route."""
    import httpx

    session = api_key.partition(".")[2]
    r = httpx.get(f"{base_url.removesuffix('/v1')}/tba/v1/sessions/{session}",
                  headers={"Authorization": f"Bearer {api_key}"}, timeout=60)
    if r.status_code == 404:
        return []
    r.raise_for_status()
    return r.json()["calls"]


def mismatch(branches, calls: list[dict]) -> str | None:
    """None where each branch is served calls stitched by prefix extension — each call's prompt the ids before its
    sampled span, the span its first sample, the policy mask exactly those spans, the log-probs the served ones —
    and every call is in a branch, in order; else the first difference, in words."""
    i = 0
    for b, branch in enumerate(branches):
        ids, mask, logprobs = list(branch.token_ids), [bool(m) for m in branch.sampled_mask], list(branch.logprobs)
        want, end = [False] * len(ids), 0
        while i < len(calls):
            prompt, sample = calls[i]["prompt_token_ids"], calls[i]["samples"][0]
            stop = len(prompt) + len(sample["token_ids"])
            if ids[:len(prompt)] != prompt or ids[len(prompt):stop] != sample["token_ids"] or stop < end:
                break
            if any(abs(a - b) > 1e-6 for a, b in zip(logprobs[len(prompt):stop], sample["logprobs"], strict=True)):
                return f"branch {b}: the log-probs of call {i} are not the served ones"
            want[len(prompt):stop] = [True] * (stop - len(prompt))
            end, i = stop, i + 1
        if end == 0:
            return f"branch {b} ({len(ids)} ids) starts with no served call"
        if end != len(ids):
            return f"branch {b} has {len(ids) - end} ids after the last call served in it"
        if mask != want:
            return f"branch {b}: its sampled_mask is not the served spans"
    if i != len(calls):
        return f"{len(calls) - i} of {len(calls)} served calls are in no branch"
    return None


class Environments:
    """verifiers environments held open (`Env.serving()`) on the process's verifiers loop while episodes run on them.

    Why a loop of its own (_Loop): verifiers is asyncio and holds its interception server (which the harness subprocess
    calls, and which calls tba's endpoint through the training client) for the life of `serving()`; the agent
    machinery runs each episode in a thread of its own (tba.serve.agents.Harnesses). So episodes are submitted to
    that loop and waited for; an environment's serving ends when the last episode in flight on it ends, so nothing of
    verifiers outlives the episodes. verifiers keeps a client per distinct client config (here: per episode, as
    each names its session) until its serving ends, so an environment takes `per_env` episodes at most: later ones
    go to a fresh one, loaded from the same config, and the old one closes once its episodes are done."""

    def __init__(self, config, per_env: int):
        self.config, self.per_env = config, max(1, per_env)
        self._lock = threading.Lock()
        self._current: _Serving | None = None
        self._first = None

    def taskset(self):
        """The first environment's taskset (loaded once; its tasks run on every environment of this config)."""
        if self._first is None:
            import verifiers.v1 as vf

            self._first = vf.load_environment(self.config)
        return self._first.taskset

    def run(self, task, ctx, timeout_s: float):
        with self._lock:
            if self._current is None or self._current.started >= self.per_env:
                env, self._first = self._first, None
                if env is None:
                    import verifiers.v1 as vf

                    env = vf.load_environment(self.config)
                self._current = _Serving(env)
            serving = self._current
            serving.enter()
        try:
            return serving.run(serving.env.run_episode(task, ctx), timeout_s)
        finally:
            serving.leave()


class _Loop:
    """The process's one event loop for verifiers, on a daemon thread started when first needed.

    One for the process, not one per environment: verifiers' renderer pool is process-wide and binds its locks to
    the loop that last used it, so two loops running episodes at once (the searcher's and the evaluation's, or an
    environment closing while its successor starts) break each other's renders. Idle, it holds nothing."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(target=cls._loop.run_forever, daemon=True, name="tba-verifiers").start()
            return cls._loop

    @classmethod
    def run(cls, coroutine, timeout_s: float | None = None):
        future = asyncio.run_coroutine_threadsafe(coroutine, cls.get())
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()  # the harness subprocess ends with its episode
            raise


class _Serving:
    """One environment's `serving()`, held open on the loop while `users` episodes run on it."""

    def __init__(self, env):
        self.env, self.started, self.users = env, 0, 0
        self._lock = threading.Lock()
        self._held = None  # (the task holding serving() open, the event that ends it)

    def enter(self) -> None:
        with self._lock:
            self.started, self.users = self.started + 1, self.users + 1
            if self._held is None:
                try:
                    self._held = _Loop.run(self._open())
                except BaseException:
                    self.users -= 1
                    raise

    async def _open(self):
        opened, stop = asyncio.Event(), asyncio.Event()

        async def hold():
            async with self.env.serving():
                opened.set()
                await stop.wait()

        task = asyncio.create_task(hold())
        await asyncio.wait([task, asyncio.create_task(opened.wait())], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # serving() failed: raise it here
        return task, stop

    def run(self, coroutine, timeout_s: float):
        return _Loop.run(coroutine, timeout_s)

    def leave(self) -> None:
        with self._lock:
            self.users -= 1
            if self.users == 0 and self._held is not None:
                task, stop = self._held
                self._held = None

                async def close():
                    stop.set()
                    await task

                _Loop.run(close(), 60)
