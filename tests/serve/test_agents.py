"""Episodes from outside (tba.serve.agents) in a real searcher on the tiny chat model: agents written only against
the `openai` client, their calls stitched token-exact — the ids served are the ids stored, the mask marks exactly the
sampled tokens, the trainer's log π of them is the served log-probs — a call that does not extend its session follows
on_break, a hanging agent is timed out and a raising one counted, and nothing is left running after close."""

import copy
import threading

import openai_agents as agents
import pytest
import torch

from tba.config.schema import SearchConfig
from tba.models.logprobs import grouped_logprobs
from tba.rollout.samplers.hf import HFSampler
from tba.rollout.searcher import Searcher
from tba.runtime.worker import attach_outside
from tba.tasks.agent import AgentTask

pytest.importorskip("openai")


def searcher(model, tokenizer, agent, **options):
    task = AgentTask(agent=agent, source=agents.rows(), test_size=3, **options)
    cfg = SearchConfig(prompts_per_batch=2, generations_per_prompt=3, max_new_tokens=8)
    s = Searcher(HFSampler(copy.deepcopy(model), tokenizer), model, tokenizer, task, cfg, seed=0)
    attach_outside(s)
    return s


def served_by_trajectory(calls):
    """The calls of one episode split where a call does not extend the ids before it (the stitching rule)."""
    out = []
    for c in calls:
        if out and c["prompt"][:len(out[-1]["ids"])] == out[-1]["ids"]:
            out[-1]["sampled"] += c["tokens"]
            out[-1]["logprobs"] += c["logprobs"]
            out[-1]["ids"] = c["prompt"] + c["tokens"]
        else:
            out.append({"ids": c["prompt"] + c["tokens"], "sampled": list(c["tokens"]),
                        "logprobs": list(c["logprobs"])})
    return out


def test_served_ids_are_stored_ids_with_the_policys_mask_and_log_probs(chat_model, chat_tokenizer):
    agents.SERVED.clear()
    s = searcher(chat_model, chat_tokenizer, agents.tool_agent)
    try:
        groups = s.step(None) + s.step(None)
    finally:
        s.close()
    want = [t for calls in agents.SERVED.values() for t in served_by_trajectory(calls)]
    assert all(len(calls) == 3 for calls in agents.SERVED.values())
    stored = [(g, x) for g in groups for x in g.samples]
    assert len(groups) == 4 and {len(g.samples) for g in groups} >= {3}
    assert s.stats.episode_ends["done"] >= 12 and s.stats.reward_metrics["agent/calls_mean"] == 3.0
    multi = 0
    for g, x in stored:
        ids = g.prompt_tokens + x.response
        (match,) = [t for t in want if t["ids"] == ids]  # the ids served, exactly
        sampled = [t for t, m in zip(x.response, x.policy_mask, strict=True) if m]
        assert sampled == match["sampled"]  # the mask marks exactly the sampled tokens
        assert [lp for lp, m in zip(x.behaviour_logprobs, x.policy_mask, strict=True) if m] == match["logprobs"]
        multi += len(match["sampled"]) > 6
        logp, _ = grouped_logprobs(chat_model.float(), [g.prompt_tokens], [x.response], [1], 1.0,
                                   chat_tokenizer.pad_token_id)
        recomputed = torch.tensor([v for v, m in zip(logp[0].tolist(), x.policy_mask, strict=True) if m])
        assert torch.allclose(recomputed, torch.tensor(match["logprobs"]), atol=1e-4)
        assert all(r == 0.0 for r, m in zip(x.ref_logprobs, x.policy_mask, strict=True) if not m)
    assert multi > 0  # some samples stitched several calls (others broke: the template re-tokenized a turn)
    assert not [t for t in threading.enumerate() if t.name.startswith(("tba-agent", "tba-serve"))]


@pytest.mark.parametrize("on_break", ["new_sample", "drop"])
def test_a_call_that_does_not_extend_follows_on_break(chat_model, chat_tokenizer, on_break):
    agents.SERVED.clear()
    s = searcher(chat_model, chat_tokenizer, agents.editing_agent, on_break=on_break)
    try:
        groups = s.step(None)
    finally:
        s.close()
    episodes = sum(len(c) == 2 for c in agents.SERVED.values())
    samples = sum(len(g.samples) for g in groups)
    m = s.stats.reward_metrics
    assert m["agent/breaks"] == episodes and episodes >= 6
    if on_break == "new_sample":
        assert samples == 2 * episodes and m["agent/calls_dropped"] == 0
    else:
        assert samples == episodes and m["agent/calls_dropped"] == episodes
    assert all(x.reward == 0.5 for g in groups for x in g.samples)


def test_a_hanging_agent_is_timed_out_and_a_raising_one_counted(chat_model, chat_tokenizer, caplog):
    agents.RELEASE.clear()
    s = searcher(chat_model, chat_tokenizer, agents.hanging_agent, timeout_s=1.0, concurrency=12)
    try:
        for _ in range(12):  # hanging rows end (by timeout) after quicker ones: step until three have
            s.step(None)
            if s.stats.episode_ends["timeout"] >= 3:
                break
        assert s.stats.episode_ends["timeout"] >= 3 and s.stats.episode_ends["done"] >= 3
        assert "did not return within 1 s (task.options.timeout_s)" in s.stats.last_reward_error
    finally:
        agents.RELEASE.set()
        s.close()
    s = searcher(chat_model, chat_tokenizer, agents.raising_agent)
    try:
        groups = [g for _ in range(3) for g in s.step(None)]
    finally:
        s.close()
    assert s.stats.episode_ends["error"] >= 3 and s.stats.rewards_dropped == s.stats.episode_ends["error"]
    first = s.stats.last_reward_error.split("\n")[0]
    assert "agent" in first and "raising_agent raised ValueError: no tool for" in first
    assert "Traceback" in s.stats.last_reward_error or "line" in s.stats.last_reward_error
    assert groups and all(x.reward == 1.0 for g in groups for x in g.samples)
