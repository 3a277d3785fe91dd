"""A multi-turn task in one file: guess a number from 0 to `high`, told "higher" or "lower" after each wrong guess.

    tba train enumerable_turns_cpu task.name=examples/guess_number.py:GuessTask 'task.options={high: 9}' \
        search.max_turns=4 search.max_new_tokens=3 eval.max_new_tokens=3

An episode: the prompt asks for a guess; the policy answers; the environment replies "higher" / "lower" (a new
turn the policy reads) or ends the episode when the guess is right. The reward is 1 for a right guess at the
first turn, a little less for each turn after it, 0 if the turns ran out. `episode_metrics` reports, for
evaluation, the share of episodes solved by each turn: a policy that uses the feedback solves more at later turns.
"""

from __future__ import annotations

import random

from tba.tasks.base import Prompt


class GuessEnv:
    def __init__(self, secret: int, penalty: float):
        self.secret, self.penalty, self.turns, self.solved_at = secret, penalty, 0, None

    def step(self, action: str) -> str | None:
        """The text after the policy's guess, or None when it is right."""
        self.turns += 1
        digits = "".join(ch for ch in action if ch.isdigit())
        if not digits:
            return "\nanswer with a number\n"  # a malformed answer is an observation to learn from
        guess = int(digits)
        if guess == self.secret:
            self.solved_at = self.turns
            return None
        return "\nhigher\n" if guess < self.secret else "\nlower\n"

    def get_reward(self) -> float:
        return 0.0 if self.solved_at is None else 1.0 - self.penalty * (self.solved_at - 1)


class GuessTask:
    name = "guess_number"

    def __init__(self, high: int = 9, penalty: float = 0.2, train_size: int = 200, test_size: int = 50,
                 seed: int = 0):
        rng = random.Random(seed)
        self.high, self.penalty = high, penalty
        question = f"guess a number from 0 to {high}: "
        self.train = [Prompt(i, question, str(rng.randint(0, high))) for i in range(train_size)]
        self.test = [Prompt(i, question, str(rng.randint(0, high))) for i in range(test_size)]

    def environment(self, prompt: Prompt) -> GuessEnv:
        return GuessEnv(int(prompt.answer), self.penalty)

    def episode_metrics(self, episodes) -> dict[str, float]:
        """Share of evaluation episodes solved by turn t (solved_by_turn_1, _2, …)."""
        n = len(episodes)
        turns = max((e.turns for e in episodes), default=0)
        return {f"solved_by_turn_{t}": sum(e.env.solved_at is not None and e.env.solved_at <= t for e in episodes) / n
                for t in range(1, turns + 1)}

    # for the builtin tiny model only: its tokenizer's corpus and SFT demonstrations (a random guess)
    def corpus(self) -> list[str]:
        return [f"guess a number from 0 to {self.high}: {i} higher lower answer with a number" for i in range(50)]

    def demonstrations(self, prompts: list[Prompt], seed: int) -> list[str]:
        rng = random.Random(seed)
        return [str(rng.randint(0, self.high)) for _ in prompts]
