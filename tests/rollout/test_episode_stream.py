"""Multi-turn episodes under continuous batching (tba.rollout.episode_stream): the policy's log-probs through kept
caches, a slow environment holding only its own episode, faults and hangs ending episodes (never the run), and
weight updates landing between and within turns."""

import copy
import dataclasses
import threading
import time

import pytest
from test_stream import Publisher

from tba.config.schema import SearchConfig, TinyModelConfig
from tba.models.builtin import build_tiny_model, train_tokenizer
from tba.models.continuous import ContinuousBatch
from tba.models.logprobs import response_logprobs
from tba.rollout.episode_stream import Calls, EpisodeStream
from tba.rollout.episodes import Limits
from tba.rollout.samplers.hf import HFSampler
from tba.rollout.searcher import Searcher
from tba.tasks.base import Prompt
from tba.tasks.guess_number import GuessNumberTask

CFG = SearchConfig(temperature=1.0, generations_per_prompt=2, prompts_per_batch=2, max_new_tokens=4, max_turns=3,
                   batching="continuous", slots=3, env_timeout_s=5.0)


def _searcher(model, tok, task, cfg=CFG):
    return Searcher(HFSampler(copy.deepcopy(model), tok), copy.deepcopy(model), tok, task, cfg, seed=0)


@pytest.fixture(scope="module")
def guess():
    """The guessing game with a tiny model over its own tokenizer (one token per digit and feedback sign)."""
    task = GuessNumberTask(train_size=8, test_size=2)
    tok = train_tokenizer(task.corpus(), 128)
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return task, build_tiny_model(tok, cfg, seed=0).eval(), tok


def test_episodes_are_whole_groups_whose_policy_tokens_carry_the_policys_logprobs(guess):
    task, tiny_model, tiny_tokenizer = guess
    searcher = _searcher(tiny_model, tiny_tokenizer, task)
    groups = searcher.step() + searcher.step()
    assert len(groups) >= 3 and all(len(g.samples) == 2 for g in groups)
    samples = [s for g in groups for s in g.samples]
    assert any(0 in s.policy_mask for s in samples)  # some episodes went past their first turn
    logp, _ = response_logprobs(tiny_model, [g.prompt_tokens for g in groups for _ in g.samples],
                                [s.response for s in samples], CFG.temperature, tiny_tokenizer.pad_token_id)
    for j, s in enumerate(samples):
        assert len(s.response) == len(s.policy_mask) == len(s.behaviour_logprobs)
        mine = [k for k, m in enumerate(s.policy_mask) if m]
        assert [s.behaviour_logprobs[k] for k in mine] == pytest.approx([logp[j, k].item() for k in mine], abs=1e-4)
        assert all(s.behaviour_logprobs[k] == 0.0 for k, m in enumerate(s.policy_mask) if not m)
        assert s.reward is not None
    ends = searcher.stats.episode_ends
    assert sum(ends.values()) == len(samples) and ends["error"] == ends["timeout"] == 0
    stream = searcher.stream  # what is still parked or called belongs to episodes still in flight
    assert all(key in stream.open for key, _ in stream.engine.parked)
    assert all(key in stream.open for (_, key, _) in [tag for tag, _ in stream.calls.pending.values()])


class SlowEnv:
    """Answers 'again' twice, then ends; the first prompt's episodes take `delay` seconds per answer (or hang)."""

    def __init__(self, delay: float):
        self.delay, self.turns = delay, 0

    def step(self, action):
        time.sleep(self.delay)
        self.turns += 1
        return None if self.turns >= 2 else "1+1="

    def get_reward(self):
        return float(self.turns)


class SlowTask:
    episodic = True

    def __init__(self, delay: float):
        self.delay = delay

    def environment(self, prompt):
        return SlowEnv(self.delay if prompt.id == 0 else 0.0)


def _stream(model, tok, task, timeout_s=5.0, slots=2):
    engine = ContinuousBatch(copy.deepcopy(model), slots, temperature=1.0, top_p=1.0, eos_id=tok.eos_token_id,
                             pad_id=tok.pad_token_id, refill=1)
    return EpisodeStream(engine, task, tok, num_samples=2, max_new_tokens=4, weight_update="between_batches",
                         limits=Limits(max_turns=3, max_tokens=64, timeout_s=timeout_s))


def _feeder(tok):
    walk = iter(range(10_000))

    def feed():
        i = next(walk)
        return Prompt(i, f"{i}+2=", ""), tok(f"{i}+2=")["input_ids"], i
    return feed


