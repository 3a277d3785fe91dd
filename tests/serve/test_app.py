"""The endpoint over HTTP, against a running server on the tiny chat model's hf sampler: verifiers' token route
token-exact against the sampler, chat completions with the template's ids, streaming equal to non-streaming, the
`openai` client, auth, bounds, sessions, concurrency, and a bounded fuzz."""

import asyncio
import json
import random

import httpx
import pytest
import torch
from scripted import MODEL, Scripted

from tba.serve.engine import EngineLoop
from tba.serve.protocol import Limits
from tba.serve.server import Server

CHAT = [{"role": "user", "content": "What is 12+34?"}]


def test_models_and_auth(server, client):
    assert client.get("/v1/models").json()["data"][0]["id"] == MODEL
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {server.token}"},
                    {"Authorization": f"Bearer {server.token}x"}):
        r = httpx.post(server.url + "/inference/v1/generate", headers=headers, json={"model": MODEL, "token_ids": [1]})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_generate_is_the_samplers_draw_in_verifiers_shape(client, sampler, chat_tokenizer):
    prompt = chat_tokenizer.encode("12+34=")
    torch.manual_seed(11)
    ((ref, ref_lp),) = sampler.generate([prompt], num_samples=1, temperature=0.8, top_p=1.0, max_new_tokens=16)
    torch.manual_seed(11)
    r = client.post("/inference/v1/generate", json={
        "model": MODEL, "token_ids": prompt,
        "sampling_params": {"temperature": 0.8, "max_tokens": 16, "logprobs": 1, "stop_token_ids": []}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["token_ids"] == ref and r.json()["prompt_token_ids"] == prompt
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in ref]
    assert [c["logprob"] for c in content] == pytest.approx(ref_lp, abs=1e-5)
    assert choice["tba_versions"] == [3] * len(ref) and len(content[0]["top_logprobs"]) == 1


def test_chat_returns_the_templates_ids_and_streams_the_same_text(client, chat_tokenizer):
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 24, "temperature": 0, "return_token_ids": True,
            "logprobs": True, "top_logprobs": 2}
    out = client.post("/v1/chat/completions", json=body).json()
    want = chat_tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert out["prompt_token_ids"] == list(want)
    choice = out["choices"][0]
    ids = choice["token_ids"]
    text_ids = ids[:-1] if choice["finish_reason"] == "stop" else ids
    assert choice["message"]["content"] == chat_tokenizer.decode(text_ids)
    assert len(choice["logprobs"]["content"]) == len(ids) == len(choice["tba_versions"])
    assert out["usage"]["completion_tokens"] == len(ids)
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True,
                                                              "stream_options": {"include_usage": True}}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    chunks = [c["choices"][0] for c in events if c["choices"]]
    assert "".join(c["delta"].get("content") or "" for c in chunks) == choice["message"]["content"]
    assert [t for c in chunks for t in c.get("token_ids", [])] == ids
    assert chunks[-1]["finish_reason"] == choice["finish_reason"] and events[-1]["usage"] == out["usage"]
    assert events[0]["prompt_token_ids"] == list(want)


def test_the_openai_client(server, chat_tokenizer):
    openai = pytest.importorskip("openai")
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=server.token + ".episode-7", max_retries=0)
    done = api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0, logprobs=True,
                                       extra_body={"return_token_ids": True})
    choice = done.choices[0]
    assert choice.logprobs.content and choice.model_extra["token_ids"]
    stream = api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == choice.message.content
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="gpt-5", messages=CHAT)
    session = httpx.get(f"{server.url}/tba/v1/sessions/episode-7",
                        headers={"Authorization": f"Bearer {server.token}"}).json()
    assert len(session["calls"]) == 2 and session["calls"][0]["samples"][0]["token_ids"] == \
        choice.model_extra["token_ids"]


def test_sessions_by_header(client):
    for _ in range(2):
        client.post("/inference/v1/generate", headers={"X-TBA-Session": "s1"},
                    json={"model": MODEL, "token_ids": [1, 5], "sampling_params": {"max_tokens": 3}})
    calls = client.delete("/tba/v1/sessions/s1").json()["calls"]
    assert [c["kind"] for c in calls] == ["generate"] * 2 and calls[0]["prompt_token_ids"] == [1, 5]
    assert client.get("/tba/v1/sessions/s1").status_code == 404


