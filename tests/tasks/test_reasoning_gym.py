"""reasoning_gym task: the answer it reads from a response, the dataset's verifier as reward, held-out split,
and the config errors a user sees for a bad dataset or option."""

from __future__ import annotations

import pytest

from tba.config import ConfigError
from tba.tasks.reasoning_gym import INSTRUCTION, ReasoningGymTask, final_answer


@pytest.mark.parametrize("text, expected", [
    ("42", "42"),
    ("42.", "42"),
    ("  \n 17\nbecause 8 + 9 = 17", "17"),
    ("I think <answer>9</answer> is right", "9"),
    ("<answer>\n 3 \n</answer>", "3"),
    ("", ""),
    ("3.5", "3.5"),  # a decimal point is not a sentence's full stop
])
def test_final_answer(text, expected):
    assert final_answer(text) == expected


def test_reward_is_the_datasets_verifier_on_the_final_answer():
    task = ReasoningGymTask("chain_sum", train_size=50, test_size=20, seed=7,
                            options=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1))
    p = task.test[0]
    assert p.text.endswith("\n" + INSTRUCTION)
    assert task.reward(p, p.answer) == 1.0
    assert task.reward(p, p.answer + ".\nThat is the sum.") == 1.0
    # prose around the answer: reasoning-gym's default verifier gives len(answer) / len(response) credit
    assert task.reward(p, f"The sum is {p.answer}") == pytest.approx(len(p.answer) / len(f"The sum is {p.answer}"))
    assert task.reward(p, str(int(p.answer) + 1)) == 0.0
    assert task.name == "reasoning_gym/chain_sum"


def test_held_out_questions_never_in_train():
    task = ReasoningGymTask("chain_sum", train_size=400, test_size=100, seed=3,
                            options=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1))
    test_q = {p.text for p in task.test}
    assert len(task.test) == 100 and 0 < len(task.train) <= 400
    assert not test_q & {p.text for p in task.train}
    assert [p.id for p in task.train] == list(range(len(task.train)))


def test_same_seed_same_problems():
    a = ReasoningGymTask("leg_counting", train_size=20, test_size=10, seed=5)
    b = ReasoningGymTask("leg_counting", train_size=20, test_size=10, seed=5)
    assert [p.text for p in a.train] == [p.text for p in b.train]
    assert [p.answer for p in a.test] == [p.answer for p in b.test]


def test_bad_dataset_and_options_name_the_field():
    with pytest.raises(ConfigError, match="task.options.dataset.*no_such_dataset"):
        ReasoningGymTask("no_such_dataset")
    with pytest.raises(ConfigError, match="task.options.options.*chain_sum"):
        ReasoningGymTask("chain_sum", options=dict(min_terms=5, max_terms=2))


def test_registry_builds_it_from_task_options():
    from tba.config import load_config
    from tba.run.build import build_task

    def make(*overrides):
        return build_task(load_config(None, ["task.name=reasoning_gym", "model.policy=x/y", *overrides]))

    task = make("task.train_size=30", "task.test_size=10",
                "task.options={dataset: chain_sum, options: {max_digits: 1}}")
    assert task.name == "reasoning_gym/chain_sum" and len(task.test) == 10
    with pytest.raises(ConfigError, match="task.options: ReasoningGymTask needs dataset"):
        make()
    with pytest.raises(ConfigError, match=r"does not take \['max_digits'\]"):
        make("task.options={dataset: chain_sum, max_digits: 1}")


@pytest.mark.parametrize("text, expected", [
    ("50 + 19 = 69.", "69"),
    ("The sum of 1,200 and 34 is 1,234", "1234"),
    ("half of it: 2.5", "2.5"),
    ("no number", ""),
    ("<answer>12</answer> but 13", "12"),  # tags win over every reading
])
def test_final_answer_last_number(text, expected):
    assert final_answer(text, "last_number") == expected


def test_last_number_reads_a_sentence_answer():
    task = ReasoningGymTask("basic_arithmetic", train_size=20, test_size=5, seed=0, extract="last_number",
                            options=dict(min_terms=2, max_terms=2, min_digits=2, max_digits=2, operators=("+",),
                                         allow_parentheses=False, allow_negation=False))
    p = task.test[0]
    assert task.reward(p, f"The answer is {p.answer}.") == 1.0
    assert task.reward(p, f"{p.answer}, so not {int(p.answer) + 1}") == 0.0  # the last number counts
    with pytest.raises(ConfigError, match="task.options.extract"):
        ReasoningGymTask("basic_arithmetic", extract="first_number")


def test_exact_counts_full_credit_only():
    task = ReasoningGymTask("basic_arithmetic", train_size=20, test_size=4, seed=0, extract="last_number",
                            options=dict(min_terms=2, max_terms=2, min_digits=2, max_digits=2, operators=("+",),
                                         allow_parentheses=False, allow_negation=False))
    ps = task.test[:2]
    wrong_but_partial = ps[1].answer + "0"  # contains the answer: partial credit from reasoning-gym
    assert 0 < task.reward(ps[1], wrong_but_partial) < 1
    assert task.eval_metrics(ps, [ps[0].answer, wrong_but_partial], [True, True]) == {"exact": 0.5}
