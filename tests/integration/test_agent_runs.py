"""task.name=agent end to end: an agent written only against the `openai` client trains the tiny chat model through
real runs — inline (what the buffer stores is what the endpoint served to the agent, token for token, with the
policy's mask) and local (searcher processes, each with its own endpoint) — and nothing keeps running after."""

import json
import threading

import pytest
from paths import TESTS, TINY

from tba.algorithm.store import BufferStore
from tba.cli import main
from tba.config.schema import TinyModelConfig
from tba.models import save_checkpoint
from tba.models.builtin import build_tiny_model, train_tokenizer
from tba.plugins import load_object

pytest.importorskip("openai")
AGENTS = TESTS / "serve" / "openai_agents.py"
TEMPLATE = (  # tests/serve/conftest.py's: Hermes-style tools, <eos> ending each turn
    "{%- if tools %}<|system|>tools: {% for t in tools %}{{ t.function.name }} {% endfor %}<eos>{% endif %}"
    "{%- for m in messages %}<|{{ m.role }}|>{% if m.content %}{{ m.content }}{% endif %}<eos>{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, arith_task):
    root = tmp_path_factory.mktemp("agent")
    tok = train_tokenizer(arith_task.corpus() + ["<|user|>What is 12+34?<eos><|assistant|>46<eos>"] * 20, 200)
    tok.chat_template = TEMPLATE
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    save_checkpoint(build_tiny_model(tok, cfg, seed=0), tok, root / "model")
    rows = [{"prompt": f"What is {a}+{b}?", "a": a, "b": b} for a in range(10) for b in range(6)]
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def train(setup, name, *overrides):
    out = setup / name
    code = main(["train", TINY, f"output_dir={out}", f"model.policy={setup / 'model'}", "task.name=agent",
                 f"task.options.agent={AGENTS}:tool_agent", f"task.options.source={setup / 'rows.jsonl'}",
                 "task.test_size=4", "trainer.steps=4", "eval.every_steps=4", *overrides])
    assert code == 0
    return out, json.loads((out / "summary.json").read_text())


def test_inline_run_stores_what_was_served(setup):
    served = load_object(f"{AGENTS}:SERVED", "test")
    served.clear()
    out, summary = train(setup, "inline", "runtime=inline", "mode=sync")
    assert summary["trainer_steps"] == 4 and summary["eval_end"]["agent/calls_mean"] == 3.0
    assert summary["episodes_ended"]["done"] >= 12 and summary["episodes_ended"]["error"] == 0
    calls = [c for episode in served.values() for c in episode]
    store = BufferStore(out / "buffer.sqlite", readonly=True)
    stored = [(g, x) for _, _, g in store.iter_groups() for x in g.samples]
    store.close()
    assert stored
    for g, x in stored:
        ids = g.prompt_tokens + x.response
        assert len(x.policy_mask) == len(x.response) and x.behaviour_logprobs
        at = 0
        for start, end in spans(x.policy_mask, len(g.prompt_tokens)):
            # each sampled span is one call's response, served after exactly the ids before it
            assert any(c["prompt"] == ids[:start] and c["tokens"] == ids[start:end] for c in calls)
            at = end
        assert ids[at:] == []  # a sample ends with the policy's last sampled token
    assert not [t for t in threading.enumerate() if t.name.startswith(("tba-agent", "tba-serve"))]


def spans(mask, offset):
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((offset + start, offset + i))
            start = None
    return out


def test_local_run_trains_with_an_endpoint_per_searcher(setup):
    _, summary = train(setup, "local", "runtime=local")
    assert summary["trainer_steps"] == 4 and summary["samples_received"] > 0
    assert summary["episodes_ended"]["done"] >= 6 and summary["eval_end"]["episode/ended_done"] == 1.0
