"""`openenv`: an OpenEnv environment — a server with reset / step / state over HTTP and WebSocket — as a multi-turn
task.

    tba train RECIPE task.name=openenv task.options.url=http://127.0.0.1:8000       # a server already running
    tba train RECIPE task.name=openenv task.options.app=my_env.server:GuessEnv      # served by tba on 127.0.0.1

OpenEnv has no dataset: a prompt is an episode with a seed — `episodes` train ones (seeds `seed`, `seed` + 1, …)
and `test_episodes` held-out ones (the seeds after them) — and every episode of a prompt is reset with its seed, so
an evaluation plays the same environments each time. The prompt's text is `prompt` with `{observation}` replaced
by reset(seed)'s observation, taken once per seed when the task is built (reset must be a function of its seed).
Each episode has its own WebSocket session (OpenEnv's `/ws`, one environment per connection), reset with its seed;
then, turn by turn:

- the policy's turn (decoded text) is the action `{action_field: text}`; by default the field is the action
  schema's one required string field (else its one string field), read from the server's `/schema`;
- the observation's `observation_field` comes back as the next turn — by default the observation schema's first
  string field (besides done, reward and metadata); an observation without one comes back as JSON — rendered as a
  `role` message by the run's chat template (between newlines for a tokenizer without one: tba.tasks.tools.chat_turn);
- each step's reward is added to the episode's reward (None counts 0); `done` ends the episode (as does
  search.max_turns; a cut episode keeps the rewards it got);
- a step the server does not answer within `step_timeout_s` ends the episode as a `timeout`, naming the step and
  the seed (keep it under search.env_timeout_s, which bounds the whole call).

The server must take as many sessions at once as episodes in flight (search.prompts_per_batch ×
search.generations_per_prompt per searcher; OpenEnv's create_app(max_concurrent_envs=…)).

`app` names (`module:name`, `path/to/file.py:name`) an OpenEnv `Environment` class — served as
create_app(Cls, ActionCls, ObservationCls, max_concurrent_envs=max_sessions), the two classes read from its
generic parameters (one session only unless it sets SUPPORTS_CONCURRENT_SESSIONS) — or an app that create_app made,
or a function that returns one. tba serves it with uvicorn in a child process at a free port on 127.0.0.1, one per
copy of the task (each searcher's, and the trainer's for evaluation), and stops it with that copy or its process;
the child also exits as soon as its parent is gone (it reads a pipe only the parent holds), so none outlives a run.

The client is `openenv-core`'s GenericEnvClient (pip install tba[openenv]).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import typing
import urllib.request
import weakref

from tba.errors import ConfigError, UserError
from tba.plugins import load_object
from tba.tasks.base import Prompt

NOT_OBSERVED = ("done", "reward", "metadata")
SERVE = """import os, sys, threading
threading.Thread(target=lambda: (sys.stdin.buffer.read(), os._exit(0)), daemon=True).start()  # parent gone: exit
import uvicorn
from tba.tasks.openenv import app_of
uvicorn.run(app_of(sys.argv[1], int(sys.argv[3])), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


class OpenEnvError(UserError):
    """The OpenEnv server cannot be used: it does not start, does not answer, or its schema does not fit."""

    label = "openenv error"


def _client_class():
    try:
        from openenv import GenericEnvClient
    except ImportError:
        raise ConfigError("task.name=openenv needs OpenEnv's client: pip install tba[openenv] "
                          "(openenv-core)") from None
    return GenericEnvClient


def app_of(target: str, max_sessions: int):
    """The ASGI app `target` names: an OpenEnv Environment class served by create_app, an app, or a function
    returning one (what the child process serves)."""
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment

    obj = load_object(target, "task.options.app")
    if isinstance(obj, type) and issubclass(obj, Environment):
        for klass in obj.__mro__:
            for base in getattr(klass, "__orig_bases__", ()):
                if typing.get_origin(base) is Environment and len(typing.get_args(base)) >= 2:
                    action, observation = typing.get_args(base)[:2]
                    sessions = max_sessions if getattr(obj, "SUPPORTS_CONCURRENT_SESSIONS", False) else 1
                    return create_app(obj, action, observation, env_name=obj.__name__, max_concurrent_envs=sessions)
        raise ConfigError(f"task.options.app: {target} does not say its action and observation classes "
                          "(class MyEnv(Environment[MyAction, MyObservation, State]))")
    return obj if hasattr(obj, "router") or not callable(obj) else obj()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen, log) -> None:
    if proc.poll() is None:
        proc.stdin.close()  # the child exits on its own when it sees the pipe close; terminate in case it is stuck
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.close()


