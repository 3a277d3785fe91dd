"""Agents written only against the `openai` client, as a user writes them for task.name=agent (tba.tasks.agent):
several calls per episode, each result of a tool appended as a `tool` message. `SERVED` records what the endpoint
returned to each episode (its session: the API key's suffix), so a test can compare it with what was stored."""

import threading
import time

import openai

SERVED: dict[str, list[dict]] = {}
RELEASE = threading.Event()
"""Set to let a hanging agent go (a test's cleanup)."""
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


def _call(client, model, messages, api_key):
    r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=6, logprobs=True,
                                       extra_body={"return_token_ids": True})
    choice = r.choices[0]
    SERVED.setdefault(api_key.rsplit(".", 1)[1], []).append({
        "prompt": r.model_extra["prompt_token_ids"], "tokens": choice.model_extra["token_ids"],
        "logprobs": [c.logprob for c in choice.logprobs.content], "versions": choice.model_extra["tba_versions"]})
    return choice.message


def tool_agent(row, base_url, api_key, model):
    """Three calls; after each answer the tool's result (the row's sum) comes back as a tool message."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(3):
        message = _call(client, model, messages, api_key)
        messages.append({"role": "assistant", "content": message.content or ""})
        messages.append({"role": "tool", "content": str(row["a"] + row["b"])})
    return float(str(row["a"] + row["b"]) in (message.content or ""))


def editing_agent(row, base_url, api_key, model):
    """Its second call rewrites the history (the first answer replaced): it does not extend the first."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": row["prompt"]}]
    _call(client, model, messages, api_key)
    _call(client, model, [*messages, {"role": "assistant", "content": "12"}, {"role": "user", "content": "sure?"}],
          api_key)
    return 0.5


def hanging_agent(row, base_url, api_key, model):
    """One call, then it hangs on every other row."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    _call(client, model, [{"role": "user", "content": row["prompt"]}], api_key)
    if row["a"] % 2:
        RELEASE.wait(60)
        time.sleep(0.1)
    return 1.0


def raising_agent(row, base_url, api_key, model):
    """Raises on every other row."""
    if row["a"] % 2:
        raise ValueError(f"no tool for {row['a']}")
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    _call(client, model, [{"role": "user", "content": row["prompt"]}], api_key)
    return 1.0


def rows(n=24):
    return [{"prompt": f"What is {a}+{b}?", "a": a, "b": b} for a in range(n // 3) for b in range(3)]
