"""The Hugging Face backend: the searcher's own policy copy, sampled with tba.generation.generate.

Weights load in place with `load_synced` (a copy into each existing tensor), so the model object, its
device and dtype never change across versions.
"""

from __future__ import annotations

import torch

from tba.generation import generate
from tba.models import load_synced


class HFSampler:
    def __init__(self, model, tokenizer):
        self.model = model.eval()
        self.eos_id, self.pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id

    def generate(self, prompts: list[list[int]], *, num_samples: int, temperature: float, top_p: float,
                 max_new_tokens: int) -> list[tuple[list[int], list[float]]]:
        return generate(self.model, prompts, num_samples=num_samples, temperature=temperature, top_p=top_p,
                        max_new_tokens=max_new_tokens, eos_id=self.eos_id, pad_id=self.pad_id)

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        load_synced(self.model, weights)

    def close(self) -> None:
        pass


def build(cfg, source: str, tokenizer, device, seed: int, policy=None) -> HFSampler:
    """`search.backend=hf` (tba.samplers.SAMPLERS): `policy` if given (the inline runtime passes a copy of the
    trainer's), else the model loaded from `source` (with LoRA adapters when the run trains LoRA: the trainer's
    arrive with the first weights)."""
    from tba.models import apply_lora, load_model

    if policy is None:
        policy = load_model(source, cfg.model.dtype)
        if cfg.model.lora.enabled and not getattr(policy, "peft_config", None):
            policy = apply_lora(policy, cfg.model.lora)
    return HFSampler(policy.to(device), tokenizer)