def test_a_slow_environment_holds_only_its_own_episodes(tiny_model, tiny_tokenizer):
    """Prompt 0's environment takes 1.5 s per answer: other prompts' groups are delivered meanwhile."""
    stream = _stream(tiny_model, tiny_tokenizer, SlowTask(1.5))
    feed = _feeder(tiny_tokenizer)
    t0 = time.monotonic()
    first = stream.run(3, feed, lambda: 0, None)
    assert time.monotonic() - t0 < 1.5 and 0 not in [g.prompt.id for g in first]
    later = []
    while 0 not in [g.prompt.id for g in later]:
        later += stream.run(1, feed, lambda: 0, None)
    slow = next(g for g in later if g.prompt.id == 0)
    assert [e.end for e in slow.episodes] == ["done", "done"] and [e.reward for e in slow.episodes] == [2.0, 2.0]
    stream.close()


def test_a_hung_environment_times_out_its_episode_and_the_group_still_comes(tiny_model, tiny_tokenizer):
    release = threading.Event()

    class Hangs(SlowTask):
        def environment(self, prompt):
            env = SlowEnv(0.0)
            if prompt.id == 0:
                env.step = lambda action: release.wait(30)
            return env

    stream = _stream(tiny_model, tiny_tokenizer, Hangs(0.0), timeout_s=0.3)
    feed = _feeder(tiny_tokenizer)
    groups = []
    while 0 not in [g.prompt.id for g in groups]:
        groups += stream.run(1, feed, lambda: 0, None)
    hung = next(g for g in groups if g.prompt.id == 0)
    assert [e.end for e in hung.episodes] == ["timeout", "timeout"] and hung.episodes[0].reward is None
    assert "did not return within 0.3 s" in hung.episodes[0].error
    assert stream.calls.abandoned == 2 and all(key in stream.open for key, _ in stream.engine.parked)
    release.set()
    stream.close()


def test_a_call_that_raises_is_a_fault_with_its_traceback():
    calls = Calls(2, timeout_s=0.2)

    def boom():
        raise RuntimeError("no such room")

    calls.submit("a", boom)
    calls.submit("b", lambda: 7)
    out = {}
    while len(out) < 2:
        out.update({tag: (value, fault) for tag, value, fault in calls.poll(0.05)})
    assert out["b"] == (7, None)
    assert out["a"][1][0] == "error" and "no such room" in out["a"][1][1]
    calls.close()


def test_a_failed_reset_or_reward_ends_the_episode_and_the_group_still_comes(tiny_model, tiny_tokenizer):
    class Faulty(SlowTask):
        def environment(self, prompt):
            env = SlowEnv(0.0)
            if prompt.id == 0:
                env.reset = lambda prompt: 1 / 0
            if prompt.id == 1:
                env.get_reward = lambda: float("nan")
            return env

    stream = _stream(tiny_model, tiny_tokenizer, Faulty(0.0))
    groups = stream.run(3, _feeder(tiny_tokenizer), lambda: 0, None)
    while {0, 1} - {g.prompt.id for g in groups}:
        groups += stream.run(1, _feeder(tiny_tokenizer), lambda: 0, None)
    by_id = {g.prompt.id: g for g in groups}
    assert [e.end for e in by_id[0].episodes] == ["error", "error"]
    assert "ZeroDivisionError" in by_id[0].episodes[0].error
    assert [e.end for e in by_id[1].episodes] == ["error", "error"]
    assert "get_reward returned nan" in by_id[1].episodes[0].error
    assert all(not e.tokens for e in by_id[0].episodes)
    assert all(key in stream.open for key, _ in stream.engine.parked)
    stream.close()


def test_in_flight_updates_land_within_episodes_and_every_token_records_its_version(guess):
    task, tiny_model, tiny_tokenizer = guess
    cfg = dataclasses.replace(CFG, weight_update="in_flight")
    searcher = _searcher(tiny_model, tiny_tokenizer, task, cfg)
    publisher = Publisher(searcher, tiny_model, every=3)
    samples = [s for _ in range(3) for g in searcher.step(publisher) for s in g.samples]
    assert publisher.loads > 1
    spanning = [s for s in samples if s.versions]
    assert spanning and all(len(s.versions) == len(s.response) and s.versions == sorted(s.versions)
                            for s in spanning)
    assert all(s.version == s.versions[0] for s in spanning)


def test_between_batches_no_episode_spans_versions_and_the_weights_still_load(guess):
    task, tiny_model, tiny_tokenizer = guess
    searcher = _searcher(tiny_model, tiny_tokenizer, task)
    publisher = Publisher(searcher, tiny_model, every=3)
    samples = []
    for _ in range(20):
        samples += [s for g in searcher.step(publisher) for s in g.samples]
        if publisher.loads >= 2:
            break
    assert publisher.loads >= 2 and len({s.version for s in samples}) >= 2
    assert all(not s.versions for s in samples)
