"""Multi-turn episodes: token-exact trajectories with a policy mask, every fault an end reason (never a crash),
the mask honoured by every objective, and episodes through the durable store unchanged."""

import copy
import time

import pytest
import torch
from chars import CharTokenizer

from tba.algorithm.objectives import OBJECTIVES
from tba.algorithm.objectives.tb import beta_schedule
from tba.algorithm.objectives.tba_prime import ResettingReference
from tba.algorithm.store import BufferStore
from tba.algorithm.trainer import Trainer
from tba.algorithm.types import Draw, Group, Sample
from tba.config.schema import BaselineConfig, TBConfig, TinyModelConfig, TrainerConfig
from tba.models.builtin import build_tiny_model, train_tokenizer
from tba.models.logprobs import response_logprobs
from tba.rollout.episodes import FAILED, Limits, policy_logprobs, run_episodes, turns
from tba.tasks.base import Prompt


class ScriptedEnv:
    """Answers each action with the next scripted reply; a reply may be a callable (raise, hang, …)."""

    def __init__(self, replies, reward=1.0):
        self.replies, self.reward, self.actions = list(replies), reward, []

    def step(self, action):
        self.actions.append(action)
        reply = self.replies.pop(0)
        return reply() if callable(reply) else reply

    def get_reward(self):
        return self.reward


class Scripted:
    def __init__(self, replies, reward=1.0):
        self.replies, self.reward, self.envs = replies, reward, []

    def environment(self, prompt):
        self.envs.append(ScriptedEnv(self.replies, self.reward))
        return self.envs[-1]


def policy_says(text):
    """A 'policy' that always answers `text` (truncated to the turn's budget), log-prob −1 per token."""
    def generate(contexts, max_new_tokens):
        ids = [ord(c) for c in text][:max_new_tokens]
        return [(list(ids), [-1.0] * len(ids)) for _ in contexts]
    return generate


LIMITS = Limits(max_turns=4, max_tokens=64, timeout_s=0.5)


def episodes(task, *, text="ab", limits=LIMITS, n=1):
    prompt = Prompt(0, "Q", "")
    return run_episodes(policy_says(text), CharTokenizer(), task, [prompt], [[ord("Q")]], num_samples=n,
                        max_new_tokens=8, limits=limits)


def test_tokens_are_kept_as_sampled_and_the_environment_text_is_masked():
    task = Scripted(["xy", "z", None], reward=0.5)
    (e,) = episodes(task)
    assert e.end == "done" and e.turns == 3 and e.reward == 0.5
    assert e.tokens == [ord(c) for c in "abxyabzab"]
    assert e.mask == [1, 1, 0, 0, 1, 1, 0, 1, 1]
    assert e.logprobs == [-1, -1, 0, 0, -1, -1, 0, -1, -1]
    assert task.envs[0].actions == ["ab", "ab", "ab"]  # the environment saw each policy turn, decoded
    assert turns(e.mask) == [(True, 0, 2), (False, 2, 4), (True, 4, 6), (False, 6, 7), (True, 7, 9)]


def test_every_fault_ends_its_episode_with_a_counted_reason():
    def boom():
        raise RuntimeError("tool crashed")

    def hang():
        time.sleep(30)

    t0 = time.perf_counter()
    (raised,) = episodes(Scripted(["ok", boom]))
    (hung,) = episodes(Scripted([hang]))
    assert time.perf_counter() - t0 < 5  # the hung call was abandoned after its 0.5 s timeout
    (garbage,) = episodes(Scripted([123]))
    (endless,) = episodes(Scripted(["more"] * 10))
    (long,) = episodes(Scripted(["x" * 40] * 10))
    assert raised.end == "error" and "tool crashed" in raised.error and raised.reward is None
    assert hung.end == "timeout" and hung.reward is None
    assert garbage.end == "bad_observation" and "int" in garbage.error
    assert endless.end == "max_turns" and endless.turns == 4 and endless.reward == 1.0  # a limit: still scored
    assert long.end == "token_budget" and len(long.tokens) < 64 and long.reward == 1.0
    assert {"error", "timeout", "bad_observation"} == FAILED


def test_a_reward_that_is_not_a_number_fails_the_episode_not_the_run():
    (e,) = episodes(Scripted([None], reward=float("nan")))
    assert e.end == "error" and e.reward is None and "nan" in e.error


