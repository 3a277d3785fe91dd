"""Sessions: the calls of one episode, kept in the order they were served, token-exact.

Why: a harness that speaks only chat completions makes several calls per episode, and each call's prompt is the
chat template's rendering of the whole conversation so far. Training needs one trajectory per episode, which is
rebuilt by prefix extension — a call extends the previous one when its prompt ids start with the previous prompt
ids plus the previous response ids (ART's and OpenEnv's capture proxy's rule). Only the server knows the exact ids
it rendered and sampled, so it records them per session; the agent task's episodes (tba.serve.agents) read
`Sessions.pop(session)` when an episode ends and stitch them (tba.serve.stitch), and `GET /tba/v1/sessions/{id}`
shows the same to a person.

A call names its session with the `X-TBA-Session` header, or by the API key's suffix (`<token>.<session>`), so a
harness that can only set an API key still separates its episodes. Calls without a session are not recorded.
Memory is bounded: the oldest session is dropped past `max_sessions`, a session refuses calls past `max_calls`.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

from tba.serve.protocol import APIError

SESSION = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    """The policy version that sampled each token."""
    finish_reason: str | None


@dataclass
class Call:
    kind: str
    """"chat" or "generate"."""
    prompt_token_ids: list[int]
    samples: list[Sample]
    created: float = field(default_factory=time.time)


def extends(previous: Call, call: Call, index: int = 0) -> bool:
    """Whether `call`'s prompt is `previous`'s prompt and its sample `index`'s response, then more."""
    done = previous.prompt_token_ids + previous.samples[index].token_ids
    return call.prompt_token_ids[:len(done)] == done


class Sessions:
    def __init__(self, max_sessions: int = 4096, max_calls: int = 1024):
        self.max_sessions, self.max_calls = max_sessions, max_calls
        self._calls: OrderedDict[str, list[Call]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def check(session: str) -> str:
        if not SESSION.match(session):
            raise APIError(400, "X-TBA-Session: 1-128 characters of letters, digits and _ . : -", "X-TBA-Session")
        return session

    def room(self, session: str | None) -> None:
        """Refuse (400) a call a full session could not record, before it is generated."""
        if session is not None and len(self._calls.get(session, ())) >= self.max_calls:
            raise APIError(400, f"session {session!r} holds {self.max_calls} calls, the limit; end it "
                           f"(DELETE /tba/v1/sessions/{session}) or start another", "X-TBA-Session")

    def record(self, session: str | None, call: Call) -> None:
        if session is None:
            return
        with self._lock:
            calls = self._calls.setdefault(session, [])
            self._calls.move_to_end(session)
            calls.append(call)
            while len(self._calls) > self.max_sessions:
                self._calls.popitem(last=False)

    def get(self, session: str) -> list[Call] | None:
        with self._lock:
            calls = self._calls.get(session)
            return None if calls is None else list(calls)

    def pop(self, session: str) -> list[Call] | None:
        with self._lock:
            return self._calls.pop(session, None)

    def __len__(self) -> int:
        return len(self._calls)


def as_json(session: str, calls: list[Call]) -> dict:
    return {"session": session, "calls": [asdict(c) for c in calls]}
