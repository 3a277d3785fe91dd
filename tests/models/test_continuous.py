"""Continuous batching (tba.models.continuous) against the static decode loop: the same samples when nothing ends
early, log-probs that are the trainer's, and the same distribution when slots are refilled."""

import collections

import pytest
import torch

from tba.models.continuous import ContinuousBatch
from tba.models.generation import generate
from tba.models.logprobs import response_logprobs

TEXTS = ["1+2=", "57+68=", "99+1=", "40+33=", "7+7=", "123+456="]


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer):
    return [tiny_tokenizer(t)["input_ids"] for t in TEXTS]


def drain(engine: ContinuousBatch, version=lambda step: 0, limit: int = 10_000):
    out, step = [], 0
    while not engine.idle:
        out += engine.step(version(step))
        step += 1
        assert step < limit
    return out


def engine_of(model, tok, slots, **kw):
    return ContinuousBatch(model, slots, temperature=kw.pop("temperature", 1.0), top_p=kw.pop("top_p", 1.0),
                           eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, **kw)


@pytest.mark.parametrize("family", ["tiny", "llama-gqa", "gpt2"])
def test_without_early_ends_it_returns_exactly_the_static_loops_samples(family, tiny_model, tiny_tokenizer, prompts):
    """No EOS can end a row (its logit is masked by a huge negative bias), all rows admitted at once: the same
    tokens and log-probs as `generate` under the same seed."""
    from families import family as _family

    model = tiny_model if family == "tiny" else _family(family, tiny_tokenizer)
    tok, s, n = tiny_tokenizer, 3, 12
    head = model.get_output_embeddings()
    saved = None if head.bias is None else head.bias.detach().clone()
    bias = torch.zeros(head.weight.shape[0])
    bias[tok.eos_token_id] = -1e9
    head.bias = torch.nn.Parameter(bias)
    try:
        torch.manual_seed(3)
        static = generate(model, prompts, num_samples=s, temperature=0.8, max_new_tokens=n, eos_id=tok.eos_token_id,
                          pad_id=tok.pad_token_id)
        torch.manual_seed(3)
        engine = engine_of(model, tok, len(prompts) * s, temperature=0.8)
        for i, p in enumerate(prompts):
            engine.submit(i, p, s, n)
        done = sorted(drain(engine), key=lambda f: (f.key, f.index))
    finally:
        head.bias = None if saved is None else torch.nn.Parameter(saved)
    assert [f.tokens for f in done] == [r for r, _ in static]
    assert [x for f in done for x in f.logprobs] == pytest.approx([x for _, lp in static for x in lp], abs=1e-6)