class LocalServer:
    """`app` served in a child process on 127.0.0.1 (see the module docstring); `close` (or the process's exit)
    stops it."""

    def __init__(self, target: str, max_sessions: int, startup_timeout_s: float):
        port, self.log = _free_port(), tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-c", SERVE, target, str(port), str(max_sessions)],
                                     stdin=subprocess.PIPE, stdout=self.log, stderr=self.log)
        self._stop = weakref.finalize(self, _stop, self.proc, self.log)  # at close, collection or interpreter exit
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                tail = self.log.read().decode(errors="replace").strip().splitlines()[-3:]
                self.close()
                raise OpenEnvError(f"task.options.app: serving {target} failed (exit {self.proc.returncode}): "
                                   + " | ".join(tail))
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise OpenEnvError(f"task.options.app: {target} did not answer on {self.url}/health within "
                           f"{startup_timeout_s} s (task.options.startup_timeout_s)")

    def close(self) -> None:
        self._stop()


def fields(schema: dict, action_field: str | None, observation_field: str | None) -> tuple[str, str | None]:
    """The action's text field and the observation's (None: the observation as JSON) from the server's /schema."""
    action = schema.get("action", {})
    props = {k: v for k, v in action.get("properties", {}).items() if k != "metadata"}
    strings = [k for k, v in props.items() if v.get("type") == "string"]
    if action_field is None:
        required = [k for k in action.get("required", []) if k in strings]
        candidates = required or strings
        if len(candidates) != 1:
            raise ConfigError(f"task.options.action_field: the action schema has {len(candidates)} candidate string "
                              f"fields ({', '.join(candidates) or 'none'}; all fields: {', '.join(props)}): name the "
                              "one the policy's text fills")
        action_field = candidates[0]
    elif action_field not in props:
        raise ConfigError(f"task.options.action_field: {action_field!r} is not in the action schema "
                          f"({', '.join(props)})")
    observed = {k: v for k, v in schema.get("observation", {}).get("properties", {}).items()
                if k not in NOT_OBSERVED}
    if observation_field is None:
        observation_field = next((k for k, v in observed.items() if v.get("type") == "string"), None)
    elif observation_field not in observed:
        raise ConfigError(f"task.options.observation_field: {observation_field!r} is not in the observation "
                          f"schema ({', '.join(observed)})")
    return action_field, observation_field


class OpenEnvSession:
    """One episode: its own WebSocket session, reset with the prompt's seed, its step rewards summed."""

    def __init__(self, task: OpenEnvTask, prompt: Prompt):
        self.task, self.seed = task, prompt.meta["seed"]
        self.client, self.total, self.steps, self.done = None, 0.0, 0, False

    def reset(self, prompt: Prompt) -> None:
        self.client = self.task.client()
        self.client.connect()
        self.client.reset(seed=self.seed)

    def step(self, action: str) -> str | None:
        self.steps += 1
        try:
            result = self.client.step({self.task.action_field: action})
        except TimeoutError:
            self.close()
            raise TimeoutError(f"OpenEnv step {self.steps} of the episode of seed {self.seed} did not answer "
                               f"within {self.task.step_timeout_s} s (task.options.step_timeout_s)") from None
        self.total += float(result.reward or 0.0)
        if result.done:
            self.done = True
            self.close()
            return None
        return self.task.turn(result.observation)

    def get_reward(self) -> float:
        self.close()
        return self.total

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:  # in the background: a hung server's close handshake must not hold the episode
            threading.Thread(target=client.close, daemon=True, name="tba-openenv-close").start()


