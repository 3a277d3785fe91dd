"""`guess_number`: find a hidden number from "higher" / "lower" feedback — a multi-turn task where later turns
matter, small enough for the builtin tiny model to learn on a CPU in minutes.

Every prompt is the same text (the numbers 0…high, so that the tiny model's tokenizer knows them); the secret
is the prompt's, hidden. An episode: the policy writes a guess (one number; `search.max_new_tokens: 1` for the
tiny model, whose tokenizer has one token per digit), the environment answers `+` (the secret is higher), `-`
(lower) or `?` (not a number) — one token each — or ends the episode when the guess is right. Reward:

    r = 1 − penalty · (t − 1)   solved at turn t
    r = 0                       not solved within search.max_turns

A policy that ignores the feedback solves by turn t at most t/(high+1) of the episodes (never repeating a
wrong guess); halving the interval each turn solves (2^t − 1)/(high+1) by turn t — with high 7 and 3 turns:
1/8, 3/8, 7/8. Evaluation (greedy) reports `solved_by_turn_<t>` for t = 1…max_turns and the share solved at each
turn among the episodes still open (`solved_at_turn_<t>_if_open`): learning to use the feedback shows as the
later turns' shares rising.
"""

from __future__ import annotations

import random

from tba.errors import ConfigError
from tba.tasks.base import Prompt

HIGHER, LOWER, NOT_A_NUMBER = "+", "-", "?"


class GuessEnv:
    """One episode: the guesses so far, and the turn that solved it (None while unsolved)."""

    def __init__(self, secret: int, penalty: float):
        self.secret, self.penalty, self.turns, self.solved_at = secret, penalty, 0, None

    def step(self, action: str) -> str | None:
        """The feedback on the guess `action`, or None when it is right (the episode ends)."""
        self.turns += 1
        guess = action.strip()
        if not (guess.isascii() and guess.isdigit()):  # (str.isdigit alone accepts '²')
            return NOT_A_NUMBER  # a malformed answer is an observation the policy can learn from
        if int(guess) == self.secret:
            self.solved_at = self.turns
            return None
        return HIGHER if int(guess) < self.secret else LOWER

    def get_reward(self) -> float:
        return 0.0 if self.solved_at is None else 1.0 - self.penalty * (self.solved_at - 1)


class GuessNumberTask:
    name = "guess_number"

    def __init__(self, high: int = 7, penalty: float = 0.25, train_size: int = 256, test_size: int = 256,
                 seed: int = 0):
        """high: the secret is uniform on 0…high (at most 9: one digit, one token); penalty: the reward lost per
        extra turn; seed: of the secrets."""
        if not 1 <= high <= 9 or not 0 <= penalty < 1:
            raise ConfigError(f"task.options: need 1 ≤ high ≤ 9 and 0 ≤ penalty < 1; got high {high}, "
                              f"penalty {penalty}")
        self.high, self.penalty = high, penalty
        rng = random.Random(seed)
        numbers = "".join(str(i) for i in range(high + 1))
        # every secret equally often over train and test together (shuffled): no secret is rare by chance
        secrets = [i % (high + 1) for i in range(train_size + test_size)]
        rng.shuffle(secrets)
        self.train = [Prompt(i, numbers, str(secrets[i]), {}) for i in range(train_size)]
        self.test = [Prompt(i, numbers, str(secrets[train_size + i]), {}) for i in range(test_size)]

    def environment(self, prompt: Prompt) -> GuessEnv:
        return GuessEnv(int(prompt.answer), self.penalty)

    def episode_metrics(self, episodes) -> dict[str, float]:
        """For each turn t: the share of episodes solved by t, and the share solved at t of those open before it."""
        turns = max((e.env.turns for e in episodes), default=0)
        solved = [e.env.solved_at for e in episodes]
        out = {}
        for t in range(1, turns + 1):
            out[f"solved_by_turn_{t}"] = sum(s is not None and s <= t for s in solved) / max(len(episodes), 1)
            still_open = [s for s in solved if s is None or s >= t]
            out[f"solved_at_turn_{t}_if_open"] = sum(s == t for s in still_open) / max(len(still_open), 1)
        return out

    # for the builtin tiny model: its tokenizer's corpus (one token per digit and per feedback sign)
    def corpus(self) -> list[str]:
        signs = (HIGHER, LOWER, NOT_A_NUMBER)
        return ["".join(f"{i}{signs[i % 3]}" for i in range(self.high + 1))] * 8
