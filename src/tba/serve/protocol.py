"""What the endpoint accepts: request bodies, their limits, and the one shape every refusal has.

Why strict: a client's sampling setting that is silently ignored changes the distribution its tokens come from,
and a trainer that later reads those tokens' log-probs as the behaviour policy's would be wrong without knowing.
So a setting tba does not honour (top_k, min_p, penalties, logit_bias, stop strings, …) is refused with a 400
naming it, unless it has its neutral value; unknown extra fields are ignored, as OpenAI's SDKs send a few.
Every refusal is OpenAI's error object, `{"error": {"message", "type", "param", "code"}}`, with `param` the
offending field's dotted path (`sampling_params.max_tokens`, `messages.0.content`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tba.serve.engine import Params


@dataclass(frozen=True)
class Limits:
    """Bounds on one request (`tba serve --help` sets them)."""

    max_model_len: int
    """Prompt + max_tokens at most."""
    max_tokens: int = 4096
    """The most new tokens a request may ask for; a request that asks for none gets what fits, up to this."""
    max_request_bytes: int = 4 << 20
    max_n: int = 16
    max_top_logprobs: int = 20
    max_stop_token_ids: int = 64
    timeout_s: float = 600.0
    """Every generation ends within this (504 after it, the request cancelled in the batch)."""
    max_in_flight: int = 256
    """Requests generating at once; more are refused with 429."""


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, type: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


UNSUPPORTED = {"top_k": (None, 0, -1), "min_p": (None, 0, 0.0), "repetition_penalty": (None, 1, 1.0),
               "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "min_tokens": (None, 0),
               "logit_bias": (None, {}), "stop": (None, [], ""), "best_of": (None, 1), "ignore_eos": (None, False),
               "prompt_logprobs": (None, 0), "bad_words": (None, []), "allowed_token_ids": (None,),
               "guided_json": (None,), "response_format": (None, {"type": "text"}), "echo": (None, False)}
"""Settings tba does not honour → the values that mean "off" (any other value is refused)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow")

    def refuse_unsupported(self, prefix: str = "") -> None:
        for name, neutral in UNSUPPORTED.items():
            value = (self.model_extra or {}).get(name)
            if value not in neutral:
                raise APIError(400, f"{prefix}{name}: not supported by tba's endpoint (got {value!r}); "
                               f"docs/serve.md lists what is", f"{prefix}{name}")


class SamplingIn(_Strict):
    """vLLM's sampling_params, the part verifiers' training client sends."""

    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    stop_token_ids: list[int] | None = None
    logprobs: int | None = Field(None, ge=0)
    seed: int | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    detokenize: bool | None = None


class GenerateIn(_Strict):
    model: str
    token_ids: list[int] = Field(min_length=1)
    sampling_params: SamplingIn = Field(default_factory=SamplingIn)
    stream: bool = False
    request_id: str | None = None


class ChatIn(_Strict):
    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    stop_token_ids: list[int] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    seed: int | None = None
    user: str | None = None
    parallel_tool_calls: bool | None = None


def parse(raw: bytes, model: type[BaseModel], limits: Limits) -> Any:
    """The validated body, or an APIError: 413 past max_request_bytes, 400 for bad JSON or a bad field."""
    if len(raw) > limits.max_request_bytes:
        raise APIError(413, f"the request body is {len(raw)} bytes; the limit is {limits.max_request_bytes}")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the body is not JSON: {e}") from None
    try:
        body = model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(x) for x in first["loc"]) or None
        raise APIError(400, f"{param}: {first['msg']}" if param else first["msg"], param) from None
    body.refuse_unsupported()
    if isinstance(body, GenerateIn):
        body.sampling_params.refuse_unsupported("sampling_params.")
    return body


def check_ids(ids: list[int], vocab: int, param: str) -> None:
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"{param}: token id {bad} is outside the vocabulary (0 … {vocab - 1})", param)


def params(*, prompt_len: int, n: int, temperature: float, top_p: float, max_tokens: int | None,
           stop_token_ids: list[int] | None, top_logprobs: int, limits: Limits, vocab: int, prefix: str = "",
           prompt_param: str) -> Params:
    """The engine's settings of one request, every bound checked (400 naming the field)."""
    room = limits.max_model_len - prompt_len
    if room < 1:
        raise APIError(400, f"{prompt_param}: the prompt is {prompt_len} tokens; the model's limit is "
                       f"{limits.max_model_len} (prompt + max_tokens)", prompt_param)
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise APIError(400, f"{prefix}max_tokens: {max_tokens} is more than this server's limit of "
                       f"{limits.max_tokens}", f"{prefix}max_tokens")
    if max_tokens is not None and max_tokens > room:
        raise APIError(400, f"{prefix}max_tokens: the prompt is {prompt_len} tokens, so at most {room} new tokens "
                       f"fit the model's {limits.max_model_len}; asked for {max_tokens}", f"{prefix}max_tokens")
    if n > limits.max_n:
        raise APIError(400, f"{prefix}n: at most {limits.max_n} samples per request", f"{prefix}n")
    if top_logprobs > limits.max_top_logprobs:
        raise APIError(400, f"{prefix}{'logprobs' if prefix else 'top_logprobs'}: at most "
                       f"{limits.max_top_logprobs}", f"{prefix}{'logprobs' if prefix else 'top_logprobs'}")
    stop = list(stop_token_ids or [])
    if len(stop) > limits.max_stop_token_ids:
        raise APIError(400, f"{prefix}stop_token_ids: at most {limits.max_stop_token_ids}", f"{prefix}stop_token_ids")
    check_ids(stop, vocab, f"{prefix}stop_token_ids")
    return Params(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens or min(room, limits.max_tokens),
                  stop_token_ids=frozenset(stop), top_logprobs=top_logprobs)
