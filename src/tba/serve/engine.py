"""One thread owns the sampler; every request joins its batch.

Why a thread: a sampler's decode loop is synchronous torch (or vLLM's engine step), and the HTTP server is an
asyncio loop. The engine thread is the only code that touches the sampler, so nothing serializes requests behind
a lock: each HTTP request hands its prompt to the thread (`submit`), the thread admits it into the batch that is
already decoding — tba.models.continuous on the hf backend (`tba.serve.hf_batch`), vLLM's own scheduler on vllm
(`tba.serve.vllm_batch`) — and streams each sampled token back to the request's asyncio queue. Twenty requests in
flight are twenty rows of one forward, not twenty forwards.

Every token carries the policy version of the forward that sampled it: `version()` is read before each step,
and `before_step()` (when given) may load newer weights between two steps, as a searcher does in flight.

A step that raises (out of memory, a model error) fails the requests in flight with that error, the batch is
rebuilt, and the loop goes on: one bad request never stops the server.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

logger = logging.getLogger(__name__)


class ShuttingDown(RuntimeError):
    """The engine is stopping: a request still queued or in flight gets this (the endpoint answers 503)."""


@dataclass(frozen=True)
class Params:
    """How one request samples (validated by tba.serve.protocol before it gets here)."""

    n: int = 1
    temperature: float = 1.0
    """0: greedy (the reported log-probs are then of softmax(logits), T = 1)."""
    top_p: float = 1.0
    max_tokens: int = 16
    stop_token_ids: frozenset[int] = frozenset()
    """Besides the tokenizer's EOS, which always stops; a stop token is kept as the response's last."""
    top_logprobs: int = 0


@dataclass
class Token:
    """One sampled token of sample `index` of request `rid`."""

    rid: str
    index: int
    token: int
    """-1: no token, the sample ended without one (an engine abort); only `finish` counts."""
    logprob: float
    """Of the distribution it was drawn from: softmax(logits / T), top-p renormalised."""
    version: int
    top: list[tuple[int, float]] | None = None
    """The `top_logprobs` most likely (token, log-prob) of softmax(logits / T), before top-p."""
    finish: str | None = None
    """"stop" (EOS or a stop token), "length" (max_tokens) on the sample's last token, else None."""


class Batch(Protocol):
    """What the engine thread drives: a sampler's continuous batch with per-request sampling settings."""

    def add(self, rid: str, prompt: list[int], params: Params) -> None:
        """Queue `params.n` samples of `prompt`."""

    def cancel(self, rid: str) -> None:
        """Drop a request's samples, queued or in flight (nothing more is reported of them)."""

    def step(self, version: int) -> list[Token]:
        """Admit, decode one token for every row, return the tokens sampled."""

    @property
    def active(self) -> int:
        """Rows in flight."""

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing in flight."""


@dataclass
class EngineStats:
    """What the loop did: how much batching happened is `tokens / steps` (rows per step)."""

    steps: int = 0
    tokens: int = 0
    max_active: int = 0
    errors: int = 0
    requests: int = 0


@dataclass
class _Request:
    prompt: list[int]
    params: Params
    sink: Callable[[list[Token] | BaseException], None]
    left: int = field(init=False)

    def __post_init__(self):
        self.left = self.params.n


class EngineLoop:
    """The engine thread. `stream(prompt, params)` (async) yields the request's tokens as they are sampled."""

    def __init__(self, make_batch: Callable[[], Batch], *, version: Callable[[], int] = lambda: 0,
                 before_step: Callable[[], None] | None = None):
        self.make_batch, self.version, self.before_step = make_batch, version, before_step
        self.batch = make_batch()
        self.stats = EngineStats()
        self._cond = threading.Condition()
        self._inbox: list[tuple[str, str, _Request | None]] = []
        self._live: dict[str, _Request] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ---- any thread -------------------------------------------------------------------------------------------
    def start(self) -> EngineLoop:
        self._thread = threading.Thread(target=self._run, name="tba-serve-engine", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """End the thread after its current step; requests still in flight get a RuntimeError."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, prompt: list[int], params: Params, sink: Callable[[list[Token] | BaseException], None]) -> str:
        """Queue a request; `sink` is called on the engine thread with each step's tokens of it, or an error."""
        rid = uuid.uuid4().hex
        with self._cond:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            self._inbox.append(("add", rid, _Request(list(prompt), params, sink)))
            self._cond.notify()
        return rid

    def cancel(self, rid: str) -> None:
        with self._cond:
            self._inbox.append(("cancel", rid, None))
            self._cond.notify()

    @property
    def in_flight(self) -> int:
        return len(self._live) + sum(op == "add" for op, _, _ in self._inbox)

    async def stream(self, prompt: list[int], params: Params) -> AsyncIterator[list[Token]]:
        """The request's tokens, one list per engine step, until all its samples have ended. Closing the iterator
        early (a timeout, a client gone) cancels the request in the batch."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def sink(item):
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop is closed: nobody waits any more
                pass

        rid = self.submit(prompt, params, sink)
        left = params.n
        try:
            while left:
                item = await queue.get()
                if isinstance(item, BaseException):
                    left = 0
                    raise item
                left -= sum(t.finish is not None for t in item)
                yield item
        finally:
            if left:
                self.cancel(rid)

    # ---- the engine thread ------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._inbox and not self._live and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    break
                inbox, self._inbox = self._inbox, []
            self._apply(inbox)
            if not self._live:
                continue
            try:
                if self.before_step is not None:
                    self.before_step()
                tokens = self.batch.step(self.version())
            except Exception as e:  # noqa: BLE001 — the server outlives a failed step; its requests get the error
                self._fail(e)
                continue
            self._deliver(tokens)
        with self._cond:  # requests queued but never admitted get the error too (else they wait for ever)
            queued, self._inbox = [r for op, _, r in self._inbox if op == "add"], []
        for request in queued:
            request.sink(ShuttingDown("the server is shutting down"))
        self._fail(ShuttingDown("the server is shutting down"), rebuild=False)

    def _apply(self, inbox) -> None:
        for op, rid, request in inbox:
            if op == "add":
                try:
                    self.batch.add(rid, request.prompt, request.params)
                except Exception as e:  # noqa: BLE001 — a request the batch refuses fails alone
                    request.sink(e)
                    continue
                self._live[rid] = request
                self.stats.requests += 1
            elif rid in self._live:
                self.batch.cancel(rid)
                del self._live[rid]

    def _deliver(self, tokens: list[Token]) -> None:
        self.stats.steps += 1
        self.stats.tokens += len(tokens)
        self.stats.max_active = max(self.stats.max_active, self.batch.active + sum(t.finish is not None
                                                                                   for t in tokens))
        by_request: dict[str, list[Token]] = {}
        for t in tokens:
            by_request.setdefault(t.rid, []).append(t)
        for rid, mine in by_request.items():
            request = self._live.get(rid)
            if request is None:
                continue
            request.left -= sum(t.finish is not None for t in mine)
            if request.left <= 0:
                del self._live[rid]
            request.sink(mine)

    def _fail(self, error: Exception, rebuild: bool = True) -> None:
        if self._live and rebuild:
            self.stats.errors += 1
            logger.error(f"tba serve: a decode step failed ({type(error).__name__}: {error}); "
                         f"{len(self._live)} request(s) in flight get the error, the batch is rebuilt")
        for request in self._live.values():
            request.sink(error)
        self._live.clear()
        if not rebuild:
            return
        try:
            self.batch = self.make_batch()
        except Exception as e:  # noqa: BLE001
            logger.error(f"tba serve: the batch could not be rebuilt ({type(e).__name__}: {e})")
