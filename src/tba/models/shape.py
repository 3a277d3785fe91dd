"""A model's shape without its weights: parameter counts and the sizes memory depends on, read from a config and
a model instantiated on torch's `meta` device (no tensor is allocated, so a 70B shape costs as little as a tiny one).

Why meta and not the config's arithmetic: architectures differ in what they count (tied heads, biases, norms,
extra projections), and `from_config` on the meta device counts exactly what `from_pretrained` would allocate.
tba.run.plan turns the shape into bytes per device.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from tba.config.schema import LoraConfig, TinyModelConfig
from tba.models.builtin import tiny_config
from tba.models.published import PUBLISHED, published_config
from tba.models.sources import ModelLoadError, cached_gguf, package_path


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on. Counts are of unique tensors: a tied head is counted once in `params`."""

    params: int
    """Every parameter (tied weights once)."""
    linear_params: int
    """Weights of the `nn.Linear` layers, the LM head included (its own copy when tied: a quantized copy unties it)."""
    other_params: int
    """Every parameter but the linear layers' own weights (embeddings — a tied head's weight with them —, norms,
    biases): what a quantized copy keeps unquantized."""
    kept_linear_params: int
    """Of those, the MLP down projections' (in_features = intermediate size): CPU int8 keeps them in float32
    (tba.rollout.quantize.kept_full_precision)."""
    layer_params: int
    """One decoder layer's parameters (what FSDP gathers per unit)."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    context: int
    """max_position_embeddings: the longest sequence the model admits."""
    lora: dict
    """Linear layer name → (in_features, out_features) of every layer LoRA may adapt (not the LM head)."""

    def lora_params(self, cfg: LoraConfig) -> int:
        """Adapter parameters PEFT adds: r × (in + out) per targeted linear layer (A is r×in, B is out×r).
        all-linear targets every linear layer but the output head, as PEFT does; a list matches the last name part."""
        names = None if cfg.target_modules == "all-linear" else {
            t.strip() for t in cfg.target_modules.split(",") if t.strip()}
        return sum(cfg.r * (i + o) for n, (i, o) in self.lora.items() if names is None or n.rsplit(".", 1)[-1] in names)


def shape_of(config: PretrainedConfig) -> ModelShape:
    """The shape of the causal LM `config` describes, instantiated on the meta device."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings().weight
    text = config.get_text_config()
    intermediate = getattr(text, "intermediate_size", 0) or 0
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    layers = int(text.num_hidden_layers)
    heads = int(text.num_attention_heads)
    hidden = int(text.hidden_size)
    blocks = [m for n, m in model.named_modules() if n.endswith(f"layers.{layers - 1}")]
    return ModelShape(
        params=params,
        linear_params=sum(m.weight.numel() for m in linears.values()),
        other_params=params - sum(m.weight.numel() for m in linears.values() if m.weight is not embeddings),
        kept_linear_params=sum(m.weight.numel() for m in linears.values() if m.in_features == intermediate),
        layer_params=sum(p.numel() for p in blocks[0].parameters()) if blocks else params // max(layers, 1),
        layers=layers, hidden=hidden, heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        intermediate=int(intermediate), vocab=int(text.vocab_size),
        context=int(getattr(text, "max_position_embeddings", 0) or 0),
        lora={n: (m.in_features, m.out_features) for n, m in linears.items() if m is not head})


def builtin_shape(tiny: TinyModelConfig) -> ModelShape:
    """The builtin model's shape. Its tokenizer is trained at run time with at most `vocab_size` tokens: the plan
    takes that bound."""
    return shape_of(tiny_config(tiny, tiny.vocab_size, bos=1, eos=2, pad=0))


def source_config(name: str) -> PretrainedConfig:
    """The config of a hub name, directory, `config.json`, `.gguf` file or `package:` source, from local files only
    (never the network, never a weight file: a `.gguf` not converted yet is read from its metadata). A hub name that
    is in no local cache is taken from the published configs of common models (tba.models.published), so a plan
    needs no download."""
    path = package_path(name)
    if path.endswith(".gguf"):
        converted = cached_gguf(Path(path))
        if converted is None:
            if not Path(path).is_file():
                raise ModelLoadError(f"GGUF file not found: {path}")
            return AutoConfig.from_pretrained(Path(path).parent, gguf_file=Path(path).name)
        path = str(converted)
    adapter = Path(path) / "adapter_config.json"
    if adapter.is_file():  # a LoRA checkpoint: its base model's shape
        return source_config(json.loads(adapter.read_text())["base_model_name_or_path"])
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        known = published_config(name)
        if known is not None:
            return known
        raise ModelLoadError(f"the config of '{name}' is not available offline (not a local directory or config.json, "
                             f"not in the Hugging Face cache, not among the published shapes tba knows: "
                             f"{', '.join(PUBLISHED)}): {type(e).__name__}") from None


@functools.lru_cache(maxsize=32)
def _source_shape(name: str) -> ModelShape:
    return shape_of(source_config(name))


def model_shape(policy: str, tiny: TinyModelConfig) -> ModelShape:
    """The shape of `model.policy` (or another model a searcher group samples): builtin from `model.tiny`. A
    source's shape is computed once per process (a plan searching for the change that fits re-plans often)."""
    return builtin_shape(tiny) if policy == "builtin" else _source_shape(policy)
