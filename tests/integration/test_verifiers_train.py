"""task.name=verifiers:<env id> end to end: envkit's two verifiers v1 tasksets (single- and two-turn, written as
verifiers' docs say: tests/fixtures/vf_envs) run through `vf.load_environment` and verifiers' own training client
behind tba's endpoint, in a real `tba train` run (inline), on a tiny model and on SmolLM2-135M-Instruct with its own
chat template: what the buffer stores is what the endpoint served, its policy mask is verifiers' `sampled_mask`, and
the trainer's log π of it is the served behaviour log-probs.

verifiers' `null` harness prepares its chat program with `uv sync --script` (uv and the script's dependencies from
the package registries, once per machine): these tests need those registries the first time."""

import json

import pytest
import torch
from paths import FIXTURES, SMOLLM2, TINY, needs_smollm2

from tba.algorithm.store import BufferStore
from tba.cli import main
from tba.config.schema import TinyModelConfig
from tba.models import load_model, save_checkpoint
from tba.models.builtin import build_tiny_model, train_tokenizer
from tba.models.logprobs import grouped_logprobs
from tba.tasks.verifiers import VerifiersTask, served_calls

pytest.importorskip("verifiers")
pytestmark = pytest.mark.slow
TEMPLATE = ("{%- for m in messages %}<|{{ m.role }}|>{% if m.content %}{{ m.content }}{% endif %}<eos>{% endfor %}"
            "{%- if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module", params=["tiny", pytest.param("smollm2", marks=needs_smollm2)])
def model_dir(request, tmp_path_factory, arith_task):
    """A tiny model with a chat template of its own, and SmolLM2-135M-Instruct with its real one."""
    if request.param == "smollm2":
        return SMOLLM2
    root = tmp_path_factory.mktemp("vf")
    tok = train_tokenizer(arith_task.corpus() + ["<|user|>What is 12+34?<eos><|assistant|>46<eos>"] * 20, 200)
    tok.chat_template = TEMPLATE
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    save_checkpoint(build_tiny_model(tok, cfg, seed=0), tok, root / "model")
    return root / "model"


@pytest.fixture
def tasksets(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES / "vf_envs"))


@pytest.fixture
def seen(monkeypatch):
    """Every episode's branches and the calls the endpoint recorded for it, as the task read them."""
    out = []
    run = VerifiersTask.run_agent

    def recording(self, prompt, *, base_url, api_key, model):
        trace = run(self, prompt, base_url=base_url, api_key=api_key, model=model)
        out.append(([(list(b.token_ids), [int(m) for m in b.sampled_mask], list(b.logprobs))
                     for b in trace.branches], served_calls(base_url, api_key)))
        return trace

    monkeypatch.setattr(VerifiersTask, "run_agent", recording)
    return out


@pytest.mark.parametrize("env_id, calls, options", [
    ("tiny_add", 1, ["task.options.env={taskset: {num_tasks: 20}}"]),
    ("tiny_multi", 2, ["task.test_size=1"]),
])
def test_the_buffer_holds_what_the_endpoint_served(tmp_path, model_dir, tasksets, seen, env_id, calls, options):
    out = tmp_path / "run"
    code = main(["train", TINY, f"output_dir={out}", f"model.policy={model_dir}", f"task.name=verifiers:{env_id}",
                 "runtime=inline", "mode=sync", "trainer.steps=2", "eval.every_steps=2", "search.max_new_tokens=8",
                 "task.options.sampling={max_tokens: 8}", *options])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 2 and summary["episodes_ended"]["error"] == 0
    assert summary["eval_end"]["agent/calls_mean"] == calls
    branches = {tuple(ids): (mask, lps) for bs, _ in seen for ids, mask, lps in bs}
    single = {tuple(bs[0][0]) for bs, _ in seen if len(bs) == 1}  # turn 2 extended turn 1: one branch
    assert len(single) >= len(seen) // 2  # (a tiny random model sometimes writes what breaks the extension)
    served = {tuple(c["prompt_token_ids"] + c["samples"][0]["token_ids"]) for _, cs in seen for c in cs}
    store = BufferStore(out / "buffer.sqlite", readonly=True)
    groups = [g for _, _, g in store.iter_groups()]
    store.close()
    assert groups and all(len({x.version for x in g.samples}) >= 1 for g in groups)
    policy = load_model(str(model_dir), "float32").eval()
    checked = 0
    for g in groups:
        for x in g.samples:
            ids = g.prompt_tokens + x.response
            mask, lps = branches[tuple(ids)]  # the buffer's ids are a branch verifiers built, whole
            assert tuple(ids) in served  # … and end with a call the endpoint served
            head = len(g.prompt_tokens)
            assert x.policy_mask == mask[head:] and not any(mask[:head])
            assert x.behaviour_logprobs == pytest.approx(lps[head:], abs=1e-6)
            if x.version == 0 and not x.versions:  # sampled by the saved start: the trainer's log π of it
                with torch.no_grad():
                    logp, _ = grouped_logprobs(policy, [g.prompt_tokens], [x.response], [1], 1.0, 0)
                got = [v for v, m in zip(logp[0, :len(x.response)].tolist(), x.policy_mask, strict=True) if m]
                want = [v for v, m in zip(x.behaviour_logprobs, x.policy_mask, strict=True) if m]
                assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-4
                checked += 1
    assert checked >= 4
    if calls == 2:  # a one-branch episode's sample: two policy spans, the scripted user's turn between them
        assert all(sum(1 for a, b in zip([0, *x.policy_mask], x.policy_mask, strict=False) if b and not a) == 2
                   for g in groups for x in g.samples if tuple(g.prompt_tokens + x.response) in single)
