"""The sampler seam: the engine a searcher generates with, behind two calls.

A searcher needs exactly two things from whatever produces its completions:

    generate(prompt token ids, num_samples, temperature, top_p, max_new_tokens)
        → per prompt, then per sample: (response token ids, behaviour log-probs of softmax(logits / T))
    load_weights(named tensors, version)
        → the trainer's newest policy, as `tba.models.synced_tensors` names it (the state dict, or a LoRA
          policy's adapters), on whatever device and dtype the transport delivered them

Everything else — prompts, reference log-probs (always the HF reference forward, the same code as the
trainer's, so TB's residual compares like with like), rewards, versions — stays in `tba.searcher`.
Backends: `hf` (the transformers model, decoded by tba.generation.generate) and `vllm` (vllm.LLM in the
searcher's process, tba.samplers.vllm). `search.backend` picks one.
"""

from __future__ import annotations

from typing import Protocol

import torch

BACKENDS = ("hf", "vllm")


class Sampler(Protocol):
    def generate(self, prompts: list[list[int]], *, num_samples: int, temperature: float, top_p: float,
                 max_new_tokens: int) -> list[tuple[list[int], list[float]]]:
        """For each prompt and then each of its samples: response ids (cut after the first EOS, which is kept)
        and the per-token log-probs of the distribution they were sampled from (logits ÷ T, top-k off)."""

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Replace the policy's weights in place with the trainer's (version = updates applied)."""

    def close(self) -> None:
        """Release the engine (processes, memory); the sampler is unusable afterwards."""


def build_sampler(cfg, *, source: str, tokenizer, device: torch.device, seed: int, policy=None) -> Sampler:
    """`cfg.search.backend`'s sampler for one searcher (cfg: a RunConfig).

    hf: `policy` if given (the inline runtime passes a copy of the trainer's), else the model loaded from
    `source` (with LoRA adapters when the run trains LoRA: the trainer's arrive with the first weights).
    vllm: an engine over `source` (a save_pretrained directory or hub name; it loads its own copy).
    """
    if cfg.search.backend == "hf":
        from tba.models import apply_lora, load_model
        from tba.samplers.hf import HFSampler

        if policy is None:
            policy = load_model(source, cfg.model.dtype)
            if cfg.model.lora.enabled and not getattr(policy, "peft_config", None):
                policy = apply_lora(policy, cfg.model.lora)
        return HFSampler(policy.to(device), tokenizer)
    if cfg.search.backend == "vllm":
        from tba.samplers.vllm import VLLMSampler

        return VLLMSampler(source, tokenizer, cfg=cfg, device=device, seed=seed)
    raise ValueError(f"unknown search.backend {cfg.search.backend!r}; choose one of {', '.join(BACKENDS)}")
