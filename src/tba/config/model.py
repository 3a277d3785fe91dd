"""The model sections of the config schema (tba.config.schema): which policy and reference, their precision and
device, LoRA adapters, the builtin model's shape, and the SFT warm start that builtin models get before RL.
"""

from __future__ import annotations

from dataclasses import dataclass

from tba.config.rules import devices, one_of, or_none, positive, probability, setting
from tba.errors import ConfigError


@dataclass
class TinyModelConfig:
    """The built-in Llama-style model used when `model.policy` is `builtin`."""

    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 4
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads (as many key/value heads: no grouped-query attention)."""
    intermediate_size: int = 512
    """Width of each block's SwiGLU MLP."""
    vocab_size: int = 128
    """Upper bound for the locally trained BPE tokenizer."""


@dataclass
class LoraConfig:
    """Train low-rank adapters (PEFT LoRA) instead of every weight; only the adapters are optimised,
    published to searchers and checkpointed. The reference π_ref is the base model (adapters off)."""

    enabled: bool = False
    """Train adapters instead of every weight (needs a hub, directory or GGUF policy)."""
    r: int = setting(32, positive)
    """Adapter rank."""
    alpha: int = setting(16, positive)
    """LoRA α: the adapter's update is scaled by α / r."""
    dropout: float = setting(0.0, probability)
    """PEFT's lora_dropout. Must be 0: the trainer keeps the policy in eval mode (dropout off, so log π_θ and
    the searchers' log-probs are of the same deterministic model)."""
    target_modules: str = "all-linear"
    """Comma-separated module names (e.g. q_proj,v_proj) or all-linear."""

    def check(self) -> None:
        if self.enabled and self.dropout > 0:
            raise ConfigError("model.lora.dropout: must be 0 — the trainer runs the policy with dropout off, as TB "
                              "compares log π_θ with the searchers' log π_ref (docs/algorithm.md)")


@dataclass
class ModelConfig:
    policy: str = "builtin"
    """Hub name, local directory (save_pretrained layout), `.gguf` file, `package:MODULE/FILE`, or `builtin`
    (tiny model built from a config)."""
    reference: str | None = None
    """Reference model π_ref. None = the policy's starting weights (after the SFT warm start)."""
    dtype: str = setting("float32", one_of(("float32", "bfloat16", "float16")))
    """float32 | bfloat16 | float16: the weights' (and Adam's moments', and the published weights')."""
    autocast: str | None = setting(None, or_none(one_of(("bfloat16", "float16"))))
    """Mixed precision (torch.autocast) for every forward: the trainer's, the searchers' sampling and π_ref
    scoring, evaluation; the weights stay model.dtype (tba.models.precision). null = compute in model.dtype.
    bfloat16 is TRL's `bf16=True`; on a CPU with AMX it trains and samples faster, but TB learns less per update
    under it (docs/results.md, "Mixed precision"): leave it off for TB runs."""
    device: str = setting("cpu", devices)
    """Where the trainer's policy and reference live: cpu | cuda | cuda:N | auto (cuda if available)."""
    lora: LoraConfig = setting(factory=LoraConfig)
    """PEFT LoRA adapters (the `model.lora.*` section)."""
    tiny: TinyModelConfig = setting(factory=TinyModelConfig)
    """Shape of the builtin model (used when policy is `builtin`)."""


@dataclass
class SFTConfig:
    enabled: bool = True
    """Run the SFT warm start before RL when the policy is `builtin` (cached; see `cache_dir`)."""
    steps: int = 1500
    """SFT steps of the builtin model's warm start: enough that its held-out accuracy has plateaued (a start
    still mid-curve can leave RL nothing to fix; tba.run.sft warns when it sees one)."""
    lr: float = 3e-3
    """Peak learning rate of the warm start (AdamW, linear warm-up then cosine decay to 10 %)."""
    batch_size: int = setting(64, positive)
    """Demonstrations per SFT step."""
    warmup_steps: int = 50
    """Linear warm-up steps of the SFT learning rate."""
    seed: int | None = None
    """The warm start's seed; None = the run's. A fixed one lets RL seeds vary over one start, as an ablation of an
    RL setting wants (the start's own spread then does not enter the comparison)."""
    cache_dir: str | None = None
    """Where warm-start checkpoints are cached. None = $TBA_CACHE or ~/.cache/tba."""
    log_every_steps: int = 100
    """Held-out greedy accuracy is measured and printed every this many SFT steps (not part of the cache key)."""
