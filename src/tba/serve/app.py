"""The HTTP endpoint (FastAPI) in front of an engine loop: verifiers' token route, OpenAI's chat route, sessions.

    GET  /v1/models                    the one served model (verifiers' client asks for it)
    POST /inference/v1/generate        token ids in, token ids + log-probs out (vLLM's shape, verifiers' client)
    POST /v1/chat/completions          OpenAI chat completions, `stream` too, rendered with the policy's template
    GET|DELETE /tba/v1/sessions/{id}   the calls one episode made (tba.serve.sessions)
    GET  /health                       no token needed: {"status": "ok"}

Why each route awaits the engine rather than calling the sampler: requests in flight at once are rows of one
batch (tba.serve.engine), so concurrency costs no serialization. Every route but /health needs the bearer token
(401 otherwise, compared in constant time); bodies are bounded (413), fields checked (400 naming the field,
tba.serve.protocol), generations bounded in time (504, the request cancelled in the batch) and in number (429).
Every returned token carries the policy version that sampled it (`tba_versions`, one per token id).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from tba.serve import chat
from tba.serve.engine import EngineLoop, Params, ShuttingDown, Token
from tba.serve.protocol import APIError, ChatIn, GenerateIn, Limits, check_ids, params, parse
from tba.serve.sessions import Call, Sample, Sessions, as_json

logger = logging.getLogger(__name__)


@dataclass
class _Acc:
    """One sample's tokens as they arrive."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    tops: list = field(default_factory=list)
    finish: str | None = None

    def add(self, t: Token) -> None:
        if t.token >= 0:
            self.tokens.append(t.token)
            self.logprobs.append(t.logprob)
            self.versions.append(t.version)
            self.tops.append(t.top)
        self.finish = t.finish or self.finish

    def sample(self) -> Sample:
        return Sample(self.tokens, self.logprobs, self.versions, self.finish)


def _token_entry(t: int, lp: float) -> dict:
    return {"token": f"token_id:{t}", "token_id": t, "logprob": lp}


