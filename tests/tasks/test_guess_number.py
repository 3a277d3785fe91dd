"""guess_number: the feedback, the reward by turn, the per-turn metrics, one token per guess and per sign, and
TB learning to use the feedback from the untrained builtin model."""

from types import SimpleNamespace

import pytest
from runs import train_in_a_fresh_process

from tba.errors import ConfigError
from tba.models.builtin import train_tokenizer
from tba.tasks.guess_number import GuessEnv, GuessNumberTask


def test_feedback_and_reward_by_turn():
    env = GuessEnv(secret=5, penalty=0.25)
    assert env.step("3") == "+" and env.step(" 7") == "-" and env.step("x") == "?" and env.step("²") == "?"
    assert env.get_reward() == 0.0  # not solved (yet)
    assert env.step("5") is None and env.solved_at == 5
    assert env.get_reward() == pytest.approx(1 - 0.25 * 4)
    assert GuessEnv(secret=0, penalty=0.25).step("0") is None


def test_every_secret_equally_often_and_bad_options_named():
    task = GuessNumberTask(high=7, train_size=64, test_size=16)
    assert sorted(int(p.answer) for p in task.train + task.test) == sorted(list(range(8)) * 10)
    assert {p.text for p in task.train} == {"01234567"}
    with pytest.raises(ConfigError, match="high"):
        GuessNumberTask(high=12)


def test_solved_by_turn_and_solved_at_turn_among_the_open():
    def episode(solved_at, turns):
        return SimpleNamespace(env=SimpleNamespace(solved_at=solved_at, turns=turns))

    m = GuessNumberTask().episode_metrics([episode(1, 1), episode(2, 2), episode(3, 3), episode(None, 3)])
    assert [m[f"solved_by_turn_{t}"] for t in (1, 2, 3)] == [0.25, 0.5, 0.75]
    assert m["solved_at_turn_1_if_open"] == 0.25
    assert m["solved_at_turn_2_if_open"] == pytest.approx(1 / 3)  # 3 open after turn 1, one solved at 2
    assert m["solved_at_turn_3_if_open"] == 0.5


def test_one_token_per_number_and_per_sign():
    tok = train_tokenizer(GuessNumberTask().corpus(), 128)
    for symbol in [*"01234567", "+", "-", "?"]:
        assert len(tok(symbol, add_special_tokens=False)["input_ids"]) == 1, symbol


def test_tb_learns_to_use_the_feedback(tmp_path):
    """From the untrained model (greedy: one fixed guess, solved by turn 3 ≈ 1/8) to one that solves by turn 2
    almost twice as often. The learning curve is chaotic (sampling) and takes another path on each CPU kind: at
    update 300 it was 0.328–0.374 on seeds 0–2 on one (bench/results/multiturn/guess_number.md, where 1,000 updates
    pass the 2/8 that ignoring the feedback allows at most on every seed) and 0.216 on a Zen 2; from update 100 on,
    no seed was below 0.22. That the feedback is used is the benchmark's claim, not this test's."""
    s = train_in_a_fresh_process(["guess_number_cpu", f"output_dir={tmp_path / 'run'}", "trainer.steps=300",
                                  "eval.every_steps=300", "logging.progress=false", "logging.tensorboard=false",
                                  "threads=1", "buffer.persist=false"])
    assert s["eval_start"]["solved_by_turn_3"] < 0.2
    assert s["eval_end"]["solved_by_turn_2"] > 0.18
