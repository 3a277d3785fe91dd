"""The arith task: the noisy teacher's column addition, split hygiene, reward, and seeded data."""

import random
import re

import pytest

from tba.tasks.arith import ArithTask, teacher_solution
from tba.tasks.base import Prompt, accuracy


def _prompt(a: int, b: int) -> Prompt:
    return Prompt(0, f"{a}+{b}=", str(a + b), {"a": a, "b": b})


def _carried_sum(a: int, b: int) -> tuple[int, bool]:
    """a + b with every carry into a next column dropped, and whether any carry was dropped."""
    da, db = str(a)[::-1], str(b)[::-1]
    n = max(len(da), len(db))
    cols = [(int(da[i]) if i < len(da) else 0) + (int(db[i]) if i < len(db) else 0) for i in range(n)]
    dropped = [i for i in range(n - 1) if cols[i] >= 10]  # the last column's carry is the leading digit
    return a + b - sum(10 ** (i + 1) for i in dropped), bool(dropped)


def test_teacher_hand_example():
    rng = random.Random(0)
    assert teacher_solution(347, 291, 0.0, rng) == " 7+1=8 4+9=13 3+2+1=6 #### 638"
    assert teacher_solution(347, 291, 1.0, rng) == " 7+1=8 4+9=13 3+2=5 #### 538"
    assert teacher_solution(95, 7, 0.0, rng) == " 5+7=12 9+0+1=10 #### 102"


def test_teacher_without_slips_is_always_correct(arith_task):
    rng = random.Random(0)
    for _ in range(500):
        a, b = rng.randint(0, 9999), rng.randint(0, 9999)
        text = teacher_solution(a, b, 0.0, rng)
        assert arith_task.reward(_prompt(a, b), text) == 1.0, (a, b, text)


def test_teacher_with_slip_prob_one_drops_every_carry(arith_task):
    rng = random.Random(1)
    seen = {True: 0, False: 0}
    for _ in range(500):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        text = teacher_solution(a, b, 1.0, rng)
        expected, has_carry = _carried_sum(a, b)
        seen[has_carry] += 1
        assert not re.search(r"\d\+\d\+1=", text)  # no step ever adds a carry
        assert text.endswith(f"#### {expected}")
        assert arith_task.reward(_prompt(a, b), text) == (0.0 if has_carry else 1.0), (a, b, text)
    assert seen[True] > 50 and seen[False] > 50


def test_demonstrations_are_seeded(arith_task):
    prompts = arith_task.train[:50]
    assert arith_task.demonstrations(prompts, seed=3) == arith_task.demonstrations(prompts, seed=3)
    assert len(arith_task.demonstrations(prompts, seed=3)) == 50


def test_train_and_test_are_disjoint_and_answers_are_sums():
    task = ArithTask(digits=2, train_size=2000, test_size=200)
    train = {(p.meta["a"], p.meta["b"]) for p in task.train}
    test = {(p.meta["a"], p.meta["b"]) for p in task.test}
    assert train and test and not train & test
    assert len(train) == len(task.train) and len(test) == len(task.test)  # no duplicates within a split
    for split in (task.train, task.test):
        assert [p.id for p in split] == list(range(len(split)))
        for p in split:
            assert p.text == f"{p.meta['a']}+{p.meta['b']}=" and int(p.answer) == p.meta["a"] + p.meta["b"]


def test_same_seed_same_lists_other_seed_other_lists():
    a = ArithTask(digits=2, train_size=100, test_size=20, seed=7)
    b = ArithTask(digits=2, train_size=100, test_size=20, seed=7)
    c = ArithTask(digits=2, train_size=100, test_size=20, seed=8)
    assert [p.text for p in a.train] == [p.text for p in b.train]
    assert [p.text for p in a.test] == [p.text for p in b.test]
    assert [p.text for p in a.train] != [p.text for p in c.train]


@pytest.mark.parametrize("completion, reward", [
    (" 7+1=8 4+9=13 3+2+1=6 #### 638", 1.0),
    ("the answer is 638", 1.0),
    (" 7+1=8 4+9=13 3+2=5 #### 538", 0.0),
    ("638 then 539", 0.0),  # the last number counts
    (" #### ", 0.0),
    ("", 0.0),
])
def test_reward_reads_the_last_number(arith_task, completion, reward):
    assert arith_task.reward(_prompt(347, 291), completion) == reward


def test_accuracy_is_mean_reward(arith_task):
    prompts = [_prompt(1, 2), _prompt(3, 4)]
    assert accuracy(arith_task, prompts, ["#### 3", "#### 8"]) == 0.5


@pytest.mark.parametrize("completion, reward", [
    (" #### 638", 1.0), (" #### 538", 2 / 3), (" #### 6380", 0.0), (" #### 38", 2 / 3), ("no number", 0.0),
    (" #### -638", 0.0), (" #### 63.8", 0.0),
])
def test_the_digits_reward_grades_each_digit_in_place(completion, reward):
    from tba.tasks.arith import digits_reward

    assert digits_reward(completion, "638") == pytest.approx(reward)


def test_a_graded_arith_task_reports_exact_accuracy_beside_its_reward():
    from tba.errors import ConfigError
    from tba.tasks.arith import ArithTask

    task = ArithTask(digits=3, train_size=50, test_size=10, reward="digits")
    p = _prompt(347, 291)
    assert task.reward(p, " #### 538") == pytest.approx(2 / 3)
    assert task.eval_metrics([p, p], [" #### 638", " #### 538"], [True, True]) == {"exact": 0.5}
    with pytest.raises(ConfigError, match="task.options.reward: one of exact, digits"):
        ArithTask(train_size=50, test_size=10, reward="partial")
