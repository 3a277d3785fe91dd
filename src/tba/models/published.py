"""The published configs of common models, so that `tba plan` can plan them on a machine that has never downloaded
them (a laptop planning an 8-GPU node): `model.policy=Qwen/Qwen2.5-7B-Instruct` with no network and no cache.

Each entry is the model's `config.json` on the Hugging Face Hub (huggingface.co/<name>/blob/main/config.json),
reduced to what decides its shape and memory: the architecture (model_type), widths, depths, heads, the vocabulary,
whether the LM head is tied, the context length and the rotary settings. Only values read from a published config
are here (docs/plan.md names where each was checked); a name that is not here is read from a local directory, a
`config.json` or the Hugging Face cache, never guessed. tba.models.shape instantiates them on the meta device.
"""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig

_QWEN25 = {"model_type": "qwen2", "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "use_sliding_window": False}
_QWEN3 = {"model_type": "qwen3", "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "head_dim": 128,
          "attention_bias": False, "vocab_size": 151936}
_LLAMA3 = {"model_type": "llama", "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "vocab_size": 128256,
           "attention_bias": False, "mlp_bias": False}


def _llama31_rope(factor: float) -> dict:
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}


def _shape(base: dict, hidden: int, inter: int, layers: int, heads: int, kv: int, **rest) -> dict:
    return {**base, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, **rest}


_Q05 = _shape(_QWEN25, 896, 4864, 24, 14, 2, vocab_size=151936, tie_word_embeddings=True)
_Q15 = _shape(_QWEN25, 1536, 8960, 28, 12, 2, vocab_size=151936, tie_word_embeddings=True)
_Q3B = _shape(_QWEN25, 2048, 11008, 36, 16, 2, vocab_size=151936, tie_word_embeddings=True)
_Q7B = _shape(_QWEN25, 3584, 18944, 28, 28, 4, vocab_size=152064, tie_word_embeddings=False)
_L1B = _shape(_LLAMA3, 2048, 8192, 16, 32, 8, head_dim=64, tie_word_embeddings=True,
              max_position_embeddings=131072, rope_scaling=_llama31_rope(32.0))
_L3B = _shape(_LLAMA3, 3072, 8192, 28, 24, 8, head_dim=128, tie_word_embeddings=True,
              max_position_embeddings=131072, rope_scaling=_llama31_rope(32.0))
_L8B = _shape(_LLAMA3, 4096, 14336, 32, 32, 8, head_dim=128, tie_word_embeddings=False)

PUBLISHED: dict[str, dict] = {
    # Qwen2.5: the instruct models admit 32,768 positions; the base models' configs say 131,072 (1.5B and 7B)
    "Qwen/Qwen2.5-0.5B": {**_Q05, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-0.5B-Instruct": {**_Q05, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-1.5B": {**_Q15, "max_position_embeddings": 131072},
    "Qwen/Qwen2.5-1.5B-Instruct": {**_Q15, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-3B": {**_Q3B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-3B-Instruct": {**_Q3B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-7B": {**_Q7B, "max_position_embeddings": 131072},
    "Qwen/Qwen2.5-7B-Instruct": {**_Q7B, "max_position_embeddings": 32768},
    # Qwen3 (the post-trained models): head_dim 128 whatever the width; QK-norm is in the architecture
    "Qwen/Qwen3-0.6B": _shape(_QWEN3, 1024, 3072, 28, 16, 8, tie_word_embeddings=True,
                              max_position_embeddings=40960),
    "Qwen/Qwen3-1.7B": _shape(_QWEN3, 2048, 6144, 28, 16, 8, tie_word_embeddings=True,
                              max_position_embeddings=40960),
    "Qwen/Qwen3-4B": _shape(_QWEN3, 2560, 9728, 36, 32, 8, tie_word_embeddings=True,
                            max_position_embeddings=40960),
    "Qwen/Qwen3-8B": _shape(_QWEN3, 4096, 12288, 36, 32, 8, tie_word_embeddings=False,
                            max_position_embeddings=40960),
    # Llama 3.x: 3.1 and 3.2 stretch an 8,192-position RoPE (llama3 scaling) to 131,072; Llama 3 (8B) is 8,192
    "meta-llama/Llama-3.2-1B": _L1B,
    "meta-llama/Llama-3.2-1B-Instruct": _L1B,
    "meta-llama/Llama-3.2-3B": _L3B,
    "meta-llama/Llama-3.2-3B-Instruct": _L3B,
    "meta-llama/Llama-3.1-8B": {**_L8B, "max_position_embeddings": 131072, "rope_scaling": _llama31_rope(8.0)},
    "meta-llama/Llama-3.1-8B-Instruct": {**_L8B, "max_position_embeddings": 131072,
                                         "rope_scaling": _llama31_rope(8.0)},
    "meta-llama/Meta-Llama-3-8B": {**_L8B, "max_position_embeddings": 8192},
    "meta-llama/Meta-Llama-3-8B-Instruct": {**_L8B, "max_position_embeddings": 8192},
}
"""Hub name → the shape-deciding values of its published config.json."""


def published_config(name: str) -> PretrainedConfig | None:
    """The config of a model in the table (its name as on the Hub, any letter case), or None."""
    match = next((values for key, values in PUBLISHED.items() if key.lower() == name.strip().lower()), None)
    if match is None:
        return None
    values = dict(match)
    return AutoConfig.for_model(values.pop("model_type"), **values)
