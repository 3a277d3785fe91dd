"""A custom task in one file: any reasoning-gym dataset as a verifiable RL task for tba.

    tba train task.name=examples/reasoning_gym_task.py:make_task 'task.options={dataset: chain_sum}'

tba needs four things from a task (tba.tasks.base.Task): a `name`, `train` and `test` lists of `Prompt`, and
`reward(prompt, completion) -> float`. With the built-in tiny model (`model.policy=builtin`) it also needs
`demonstrations(prompts, seed)` (completions for the SFT warm start) and `corpus()` (text for its tokenizer);
with a pretrained model those two are never called. Nothing else in tba changes: searchers, buffer, trainer
and evaluation only ever call these. A reward that raises or returns NaN drops that sample (counted).
"""

from __future__ import annotations

import reasoning_gym

from tba.tasks.base import Prompt


class ReasoningGymTask:
    def __init__(self, dataset: str, train_size: int, test_size: int, seed: int, **dataset_options):
        self.name = f"reasoning_gym/{dataset}"
        train = reasoning_gym.create_dataset(dataset, size=train_size, seed=seed, **dataset_options)
        test = reasoning_gym.create_dataset(dataset, size=test_size, seed=seed + 1, **dataset_options)
        self._scorer = train  # score_answer depends on the dataset type, not on the seed
        held_out = {e["question"] for e in test}
        self.train = [Prompt(i, e["question"] + "\nAnswer:", e["answer"], {"entry": e})
                      for i, e in enumerate(x for x in train if x["question"] not in held_out)]
        self.test = [Prompt(i, e["question"] + "\nAnswer:", e["answer"], {"entry": e}) for i, e in enumerate(test)]

    def reward(self, prompt: Prompt, completion: str) -> float:
        # reasoning-gym's own verifier: 1.0 for a correct answer, partial credit for some datasets
        return float(self._scorer.score_answer(answer=completion.strip(), entry=prompt.meta["entry"]))

    def demonstrations(self, prompts: list[Prompt], seed: int) -> list[str]:
        return [" " + p.answer for p in prompts]

    def corpus(self) -> list[str]:
        return [p.text + " " + p.answer for p in self.train[:2000]]


def make_task(dataset: str = "chain_sum", train_size: int = 2000, test_size: int = 100, seed: int = 0,
              **dataset_options) -> ReasoningGymTask:
    """The factory tba calls with `task.options` as keyword arguments, plus task.train_size and task.test_size
    because it names them."""
    return ReasoningGymTask(dataset, train_size, test_size, seed, **dataset_options)