def test_refilled_rows_sample_with_the_trainers_logprobs_and_record_versions(tiny_model, tiny_tokenizer, prompts):
    """Few slots, many samples: rows are refilled mid-flight and the timeline shifts; every token's behaviour
    log-prob is still log softmax(logits / T) of the response given its prompt (weights unchanged here)."""
    tok, t = tiny_tokenizer, 0.7
    torch.manual_seed(0)
    engine = engine_of(tiny_model, tok, 4, temperature=t, refill=1)
    for i, p in enumerate(prompts * 3):
        engine.submit(i, p, 2, 16)
    done = drain(engine, version=lambda step: step // 10)
    assert len(done) == len(prompts) * 3 * 2
    assert engine.stats.steps > 0 and engine.t <= engine.capacity
    flat = [(prompts * 3)[f.key] for f in done]
    logp, mask = response_logprobs(tiny_model, flat, [f.tokens for f in done], t, tok.pad_token_id)
    for j, f in enumerate(done):
        assert f.logprobs == pytest.approx(logp[j, : len(f.tokens)].tolist(), abs=1e-4)
        assert len(f.versions) == len(f.tokens) and f.versions == sorted(f.versions)
        assert f.tokens[-1] == tok.eos_token_id or len(f.tokens) == 16
    assert len({v for f in done for v in f.versions}) > 1


def test_refilling_samples_the_same_distribution_as_static_batching(tiny_model, tiny_tokenizer):
    """Over many samples of one prompt, first-token, second-token and length frequencies: 8 refilled slots
    (800 samples) against one static batch of 800, within sampling noise."""
    tok = tiny_tokenizer
    prompt = tok("12+3=")["input_ids"]
    torch.manual_seed(1)
    static = generate(tiny_model, [prompt], num_samples=800, temperature=1.0, max_new_tokens=6,
                      eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    torch.manual_seed(2)
    engine = engine_of(tiny_model, tok, 8, refill=1)
    for i in range(100):
        engine.submit(i, prompt, 8, 6)
    cont = drain(engine)

    def freq(items):
        c = collections.Counter(items)
        return {k: v / len(items) for k, v in c.items()}

    for pick in (lambda r: r[0], lambda r: len(r), lambda r: r[1] if len(r) > 1 else None):
        a, b = freq([pick(r) for r, _ in static]), freq([pick(f.tokens) for f in cont])
        tv = sum(abs(a.get(k, 0) - b.get(k, 0)) for k in a.keys() | b.keys()) / 2
        assert tv < 0.15, tv  # noise at 800 vs 800 over ~20 tokens: ≈ 0.09


def test_hold_drains_the_rows_in_flight_and_admits_nothing(tiny_model, tiny_tokenizer, prompts):
    tok = tiny_tokenizer
    engine = engine_of(tiny_model, tok, 4)
    for i, p in enumerate(prompts):
        engine.submit(i, p, 2, 8)
    engine.step(0)
    assert engine.active == 4
    engine.hold = True
    while engine.active:
        engine.step(0)
    assert len(engine.queue) == len(prompts) * 2 - 4
    engine.hold = False
    assert len(drain(engine)) == len(prompts) * 2 - 4


def test_a_kept_sample_resumes_its_next_turn_from_its_parked_cache(tiny_model, tiny_tokenizer, prompts):
    """Episodes of three turns (kept, resumed with an 'environment' answer after each) interleaved with one-turn
    samples over few slots, so the timeline shifts and slots are refilled: every policy token's log-prob is that
    of a forward over the whole episode from scratch, and nothing stays parked."""
    tok, t, budget = tiny_tokenizer, 0.9, 5
    answer = tok("=12+", add_special_tokens=False)["input_ids"]
    torch.manual_seed(1)
    engine = engine_of(tiny_model, tok, 3, temperature=t, refill=1)
    for i, p in enumerate(prompts[:3]):
        engine.submit(("episode", i), p, 2, budget, keep=True)
        engine.submit(("once", i), p, 1, budget)
    turns, steps = collections.defaultdict(list), 0
    while not engine.idle:
        for f in engine.step(0):
            if f.key[0] == "once":
                continue
            turns[f.key, f.index].append(f)
            if len(turns[f.key, f.index]) < 3:
                engine.resume(f.key, f.index, answer, budget)
            else:
                engine.release(f.key, f.index)
        steps += 1
        assert steps < 1000
    assert len(turns) == 6 and not engine.parked
    responses, policy = [], []
    for _, fs in sorted(turns.items()):
        response = []
        for j, f in enumerate(fs):
            policy += [(len(responses), len(response) + k, lp) for k, lp in enumerate(f.logprobs)]
            response += f.tokens + (answer if j < 2 else [])
        responses.append(response)
    logp, _ = response_logprobs(tiny_model, [prompts[key[1]] for key, _ in sorted(turns)], responses, t,
                                tok.pad_token_id)
    assert [lp for *_, lp in policy] == pytest.approx([logp[r, k].item() for r, k, _ in policy], abs=1e-4)


@pytest.mark.parametrize("family", ["tiny", "llama-gqa", "gpt2"])
def test_resumes_admitted_together_share_one_forward_with_each_episodes_logprobs(family, tiny_model, tiny_tokenizer,
                                                                                  prompts, monkeypatch):
    """Episodes of different prompt lengths whose turns end apart and whose 'environment' answers differ in length
    resume in one admission (refill = every slot): one forward extends all their caches (gaps masked, positions
    per row), and every policy token's log-prob is still a forward over the whole episode from scratch."""
    from families import family as _family

    model = tiny_model if family == "tiny" else _family(family, tiny_tokenizer)
    tok, t, budget, turns = tiny_tokenizer, 0.9, 4, 3
    answers = [tok(a, add_special_tokens=False)["input_ids"] for a in ["=1", "=12+7", "+", "=40+33=7"]]
    torch.manual_seed(4)
    engine = engine_of(model, tok, 6, temperature=t, refill=6)
    forwards = []
    extend = engine._extend
    monkeypatch.setattr(engine, "_extend", lambda parked, tokens: forwards.append(len(parked)) or extend(parked,
                                                                                                         tokens))
    for i in range(3):
        engine.submit(i, prompts[2 * i + 1], 2, budget, keep=True)
    ends = collections.defaultdict(list)
    steps = 0
    while not engine.idle:
        for f in engine.step(0):
            ends[f.key, f.index].append(f)
            if len(ends[f.key, f.index]) < turns:
                engine.resume(f.key, f.index, answers[(f.key + f.index + len(ends[f.key, f.index])) % 4], budget)
            else:
                engine.release(f.key, f.index)
        steps += 1
        assert steps < 1000
    assert forwards == [6] * (turns - 1) and not engine.parked  # every resume of a turn in one forward
    responses, policy = [], []
    for (key, index), fs in sorted(ends.items()):
        response = []
        for j, f in enumerate(fs):
            policy += [(len(responses), len(response) + k, lp) for k, lp in enumerate(f.logprobs)]
            response += f.tokens + (answers[(key + index + j + 1) % 4] if j < turns - 1 else [])
        responses.append(response)
    logp, _ = response_logprobs(model, [prompts[2 * key + 1] for key, _ in sorted(ends)], responses, t,
                                tok.pad_token_id)
    assert [lp for *_, lp in policy] == pytest.approx([logp[r, k].item() for r, k, _ in policy], abs=1e-4)


def test_resuming_what_is_not_parked_names_the_sample(tiny_model, tiny_tokenizer, prompts):
    engine = engine_of(tiny_model, tiny_tokenizer, 2)
    with pytest.raises(KeyError, match="sample 0 of 'a' is not parked"):
        engine.resume("a", 0, [1], 4)


@pytest.mark.parametrize("recompute", [True, False])
def test_recompute_rebuilds_caches_under_the_new_weights(tiny_model, tiny_tokenizer, prompts, recompute):
    """Weights change mid-flight (rows in flight, one episode parked between turns). recompute: every token sampled
    after the change has the new policy's log-prob given its whole prefix, as a fresh forward computes it; keep: the
    rows read caches of the old weights, and some of those log-probs differ."""
    import copy

    tok, t = tiny_tokenizer, 0.8
    model = copy.deepcopy(tiny_model)
    torch.manual_seed(2)
    engine = engine_of(model, tok, 4, temperature=t, refill=1, recompute=recompute)
    engine.submit("episode", prompts[4], 1, 2, keep=True)
    for i, p in enumerate(prompts[:4]):
        engine.submit(i, p, 2, 12)
    answer = tok("=1", add_special_tokens=False)["input_ids"]
    done, first_turn, version, steps = [], None, 0, 0
    while not engine.idle or first_turn is not None and "episode" not in [f.key for f in done]:
        if steps == 4:  # the episode's first turn has ended: it resumes under the new weights
            version = 1
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.3 * torch.randn_like(p))
            engine.resume("episode", 0, answer, 6)
        for f in engine.step(version):
            if f.key == "episode" and first_turn is None:
                first_turn = f
            else:
                done.append(f)
        steps += 1
    assert first_turn is not None and first_turn.versions == [0] * len(first_turn.versions)
    late = [f for f in done if f.versions[-1] == 1 and f.versions[0] == 0]
    assert late and (engine.recomputed_tokens > 0) == recompute
    episode = next(f for f in done if f.key == "episode")
    contexts = [prompts[f.key] for f in late] + [prompts[4]]
    responses = [f.tokens for f in late] + [first_turn.tokens + answer + episode.tokens]
    logp, _ = response_logprobs(model, contexts, responses, t, tok.pad_token_id)
    gaps = []
    for j, f in enumerate(late):
        gaps += [abs(f.logprobs[k] - logp[j, k].item()) for k, v in enumerate(f.versions) if v == 1]
    offset = len(first_turn.tokens) + len(answer)
    gaps += [abs(lp - logp[-1, offset + k].item()) for k, lp in enumerate(episode.logprobs)]
    assert (max(gaps) < 1e-4) == recompute