@pytest.mark.parametrize("body,status,param", [
    ({"model": MODEL, "messages": CHAT, "max_tokens": 65}, 400, "max_tokens"),
    ({"model": MODEL, "messages": CHAT, "top_k": 3}, 400, "top_k"),
    ({"model": MODEL, "messages": CHAT, "tool_choice": "required"}, 400, "tool_choice"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "1" * 300}]}, 400, "messages"),
    ({"model": MODEL, "messages": "hi"}, 400, "messages"),
    ({"model": "other", "messages": CHAT}, 404, "model"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x" * 70000}]}, 413, None),
])
def test_bad_requests_are_4xx_naming_the_field(client, body, status, param):
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text


def test_generate_bounds(client):
    r = client.post("/inference/v1/generate", json={"model": MODEL, "token_ids": [1, 9999]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "token_ids"
    r = client.post("/inference/v1/generate", json={"model": MODEL, "token_ids": [1],
                                                    "sampling_params": {"max_tokens": 100}})
    assert r.status_code == 400 and "sampling_params.max_tokens" in r.json()["error"]["message"]


def test_concurrent_requests_share_the_batch(server):
    before = server.engine.stats.max_active
    server.engine.stats.max_active = 0

    async def main():
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"},
                                     timeout=60) as c:
            return await asyncio.gather(*(c.post("/inference/v1/generate", json={
                "model": MODEL, "token_ids": [1, 5 + i], "sampling_params": {"max_tokens": 40}}) for i in range(6)))

    results = asyncio.run(main())
    assert [r.status_code for r in results] == [200] * 6
    assert server.engine.stats.max_active > 1  # several requests were rows of one forward
    server.engine.stats.max_active = max(before, server.engine.stats.max_active)


def _scripted_server(tokenizer, text, **limits):
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return Server(EngineLoop(lambda: Scripted(ids, delay=limits.pop("delay", 0.0))), tokenizer, model_name=MODEL,
                  limits=Limits(max_model_len=256, max_tokens=64, **limits)).start()


def test_tool_calls_streamed_and_not(chat_tokenizer):
    text = 'Let me call a tool.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    body = {"model": MODEL, "messages": CHAT, "tools": tools}
    with _scripted_server(chat_tokenizer, text) as s, httpx.Client(
            base_url=s.url, headers={"Authorization": f"Bearer {s.token}"}) as c:
        choice = c.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me call a tool."
        call = choice["message"]["tool_calls"][0]["function"]
        assert call["name"] == "add" and json.loads(call["arguments"]) == {"a": 1, "b": 2}
        with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            chunks = [json.loads(x[6:])["choices"][0] for x in r.iter_lines() if x.startswith("data: {")]
        assert "".join(ch["delta"].get("content") or "" for ch in chunks) == "Let me call a tool."
        streamed = [t for ch in chunks for t in ch["delta"].get("tool_calls", [])]
        assert [t["function"] for t in streamed] == [call] and chunks[-1]["finish_reason"] == "tool_calls"
        plain = c.post("/v1/chat/completions", json={**body, "tool_choice": "none"}).json()["choices"][0]
        assert plain["message"]["content"] == text and "tool_calls" not in plain["message"]


def test_a_generation_past_the_timeout_is_504_and_cancelled(chat_tokenizer):
    with _scripted_server(chat_tokenizer, "1" * 60, timeout_s=0.3, delay=0.05) as s:
        r = httpx.post(s.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {s.token}"},
                       json={"model": MODEL, "messages": CHAT})
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
        assert s.endpoint.in_flight == 0


def test_a_bounded_fuzz_never_gets_a_5xx(server, client):
    rng = random.Random(0)
    atoms = [None, True, -1, 0, 3.5, 10**12, "", "x" * 50, [], {}, [1, 2], {"a": 1}, MODEL, [{"role": "user"}]]
    keys = ["model", "token_ids", "sampling_params", "messages", "max_tokens", "n", "temperature", "top_p",
            "logprobs", "top_logprobs", "stream", "tools", "stop_token_ids", "return_token_ids"]
    for i in range(60):
        route = rng.choice(["/inference/v1/generate", "/v1/chat/completions"])
        body = {"model": MODEL, "token_ids": [1, 2], "messages": CHAT, "max_tokens": 2,
                "sampling_params": {"max_tokens": 2}}
        for k in rng.sample(keys, rng.randint(1, 4)):
            body[k] = rng.choice(atoms)
        raw = json.dumps(body).encode() if i % 7 else bytes(rng.randrange(256) for _ in range(40))
        r = client.post(route, content=raw)
        assert r.status_code < 500, (body, r.text)
        assert "error" in r.json() or r.status_code == 200
    assert client.get("/v1/models").status_code == 200
