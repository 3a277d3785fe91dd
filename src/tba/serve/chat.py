"""Chat completions' text side: messages → prompt ids with the policy's own chat template, sampled ids → text,
tool calls read back in the model's own format.

Why the server renders: an agent harness speaks messages, but training needs the ids the policy saw. Rendering
here, with the tokenizer the policy trains with, and returning those ids (`return_token_ids`) lets a harness — or
tba's own episode stitching — keep the exact tokens instead of re-tokenizing text later (re-rendering matched the
engine on 0 of 28 turns in OpenEnv's own test; docs/serve.md).

Tool calls: a template that writes calls as Hermes/Qwen `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
blocks (it mentions `<tool_call>`) gets them parsed into OpenAI `tool_calls`; the content is the text before the
first block, as vLLM's `hermes` parser does. A block that is not JSON leaves the whole text as content. Other
templates get their text back as content, unparsed. When streaming, text that may be the start of a block is held
back until it is known not to be one, so the streamed pieces add up to the non-streamed content exactly.
"""

from __future__ import annotations

import json
import uuid

from tba.serve.protocol import APIError

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def tool_format(tokenizer) -> str | None:
    """"hermes" when the chat template writes tool calls as <tool_call> blocks, else None (not parsed)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    return "hermes" if OPEN in template else None


def _message(m: dict, i: int) -> dict:
    """An OpenAI message as HF templates read it: text parts joined, tool-call arguments as objects."""
    m = dict(m)
    if not isinstance(m.get("role"), str):
        raise APIError(400, f"messages.{i}.role: a message needs a role", f"messages.{i}.role")
    content = m.get("content")
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, f"messages.{i}.content.{j}: only text parts are supported",
                               f"messages.{i}.content.{j}")
            parts.append(part["text"])
        m["content"] = "".join(parts)
    elif content is not None and not isinstance(content, str):
        raise APIError(400, f"messages.{i}.content: a string or a list of text parts", f"messages.{i}.content")
    calls = m.get("tool_calls")
    if calls:
        fixed = []
        for call in calls:
            call = dict(call)
            fn = dict(call.get("function") or {})
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except json.JSONDecodeError:
                    raise APIError(400, f"messages.{i}.tool_calls: arguments are not JSON",
                                   f"messages.{i}.tool_calls") from None
            call["function"] = fn
            fixed.append(call)
        m["tool_calls"] = fixed
    return m


def render(tokenizer, messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt: bool = True,
           template_kwargs: dict | None = None) -> list[int]:
    """The prompt ids of `messages` under the tokenizer's chat template (what `apply_chat_template` gives)."""
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(400, "messages: the policy's tokenizer has no chat template; send token ids to "
                       "/inference/v1/generate instead", "messages")
    msgs = [_message(m, i) for i, m in enumerate(messages)]
    try:
        ids = tokenizer.apply_chat_template(msgs, tools=tools or None, add_generation_prompt=add_generation_prompt,
                                            tokenize=True, return_dict=False, **(template_kwargs or {}))
    except Exception as e:  # noqa: BLE001 — a template error (jinja, a missing key) is the request's
        raise APIError(400, f"messages: the chat template cannot render them ({type(e).__name__}: {e})",
                       "messages") from None
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def response_text(tokenizer, ids: list[int], finish: str | None) -> str:
    """The text of a response: its ids decoded, without the stop token that ended it."""
    if finish == "stop" and ids:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False) if ids else ""


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, OpenAI tool_calls) of a Hermes-format response; no calls → (text, [])."""
    if OPEN not in text:
        return text, []
    calls = []
    for chunk in text.split(OPEN)[1:]:
        body = chunk.split(CLOSE, 1)[0].strip()
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        args = call.get("arguments", {})
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args)}})
    content = text[:text.index(OPEN)]
    return content or None, calls


class TextStream:
    """Sampled ids → the text they add, as they come: a piece is released once it decodes to whole characters
    (a byte-level token may end mid-character) and, when tool calls are parsed, once it cannot be the start of a
    `<tool_call>` block. `finish` gives what was held back, or the tool calls."""

    def __init__(self, tokenizer, tools: bool):
        self.tokenizer, self.tools = tokenizer, tools
        self.ids: list[int] = []
        self.sent = 0
        """Characters of the decoded text released so far."""
        self.in_call = False

    def push(self, ids: list[int]) -> str:
        self.ids += ids
        text = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        if text.endswith("\ufffd"):
            return ""
        end = len(text)
        if self.tools:
            at = text.find(OPEN, self.sent)
            if at >= 0:
                self.in_call, end = True, at
            elif not self.in_call:
                end = len(text) - _partial(text, OPEN)
            else:
                end = self.sent
        piece = text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece

    def finish(self) -> tuple[str, list[dict]]:
        """(the rest of the content, tool calls) once the response has ended (its stop token never pushed)."""
        text = response_text(self.tokenizer, self.ids, None)
        calls: list[dict] = []
        if self.tools:
            content, calls = parse_tool_calls(text)
            text = content or ""
        return text[self.sent:] if len(text) > self.sent else "", calls


def _partial(text: str, tag: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def logprob_entries(tokenizer, tokens: list[int], logprobs: list[float], tops: list | None, as_ids: bool) -> list:
    """OpenAI's `logprobs.content`: one entry per sampled token (the stop token included, as token_ids)."""
    def piece(t: int) -> dict:
        text = f"token_id:{t}" if as_ids else tokenizer.decode([t], skip_special_tokens=False)
        return {"token": text, "bytes": None if as_ids else list(text.encode("utf-8"))}

    out = []
    for i, (t, lp) in enumerate(zip(tokens, logprobs, strict=True)):
        top = (tops[i] if tops else None) or []
        out.append({**piece(t), "logprob": lp, "top_logprobs": [{**piece(a), "logprob": b} for a, b in top]})
    return out