def test_policy_logprobs_zero_the_environments_tokens_only():
    assert policy_logprobs([-1.0, -2.0, -3.0, -4.0], [1, 0, 0, 1]) == [-1.0, 0.0, 0.0, -4.0]
    assert policy_logprobs([-1.0, -2.0], []) == [-1.0, -2.0]  # single turn: every token is the policy's
    with pytest.raises(ValueError):
        policy_logprobs([-1.0, -2.0], [1])


@pytest.fixture(scope="module")
def tiny():
    tok = train_tokenizer(["0123456789 abc"] * 8, 64)
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64),
                             seed=0).eval()
    return tok, model


def episode_draw(tok, model):
    """Two episodes of one prompt: policy tokens, then environment tokens, then policy tokens."""
    prompt = tok("0 1")["input_ids"]
    responses = [[5, 6, 7, 8, 9, tok.eos_token_id], [6, 6, 9, 9, tok.eos_token_id]]
    masks = [[1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 1]]
    with torch.no_grad():
        ref, _ = response_logprobs(model, [prompt] * 2, responses, 1.0, tok.pad_token_id)
    samples = [Sample(r, (ref[i, :len(r)] * torch.tensor(m)).tolist(), float(i), 0, ref[i, :len(r)].tolist(),
                      policy_mask=m) for i, (r, m) in enumerate(zip(responses, masks, strict=True))]
    return Draw(0, prompt, samples, True), prompt, responses, masks


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_every_objective_sees_only_the_policys_tokens(tiny, name):
    """The mask each objective receives is padding × policy mask, and the loss is the objective on those
    tensors computed by hand (the trainer's forward, the environment's positions zeroed)."""
    tok, model = tiny
    draw, prompt, responses, masks = episode_draw(tok, model)
    seen = {}
    objective = OBJECTIVES[name]
    loss = objective.bind(TBConfig(), BaselineConfig(), max_tokens=8)

    class Spy:  # the bound loss, recording what the trainer hands it
        name, reads_behaviour = loss.name, loss.reads_behaviour

        def __call__(self, **kw):
            seen.update(kw)
            return loss(**kw)

    own = ResettingReference(copy.deepcopy(model), None) if objective.owns_reference else None
    trainer = Trainer(copy.deepcopy(model), Spy(), TrainerConfig(lr=0.0), beta=beta_schedule(TBConfig()),
                      temperature=1.0, pad_id=tok.pad_token_id, reference=own)
    metrics = trainer.step([draw])
    expected_mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 1, 0]], dtype=torch.float32)
    assert torch.equal(seen["mask"], expected_mask)
    logp, pad = response_logprobs(model, [prompt] * 2, responses, 1.0, tok.pad_token_id)
    hand = loss(logp=logp.detach(), mask=pad * expected_mask, ref_logp=seen["ref_logp"],
                behaviour_logp=seen["behaviour_logp"], reward=seen["reward"], group=seen["group"], beta=seen["beta"])
    assert metrics["trainer/loss"] == pytest.approx(hand.item(), rel=1e-5, abs=1e-6)
    if name == "tb":  # by hand: log π(τ) is the sum over the policy's tokens only
        beta = seen["beta"]
        seq = (logp * expected_mask).sum(-1).detach()
        ref = torch.tensor([s.ref_logprob_sum for s in draw.samples])
        target = torch.tensor([0.0, 1.0]) / beta - seq + ref
        delta = target.mean() + seq - ref - torch.tensor([0.0, 1.0]) / beta
        assert metrics["trainer/loss"] == pytest.approx(delta.pow(2).mean().item(), rel=1e-5)


def test_an_episode_round_trips_through_the_store_exactly(tmp_path):
    s = Sample([5, 6, 7, 8], [-0.5, 0.0, 0.0, -0.25], 1.0, 3, [-0.375, 0.0, 0.0, -0.125], "policy", [1, 0, 0, 1])
    single = Sample([5, 6], [-0.5, -0.0625], 0.0, 3, [-0.375, -0.0625])
    store = BufferStore(tmp_path / "buffer.sqlite")
    store.append([Group(0, [1, 2], [s, single])], step=1)
    (_, _, g), = store.iter_groups()
    assert g.samples[0] == s and g.samples[1] == single and g.samples[1].policy_mask == []
    assert store.load_samples([(1, 0)])[1, 0] == s
    store.close()
