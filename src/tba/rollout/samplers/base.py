"""The sampler seam: the engine a searcher generates with, behind two calls (see tba.rollout.samplers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tba.config.schema import LoraConfig, VLLMConfig


@dataclass(frozen=True)
class SamplerSpec:
    """How to build a searcher's sampler (tba.rollout.samplers): `target(spec, source=…, tokenizer=…, device=…, seed=…,
    policy=…)`."""

    target: str
    dtype: str
    """The weights' dtype (model.dtype)."""
    lora: LoraConfig | None
    """The policy's adapters when the run trains LoRA (the sampler wraps the base the same way), else None."""
    vllm: VLLMConfig
    max_model_len: int | None
    """Longest prompt + response the engine must plan for (None: the model's own limit)."""
    quantize: str = "none"
    """Sample from a quantized copy of each loaded policy (tba.rollout.quantize)."""
    takes_policy: bool = False
    fresh_process: bool = False
    child_env: str | None = None
    """These three: what the backend declares (tba.rollout.samplers.SamplerEntry)."""
    weight_transfer: str | None = None
    """Set by the runtime when weights reach the engine through its own transfer API rather than `load_weights`:
    "nccl" for search.weight_transport=vllm (tba.runtime.transport.vllm); None otherwise."""


class Sampler(Protocol):
    quantize_s: float
    """Seconds spent quantizing loaded policies (search.quantize); 0 for a sampler that does not quantize."""

    def generate(self, prompts: list[list[int]], *, num_samples: int, temperature: float, top_p: float,
                 max_new_tokens: int) -> list[tuple[list[int], list[float]]]:
        """For each prompt and then each of its samples: response ids (cut after the first EOS, which is kept)
        and the per-token log-probs of the distribution they were sampled from (logits ÷ T, top-k off)."""

    def stream(self, slots: int, *, temperature: float, top_p: float, recompute: bool = False):
        """A continuous batch of `slots` rows over this sampler's policy (a tba.rollout.stream.Engine) for
        search.batching=continuous; `recompute`: rows re-prefill their cache after a weight load
        (search.in_flight_cache); a backend without either raises UserError."""

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Replace the policy's weights in place with the trainer's (version = updates applied)."""

    def close(self) -> None:
        """Release the engine (processes, memory); the sampler is unusable afterwards."""
