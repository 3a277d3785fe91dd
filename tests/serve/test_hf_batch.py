"""The serving batch on the hf backend: the sampler's own draw for one request, each request's own settings in a
shared batch, stop tokens, cancelling."""

import torch

from tba.models.generation import generate
from tba.serve.engine import Params
from tba.serve.hf_batch import HFBatch


def _run(batch, version=0):
    out = {}
    while not batch.idle:
        for t in batch.step(version):
            out.setdefault((t.rid, t.index), []).append(t)
    return out


def test_one_request_samples_what_the_sampler_generates(sampler, chat_tokenizer):
    prompt = chat_tokenizer.encode("12+34=")
    torch.manual_seed(5)
    ((ref, ref_lp),) = sampler.generate([prompt], num_samples=1, temperature=0.7, top_p=0.9, max_new_tokens=24)
    batch = HFBatch(sampler, 4)
    torch.manual_seed(5)
    batch.add("a", prompt, Params(temperature=0.7, top_p=0.9, max_tokens=24))
    got = _run(batch, version=7)["a", 0]
    assert [t.token for t in got] == ref
    assert torch.allclose(torch.tensor([t.logprob for t in got]), torch.tensor(ref_lp), atol=1e-5)
    assert {t.version for t in got} == {7} and got[-1].finish in ("stop", "length")


def test_requests_with_different_settings_share_one_batch(sampler, chat_model, chat_tokenizer):
    prompts = [chat_tokenizer.encode(p) for p in ("12+34=", "7+8=", "40+2=")]
    greedy = [r for r, _ in (generate(chat_model, [p], greedy=True, max_new_tokens=12,
                                      eos_id=chat_tokenizer.eos_token_id, pad_id=chat_tokenizer.pad_token_id)[0]
                             for p in prompts)]
    stop = greedy[1][3]
    cut = greedy[1][:greedy[1].index(stop) + 1]
    batch = HFBatch(sampler, 8)
    batch.add("greedy", prompts[0], Params(temperature=0, max_tokens=12, top_logprobs=3))
    batch.add("stopped", prompts[1], Params(temperature=0, max_tokens=12, stop_token_ids=frozenset({stop})))
    batch.add("sampled", prompts[2], Params(n=3, temperature=1.0, max_tokens=12))
    steps, out = 0, {}
    while not batch.idle:
        tokens = batch.step(0)
        if not steps:
            assert len({(t.rid, t.index) for t in tokens}) == 5  # every row admitted and decoded together
        for t in tokens:
            out.setdefault((t.rid, t.index), []).append(t)
        steps += 1
    assert [t.token for t in out["greedy", 0]] == greedy[0]
    assert [t.token for t in out["stopped", 0]] == cut and out["stopped", 0][-1].finish == "stop"
    assert len({(k[1]) for k in out if k[0] == "sampled"}) == 3
    top = out["greedy", 0][0].top
    assert len(top) == 3 and top[0][0] == greedy[0][0] and top[0][1] >= top[1][1] >= top[2][1]
    assert steps <= 12


def test_a_cancelled_request_leaves_the_batch(sampler, chat_tokenizer):
    batch = HFBatch(sampler, 2)
    prompt = chat_tokenizer.encode("1+1=")
    batch.add("a", prompt, Params(temperature=1.0, max_tokens=50))
    batch.add("b", prompt, Params(temperature=1.0, max_tokens=50))
    batch.add("c", prompt, Params(temperature=1.0, max_tokens=3))  # queued: only two slots
    batch.step(0)
    batch.cancel("a")
    batch.cancel("c")
    assert batch.active == 1 and not batch.queue
    out = _run(batch)
    assert {k[0] for k in out} == {"b"} and batch.idle and not batch.params
