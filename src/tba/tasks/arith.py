"""`arith`: offline, verifiable multi-digit addition from reasoning-gym, answered in GSM8K format.

Problems come from reasoning-gym's `basic_arithmetic` generator (seeded, offline); held-out problems use
seed + 1 and any expression that also occurs in train is removed (reasoning-gym draws item i from seed + i, so
that is most of the held-out set: 20,000 train problems keep 19,500 beside 500 held out). Prompts are compact
(`347+291=`) so that a 1M-parameter model can learn the task on a CPU in minutes.

Demonstrations for the SFT warm start come from a *noisy teacher*: it writes the column-by-column
chain of thought, least-significant digit first, and ends with `#### <answer>`:

    347+291=  →   7+1=8 4+9=13 3+2+1=6 #### 638

but with probability `slip_prob` it forgets each carry (`3+2=5 #### 538`). Imitation converges to that
distribution: once slip_prob > 0.5 the most likely continuation after a carry is the slip, so greedy
accuracy plateaus at roughly the share of carry-free problems however long SFT runs, while sampling at
T = 0.7 still finds the correct carry often enough for a verifier reward to push it up. That gap is what
lets the default recipe separate what RL adds from what more SFT would add.

`reward: digits` grades instead of verifying: the share of the answer's digits right, in place (a slipped carry
costs one digit, not the whole answer). A graded reward is where the buffer's reward-prioritised draws (ι) can
differ from uniform ones; held-out exact accuracy is then reported beside it (`eval/exact`).
"""

from __future__ import annotations

import random

import reasoning_gym

from tba.errors import ConfigError
from tba.tasks.base import Prompt
from tba.tasks.gsm8k import extract_answer, gsm8k_reward

REWARDS = ("exact", "digits")


def digits_reward(completion: str, answer: str) -> float:
    """The share of the gold answer's digits the completion's last number has in place, counted from the right,
    over the longer of the two (an extra or a missing digit costs one): `638` for 538 scores 2/3."""
    predicted = extract_answer(completion)
    if predicted is None or predicted != int(predicted) or predicted < 0:
        return 0.0
    p, g = str(int(predicted))[::-1], str(int(answer))[::-1]
    return sum(a == b for a, b in zip(p, g, strict=False)) / max(len(p), len(g))


def teacher_solution(a: int, b: int, slip_prob: float, rng: random.Random) -> str:
    """Column addition of a + b, least-significant digit first; each carry is forgotten with `slip_prob`."""
    da, db = str(a)[::-1], str(b)[::-1]
    steps, digits, carry = [], [], 0
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        if carry and rng.random() < slip_prob:
            carry = 0  # the slip: the carry is dropped, and the rest of the solution stays consistent
        total = x + y + carry
        steps.append(f"{x}+{y}+1={total}" if carry else f"{x}+{y}={total}")
        digits.append(total % 10)
        carry = total // 10
    answer = (str(carry) if carry else "") + "".join(str(d) for d in reversed(digits))
    return " " + " ".join(steps) + f" #### {int(answer)}"


def _problems(size: int, digits: int, seed: int) -> list[tuple[int, int, str]]:
    data = reasoning_gym.create_dataset(
        "basic_arithmetic", size=size, seed=seed, min_terms=2, max_terms=2, min_digits=digits,
        max_digits=digits, operators=("+",), allow_parentheses=False, allow_negation=False,
    )
    out = []
    for item in data:
        a, b = (int(t) for t in item["metadata"]["expression"].split("+"))
        out.append((a, b, item["answer"]))
    return out


class ArithTask:
    name = "arith"

    def __init__(self, digits: int = 3, train_size: int | None = 20000, test_size: int | None = 500,
                 teacher_slip_prob: float = 0.6, seed: int = 1234, prompt_template: str | None = None,
                 reward: str = "exact"):
        """digits: per operand (two operands, addition); teacher_slip_prob: the SFT teacher forgets each carry
        with this probability (imitation then plateaus below the ceiling); prompt_template: fields {a}, {b}
        (None = the compact `{a}+{b}=`); seed: of the problems (held-out: seed + 1); reward: exact (1 for the
        right sum) or digits (the share of its digits right)."""
        if reward not in REWARDS:
            raise ConfigError(f"task.options.reward: one of {', '.join(REWARDS)}, not {reward!r}")
        self.graded = reward == "digits"
        if digits < 1:
            raise ConfigError(f"task.options.digits: must be ≥ 1, got {digits}")
        if not 0.0 <= teacher_slip_prob <= 1.0:
            raise ConfigError(f"task.options.teacher_slip_prob: must be in [0, 1], got {teacher_slip_prob}")
        self.digits, self.slip_prob = digits, teacher_slip_prob
        template = prompt_template or "{a}+{b}="
        test = list(dict.fromkeys(_problems(test_size or 500, digits, seed + 1)))
        held_out = {(a, b) for a, b, _ in test}
        train = [p for p in dict.fromkeys(_problems(train_size or 20000, digits, seed)) if p[:2] not in held_out]
        fmt = template.format
        self.train = [Prompt(i, fmt(a=a, b=b), ans, {"a": a, "b": b}) for i, (a, b, ans) in enumerate(train)]
        self.test = [Prompt(i, fmt(a=a, b=b), ans, {"a": a, "b": b}) for i, (a, b, ans) in enumerate(test)]

    def reward(self, prompt: Prompt, completion: str) -> float:
        return (digits_reward if self.graded else gsm8k_reward)(completion, prompt.answer)

    def eval_metrics(self, prompts: list[Prompt], completions: list[str], finished) -> dict[str, float]:
        """Held-out exact accuracy, which the mean reward is not under a graded reward."""
        if not self.graded:
            return {}
        hits = [gsm8k_reward(c, p.answer) for p, c in zip(prompts, completions, strict=True)]
        return {"exact": sum(hits) / max(len(hits), 1)}

    def demonstrations(self, prompts: list[Prompt], seed: int) -> list[str]:
        rng = random.Random(seed)
        return [teacher_solution(p.meta["a"], p.meta["b"], self.slip_prob, rng) for p in prompts]

    def corpus(self) -> list[str]:
        """Text to train the built-in tokenizer on."""
        sols = self.demonstrations(self.train[:2000], seed=0)
        return [p.text + s for p, s in zip(self.train[:2000], sols, strict=True)]
