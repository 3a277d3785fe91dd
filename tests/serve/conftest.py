"""The endpoint's fixtures: a tiny byte-level tokenizer that can spell chat turns and tool calls, with a chat
template in the Hermes/Qwen style (tools in a system turn, calls as <tool_call> blocks, <eos> ending each turn), a
~20k-parameter model on it, and a running server over its hf sampler (bound to a free loopback port)."""

import httpx
import pytest
from scripted import MODEL

from tba.config.schema import TinyModelConfig
from tba.models.builtin import build_tiny_model, train_tokenizer

TEMPLATE = (
    "{%- if tools %}<|system|>tools: {% for t in tools %}{{ t.function.name }} {% endfor %}<eos>{% endif %}"
    "{%- for m in messages %}<|{{ m.role }}|>{% if m.content %}{{ m.content }}{% endif %}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{% endfor %}<eos>{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}")
CORPUS = ["<|user|>What is 12+34?<eos><|assistant|>46<eos>", "<|system|>tools: add <eos>",
          '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "Let me call a tool."]


@pytest.fixture(scope="session")
def chat_tokenizer(arith_task):
    tok = train_tokenizer(arith_task.corpus() + CORPUS * 20, 200)
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="session")
def chat_model(chat_tokenizer):
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return build_tiny_model(chat_tokenizer, cfg, seed=0).eval()


@pytest.fixture(scope="module")
def sampler(chat_model, chat_tokenizer):
    from tba.rollout.samplers.hf import HFSampler

    return HFSampler(chat_model, chat_tokenizer)


@pytest.fixture(scope="module")
def server(sampler, chat_tokenizer):
    from tba.serve.engine import EngineLoop
    from tba.serve.protocol import Limits
    from tba.serve.server import Server, batch_for

    engine = EngineLoop(batch_for(sampler, 8), version=lambda: 3)
    with Server(engine, chat_tokenizer, model_name=MODEL, limits=Limits(max_model_len=256, max_tokens=64,
                                                                        max_request_bytes=1 << 16)) as s:
        yield s


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=60) as c:
        yield c
