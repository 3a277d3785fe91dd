"""The Hugging Face backend: the searcher's own policy copy, sampled with tba.models.generation.generate.

Weights load in place with `load_synced` (a copy into each existing tensor), so the model object, its
device and dtype never change across versions. With `search.quantize`, each loaded version is then copied into
a quantized model (tba.rollout.quantize) that generates instead; the seconds that takes are `quantize_s`.
"""

from __future__ import annotations

import time

import torch

from tba.models import apply_lora, load_model, load_synced
from tba.models.continuous import ContinuousBatch
from tba.models.generation import DecodeStats, generate
from tba.rollout.quantize import QuantizedModel
from tba.rollout.samplers.base import SamplerSpec


class HFSampler:
    def __init__(self, model, tokenizer, quantize: str = "none"):
        self.model = model.eval()
        self.eos_id, self.pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.quantize, self.quantize_s, self.quantized = quantize, 0.0, None
        self.decode = DecodeStats()
        self._stream: ContinuousBatch | None = None
        """What the static decode loop's steps were spent on (bench/perf/continuous.py reads it)."""
        if quantize != "none":
            t0 = time.perf_counter()
            self.quantized = QuantizedModel(self.model, quantize)
            self.quantize_s += time.perf_counter() - t0

    @property
    def sampling(self):
        """The model that generates: the quantized copy with search.quantize, else the model itself."""
        return self.model if self.quantized is None else self.quantized.quantized

    def generate(self, prompts: list[list[int]], *, num_samples: int, temperature: float, top_p: float,
                 max_new_tokens: int) -> list[tuple[list[int], list[float]]]:
        return generate(self.sampling, prompts, num_samples=num_samples, temperature=temperature, top_p=top_p,
                        max_new_tokens=max_new_tokens, eos_id=self.eos_id, pad_id=self.pad_id, stats=self.decode)

    def stream(self, slots: int, *, temperature: float, top_p: float, recompute: bool = False) -> ContinuousBatch:
        self._stream = ContinuousBatch(self.sampling, slots, temperature=temperature, top_p=top_p,
                                       eos_id=self.eos_id, pad_id=self.pad_id, recompute=recompute)
        return self._stream

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        load_synced(self.model, weights)
        if self.quantized is not None:
            t0 = time.perf_counter()
            self.quantized.refresh()
            self.quantize_s += time.perf_counter() - t0
            if self._stream is not None:  # a scheme that re-quantizes into a new model object
                self._stream.model = self.sampling

    def close(self) -> None:
        pass


def build(spec: SamplerSpec, *, source: str, tokenizer, device, seed: int, policy=None) -> HFSampler:
    """`search.backend=hf` (tba.rollout.samplers.SAMPLERS): `policy` if given (the inline runtime passes a copy of the
    trainer's), else the model loaded from `source` (with LoRA adapters when the run trains LoRA: the trainer's
    arrive with the first weights)."""
    if policy is None:
        policy = load_model(source, spec.dtype)
        if spec.lora is not None and not getattr(policy, "peft_config", None):
            policy = apply_lora(policy, spec.lora)
    return HFSampler(policy.to(device), tokenizer, spec.quantize)
