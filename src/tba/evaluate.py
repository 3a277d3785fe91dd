"""Held-out evaluation: greedy pass@1, independent of the runtime."""

from __future__ import annotations

import torch

from tba.generation import generate
from tba.tasks.base import Prompt, accuracy


@torch.no_grad()
def greedy_completions(model, tokenizer, prompts: list[Prompt], max_new_tokens: int, batch_size: int) -> list[str]:
    was_training = model.training
    model.eval()
    texts = []
    for start in range(0, len(prompts), batch_size):
        chunk = [tokenizer(p.text)["input_ids"] for p in prompts[start:start + batch_size]]
        out = generate(model, chunk, greedy=True, max_new_tokens=max_new_tokens,
                       eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
        texts.extend(tokenizer.batch_decode([r for r, _ in out], skip_special_tokens=True))
    model.train(was_training)
    return texts


def greedy_accuracy(model, tokenizer, task, prompts: list[Prompt], max_new_tokens: int, batch_size: int) -> float:
    return accuracy(task, prompts, greedy_completions(model, tokenizer, prompts, max_new_tokens, batch_size))