class OpenEnvTask:
    name = "openenv"

    def __init__(self, url: str | None = None, app: str | None = None, action_field: str | None = None,
                 observation_field: str | None = None, prompt: str = "{observation}", role: str = "user",
                 episodes: int = 256, test_episodes: int = 64, seed: int = 0, step_timeout_s: float = 8.0,
                 max_sessions: int = 64, startup_timeout_s: float = 60.0):
        """url: a running server; app: what tba serves itself (one of the two); action_field / observation_field:
        the schema's fields (default: see the module docstring); prompt: the prompt's text, `{observation}` the
        reset observation's; role: the chat role the observation comes back as; episodes / test_episodes: how many
        train / held-out seeds, from `seed`; step_timeout_s: the longest wait for one step; max_sessions: the
        sessions an app served here takes at once; startup_timeout_s: the longest wait for it to start."""
        if (url is None) == (app is None):
            raise ConfigError("task.options: the openenv task needs url= (a running OpenEnv server) or app= (an "
                              "Environment class to serve, module:Class), not both")
        if not isinstance(prompt, str):
            raise ConfigError("task.options.prompt: text, with {observation} where the reset observation goes")
        self.client_class = _client_class()
        self.step_timeout_s, self.role, self.tokenizer = float(step_timeout_s), role, None
        self.server = LocalServer(app, max_sessions, startup_timeout_s) if app is not None else None
        self.url = self.server.url if self.server is not None else url.rstrip("/")
        try:
            with urllib.request.urlopen(f"{self.url}/schema", timeout=step_timeout_s) as r:
                schema = json.loads(r.read())
        except OSError as e:
            raise OpenEnvError(f"task.options.url: no OpenEnv schema at {self.url}/schema ({e})") from None
        self.action_field, self.observation_field = fields(schema, action_field, observation_field)
        seeds = list(range(seed, seed + episodes + test_episodes))
        texts = self._first_observations(seeds)
        made = [Prompt(i, prompt.replace("{observation}", t), "", {"seed": s}) for i, (s, t) in
                enumerate(zip(seeds, texts, strict=True))]
        self.train = made[:episodes]
        self.test = [Prompt(i, p.text, "", p.meta) for i, p in enumerate(made[episodes:])]

    def client(self):
        """A new session's client (synchronous), each message answered within step_timeout_s."""
        return self.client_class(base_url=self.url, connect_timeout_s=self.step_timeout_s,
                                 message_timeout_s=self.step_timeout_s).sync()

    def _first_observations(self, seeds: list[int]) -> list[str]:
        """reset(seed)'s observation text for every seed, over one session."""
        session = self.client()
        try:
            session.connect()
            return [self.text(session.reset(seed=s).observation) for s in seeds]
        except Exception as e:
            raise OpenEnvError(f"OpenEnv server {self.url}: reset failed ({type(e).__name__}: {e})") from e
        finally:
            session.close()

    def text(self, observation: dict) -> str:
        if self.observation_field is None:
            return json.dumps(observation, sort_keys=True)
        return str(observation.get(self.observation_field, ""))

    def turn(self, observation: dict) -> str:
        """An observation as the text of the next turn: a `role` message in the chat template's format."""
        from tba.tasks.tools import chat_turn  # here: the served app's process imports this module, not transformers

        text = self.text(observation)
        return chat_turn(self.tokenizer, self.role, text) if self.tokenizer is not None else f"\n{text}\n"

    def use_tokenizer(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def environment(self, prompt: Prompt) -> OpenEnvSession:
        return OpenEnvSession(self, prompt)

    def episode_metrics(self, episodes) -> dict[str, float]:
        """The share of episodes the environment ended (`done`) and the mean number of steps."""
        envs = [e.env for e in episodes if isinstance(e.env, OpenEnvSession)]
        n = max(len(envs), 1)
        return {"openenv/done_share": sum(env.done for env in envs) / n,
                "openenv/steps_mean": sum(env.steps for env in envs) / n}

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