class Endpoint:
    """The app's state: what it serves and with which bounds."""

    def __init__(self, engine: EngineLoop, tokenizer, *, model_name: str, token: str, limits: Limits,
                 sessions: Sessions | None = None, tools: str | None = "auto"):
        self.engine, self.tokenizer, self.model_name, self.token = engine, tokenizer, model_name, token
        self.limits, self.sessions = limits, sessions or Sessions()
        self.tool_format = chat.tool_format(tokenizer) if tools == "auto" else tools
        self.vocab = len(tokenizer)
        self.in_flight = 0

    # ---- checks -------------------------------------------------------------------------------------------------
    def auth(self, request: Request) -> str | None:
        """The call's session (header, else API key suffix), or a 401."""
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        key, n = key.strip(), len(self.token)
        ok = (scheme.lower() == "bearer" and secrets.compare_digest(key[:n].encode(), self.token.encode())
              and (len(key) == n or key[n:n + 1] == "."))
        if not ok:
            raise APIError(401, "a bearer token is required: Authorization: Bearer <token> (tba serve prints it)",
                           type="authentication_error", code="invalid_api_key")
        session = request.headers.get("x-tba-session") or (key[n + 1:] if len(key) > n + 1 else None)
        return None if session is None else self.sessions.check(session)

    def model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(404, f"model {name!r} is not served here; this server serves {self.model_name!r} "
                           "(GET /v1/models)", "model", type="not_found_error", code="model_not_found")

    async def body(self, request: Request) -> bytes:
        limit = self.limits.max_request_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"the request body is {declared} bytes; the limit is {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"the request body is over the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    @contextlib.asynccontextmanager
    async def generation(self, prompt: list[int], p: Params):
        """The engine's token stream of one request, counted against max_in_flight, under the timeout."""
        if self.in_flight >= self.limits.max_in_flight:
            raise APIError(429, f"{self.in_flight} requests are generating, this server's limit; retry later",
                           type="rate_limit_error")
        self.in_flight += 1
        try:
            async with contextlib.aclosing(self.engine.stream(prompt, p)) as tokens:
                try:
                    async with asyncio.timeout(self.limits.timeout_s):
                        yield tokens
                except TimeoutError:
                    raise APIError(504, f"the generation did not end within {self.limits.timeout_s:g} s (the "
                                   "server's timeout); it was cancelled", type="timeout") from None
        finally:
            self.in_flight -= 1

    async def collect(self, prompt: list[int], p: Params) -> list[_Acc]:
        accs = [_Acc() for _ in range(p.n)]
        async with self.generation(prompt, p) as tokens:
            async for step in tokens:
                for t in step:
                    accs[t.index].add(t)
        return accs

    def usage(self, prompt: list[int], accs: list[_Acc]) -> dict:
        done = sum(len(a.tokens) for a in accs)
        return {"prompt_tokens": len(prompt), "completion_tokens": done, "total_tokens": len(prompt) + done}

    # ---- routes -----------------------------------------------------------------------------------------------
    async def models(self, request: Request):
        self.auth(request)
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "tba", "max_model_len": self.limits.max_model_len}]}

    async def generate(self, request: Request):
        session = self.auth(request)
        body: GenerateIn = parse(await self.body(request), GenerateIn, self.limits)
        self.model(body.model)
        if body.stream:
            raise APIError(400, "stream: not supported on /inference/v1/generate", "stream")
        check_ids(body.token_ids, self.vocab, "token_ids")
        sp = body.sampling_params
        p = params(prompt_len=len(body.token_ids), n=sp.n, temperature=sp.temperature, top_p=sp.top_p,
                   max_tokens=sp.max_tokens, stop_token_ids=sp.stop_token_ids, top_logprobs=sp.logprobs or 0,
                   limits=self.limits, vocab=self.vocab, prefix="sampling_params.", prompt_param="token_ids")
        self.sessions.room(session)
        accs = await self.collect(body.token_ids, p)
        self.sessions.record(session, Call("generate", list(body.token_ids), [a.sample() for a in accs]))
        choices = []
        for i, a in enumerate(accs):
            logprobs = None
            if sp.logprobs is not None:
                logprobs = {"content": [{**_token_entry(t, lp), "top_logprobs": [_token_entry(*x) for x in top or []]}
                                        for t, lp, top in zip(a.tokens, a.logprobs, a.tops, strict=True)]}
            choices.append({"index": i, "token_ids": a.tokens, "logprobs": logprobs, "finish_reason": a.finish,
                            "tba_versions": a.versions})
        return {"request_id": body.request_id or uuid.uuid4().hex, "model": self.model_name,
                "created": int(time.time()), "prompt_token_ids": list(body.token_ids), "choices": choices,
                "usage": self.usage(body.token_ids, accs), "tba_session": session}

    def chat_request(self, body: ChatIn) -> tuple[list[int], Params, bool]:
        self.model(body.model)
        if isinstance(body.tool_choice, dict) or body.tool_choice not in (None, "auto", "none"):
            raise APIError(400, f"tool_choice: only 'auto' and 'none' are supported (got {body.tool_choice!r})",
                           "tool_choice")
        if body.top_logprobs and not body.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs: true", "top_logprobs")
        tools = bool(body.tools) and body.tool_choice != "none" and self.tool_format == "hermes"
        prompt = chat.render(self.tokenizer, body.messages, tools=body.tools,
                             add_generation_prompt=body.add_generation_prompt,
                             template_kwargs=body.chat_template_kwargs)
        p = params(prompt_len=len(prompt), n=body.n, temperature=body.temperature, top_p=body.top_p,
                   max_tokens=body.max_completion_tokens or body.max_tokens, stop_token_ids=body.stop_token_ids,
                   top_logprobs=body.top_logprobs or 0, limits=self.limits, vocab=self.vocab,
                   prompt_param="messages")
        return prompt, p, tools

    async def chat_completions(self, request: Request):
        session = self.auth(request)
        body: ChatIn = parse(await self.body(request), ChatIn, self.limits)
        prompt, p, tools = self.chat_request(body)
        self.sessions.room(session)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.model_name}
        if body.stream:
            return StreamingResponse(self.chat_stream(body, prompt, p, tools, session, head),
                                     media_type="text/event-stream")
        accs = await self.collect(prompt, p)
        self.sessions.record(session, Call("chat", prompt, [a.sample() for a in accs]))
        choices = []
        for i, a in enumerate(accs):
            text = chat.response_text(self.tokenizer, a.tokens, a.finish)
            content, calls = chat.parse_tool_calls(text) if tools else (text, [])
            message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            choice = {"index": i, "message": message, "finish_reason": "tool_calls" if calls else a.finish,
                      "logprobs": self.logprobs(body, a.tokens, a.logprobs, a.tops), "tba_versions": a.versions}
            if body.return_token_ids:
                choice["token_ids"] = a.tokens
            choices.append(choice)
        out = {**head, "object": "chat.completion", "choices": choices, "usage": self.usage(prompt, accs),
               "tba_session": session}
        if body.return_token_ids:
            out["prompt_token_ids"] = prompt
        return out

    def logprobs(self, body: ChatIn, tokens, logprobs, tops) -> dict | None:
        if not body.logprobs:
            return None
        return {"content": chat.logprob_entries(self.tokenizer, tokens, logprobs, tops,
                                                body.return_tokens_as_token_ids)}

    async def chat_stream(self, body: ChatIn, prompt: list[int], p: Params, tools: bool, session, head):
        """Server-sent events: a role chunk, one chunk per engine step and sample, a usage chunk if asked for,
        then [DONE]. An error after the first chunk (a timeout, a failed step) arrives as an `error` event."""
        def event(obj: dict) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        base = {**head, "object": "chat.completion.chunk"}
        texts = [chat.TextStream(self.tokenizer, tools) for _ in range(p.n)]
        accs = [_Acc() for _ in range(p.n)]
        first = {**base, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None} for i in range(p.n)]}
        if body.return_token_ids:
            first["prompt_token_ids"] = prompt
        yield event(first)
        try:
            async with self.generation(prompt, p) as tokens:
                async for step in tokens:
                    for index in sorted({t.index for t in step}):
                        mine = [t for t in step if t.index == index and t.token >= 0]
                        for t in step:
                            if t.index == index:
                                accs[index].add(t)
                        yield event({**base, "choices": [self.chunk(body, index, mine, accs[index], texts[index])]})
        except APIError as e:
            yield event(e.body())
        except Exception as e:  # noqa: BLE001 — the stream says what went wrong; the server goes on
            yield event(APIError(500, f"{type(e).__name__}: {e}", type="server_error").body())
        else:
            self.sessions.record(session, Call("chat", prompt, [a.sample() for a in accs]))
            if (body.stream_options or {}).get("include_usage"):
                yield event({**base, "choices": [], "usage": self.usage(prompt, accs)})
        yield "data: [DONE]\n\n"

    def chunk(self, body: ChatIn, index: int, mine: list[Token], acc: _Acc, text: chat.TextStream) -> dict:
        finish = acc.finish
        said = [t.token for t in mine if not (t.finish == "stop")]  # the stop token is no text
        delta: dict = {}
        piece = text.push(said)
        calls: list[dict] = []
        if finish is not None:
            rest, calls = text.finish()
            piece += rest
        if piece:
            delta["content"] = piece
        if calls:
            delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(calls)]
        choice = {"index": index, "delta": delta, "finish_reason": ("tool_calls" if calls else finish),
                  "logprobs": self.logprobs(body, [t.token for t in mine], [t.logprob for t in mine],
                                            [t.top for t in mine]),
                  "tba_versions": [t.version for t in mine]}
        if body.return_token_ids:
            choice["token_ids"] = [t.token for t in mine]
        return choice

    async def session(self, request: Request, session: str):
        self.auth(request)
        calls = (self.sessions.pop if request.method == "DELETE" else self.sessions.get)(session)
        if calls is None:
            raise APIError(404, f"no session {session!r}", "session", type="not_found_error")
        return as_json(session, calls)


def create_app(endpoint: Endpoint) -> FastAPI:
    app = FastAPI(title="tba serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.endpoint = endpoint

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        return JSONResponse(APIError(e.status_code, str(e.detail)).body(), status_code=e.status_code)

    @app.exception_handler(ShuttingDown)
    async def shutting_down(request: Request, e: ShuttingDown):
        return JSONResponse(APIError(503, str(e), type="server_error").body(), status_code=503)

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception):
        logger.exception("tba serve: a request failed")
        return JSONResponse(APIError(500, f"{type(e).__name__}: {e}", type="server_error").body(), status_code=500)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    app.add_api_route("/v1/models", endpoint.models, methods=["GET"])
    app.add_api_route("/inference/v1/generate", endpoint.generate, methods=["POST"])
    app.add_api_route("/v1/chat/completions", endpoint.chat_completions, methods=["POST"])
    app.add_api_route("/tba/v1/sessions/{session}", endpoint.session, methods=["GET", "DELETE"])
    return app
