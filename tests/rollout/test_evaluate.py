"""Evaluation: greedy/sampled completions, task metrics, and the TL;DR paper's distances to π_ref."""

import copy
import math

import pytest
import torch

from tba.config.schema import EvalConfig
from tba.rollout.evaluate import complete, evaluate, reference_metrics


def perturbed(model, scale=0.05, seed=1):
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return other


def test_kl_is_zero_against_itself_and_matches_a_direct_computation(tiny_model, tiny_tokenizer, arith_task):
    c = complete(tiny_model, tiny_tokenizer, arith_task.test[:3], max_new_tokens=6, batch_size=8,
                 samples_per_prompt=2, temperature=1.0)
    assert len(c.texts) == 6 and c.prompts[0] == c.prompts[1] == arith_task.test[0]
    pad = tiny_tokenizer.pad_token_id
    assert reference_metrics(tiny_model, tiny_model, c, pad)["kl_ref"] == pytest.approx(0.0, abs=1e-6)

    policy = perturbed(tiny_model)
    got = reference_metrics(policy, tiny_model, c, pad, batch_size=2)  # batching must not change anything
    kl, tokens, ppl = 0.0, 0, []
    for prompt, response in zip(c.prompt_tokens, c.responses, strict=True):  # one unpadded sequence at a time
        ids = torch.tensor([prompt + response])
        lp = torch.log_softmax(policy(ids).logits[0, len(prompt) - 1:-1], -1)
        lr = torch.log_softmax(tiny_model(ids).logits[0, len(prompt) - 1:-1], -1)
        kl += (lr.exp() * (lr - lp)).sum().item()
        tokens += len(response)
        nll = -lr.gather(-1, torch.tensor(response)[:, None]).sum().item()
        ppl.append(math.exp(nll / (len(prompt) + len(response))))  # the quirk: all attended tokens
    assert got["kl_ref"] == pytest.approx(kl / tokens, rel=1e-4)
    assert got["perplexity_ref"] == pytest.approx(sum(ppl) / len(ppl), rel=1e-4)


class Scored:
    """A task with a batched reward and its own metrics, to check what evaluate() calls."""

    name = "scored"

    def __init__(self, task):
        self.train, self.test, self.calls = task.train, task.test, []

    def rewards(self, prompts, completions, finished):
        self.calls.append(list(finished))
        return [1.0 if f else -1.0 for f in finished]

    def reward(self, prompt, completion):
        return 1.0

    def eval_metrics(self, prompts, completions, finished):
        return {"n": len(completions)}


def test_evaluate_uses_the_batched_reward_the_eos_flags_and_task_metrics(tiny_model, tiny_tokenizer, arith_task):
    task = Scored(arith_task)
    cfg = EvalConfig(max_new_tokens=2, batch_size=4, samples_per_prompt=3, reference_metrics=True)
    metrics = evaluate(tiny_model, tiny_tokenizer, task, arith_task.test[:2], cfg, reference=tiny_model)
    assert metrics["n"] == 6 and len(task.calls) == 1 and len(task.calls[0]) == 6
    assert metrics["score"] == pytest.approx(sum(1.0 if f else -1.0 for f in task.calls[0]) / 6)
    assert metrics["kl_ref"] == pytest.approx(0.0, abs=1e-6) and metrics["perplexity_ref"] >= 1.0
