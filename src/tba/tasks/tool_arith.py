"""`tool_arith`: multiplication a small model gets wrong alone, with a calculator it can call.

Each problem is a × b with `digits`-digit factors (SmolLM2-135M-Instruct multiplies two 3-digit numbers right
almost never). The prompt is a chat: a system message that describes the `calculator` tool (tba.tasks.tools) with one
worked call, then the question. An episode (tba.rollout.episodes, tba.tasks.tools.ToolEnv): each policy turn that
writes a tool
call gets the calculator's result back as a `tool` message; the first turn without a call is the answer, and
its reward is 1 when the last number in it is a × b, else 0. The skill RL must find is calling the tool and
copying its result into the answer.

Evaluation adds `tool/called_share` (episodes that called the calculator), `tool/score_with_call` and
`tool/score_without_call` (the reward of each kind) and `tool/malformed_share` (tba.tasks.tools.tool_metrics).
"""

from __future__ import annotations

import random
import re

from tba.tasks.base import Prompt
from tba.tasks.tools import ToolEnv, calculator, call_text, describe_tools, tool_metrics

NUMBER = re.compile(r"-?\d[\d,]*")
EXAMPLE = ('Example: for "What is 12 * 34?" write <tool_call>{"name": "calculator", "arguments": {"expression": '
           '"12 * 34"}}</tool_call>, read the result, then answer "408".')


def last_number(text: str) -> str | None:
    found = NUMBER.findall(text or "")
    return found[-1].replace(",", "") if found else None


class ToolArithTask:
    name = "tool_arith"

    def __init__(self, digits: int = 3, train_size: int = 2000, test_size: int = 200, seed: int = 0):
        rng = random.Random(seed)
        system = describe_tools([calculator]) + "\n" + EXAMPLE

        def problem(i: int) -> Prompt:
            a, b = (rng.randint(10 ** (digits - 1), 10 ** digits - 1) for _ in range(2))
            question = f"What is {a} * {b}?"
            return Prompt(i, question, str(a * b), {"a": a, "b": b,
                                                    "messages": [{"role": "system", "content": system},
                                                                 {"role": "user", "content": question}]})

        self.train = [problem(i) for i in range(train_size)]
        self.test = [problem(i) for i in range(test_size)]
        self.tokenizer = None  # the run's (`use_tokenizer`): the calculator's answer is a chat turn it renders

    def use_tokenizer(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def environment(self, prompt: Prompt) -> ToolEnv:
        return ToolEnv([calculator], score=lambda answer: float(last_number(answer) == prompt.answer),
                       tokenizer=self.tokenizer)

    def demonstrations(self, prompts: list[Prompt], seed: int) -> list[list[str]]:
        """An expert's two turns per prompt — the tool call, then the answer read from its result — for
        `data.source: task` (tba.rollout.demonstrations plays them through the environment, which writes the result)."""
        rng = random.Random(seed)
        answers = ("{a} * {b} = {p}", "The answer is {p}.", "{p}")
        return [[call_text("calculator", expression=f"{p.meta['a']} * {p.meta['b']}"),
                 rng.choice(answers).format(a=p.meta["a"], b=p.meta["b"], p=p.answer)] for p in prompts]

    def episode_metrics(self, episodes) -> dict[str, float]:
        return tool_metrics(episodes)
