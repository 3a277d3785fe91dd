"""Models: load policy, reference and tokenizer through transformers, wrap LoRA adapters, and name the tensors
the trainer publishes to its searchers.

Users pass a hub name or a local `save_pretrained` directory, exactly what they would give transformers; other
kinds of source (a `.gguf` file, a file inside an installed package) are turned into one by tba.models.sources.
The offline built-in model is tba.models.builtin; decoding and per-token log-probs are tba.models.generation
(responses of very different lengths split into forwards by tba.models.length_buckets), continuous batching
tba.models.continuous.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

from tba.config.schema import LoraConfig
from tba.models.sources import ModelLoadError, offline_hint, resolve_source

transformers_logging.disable_progress_bar()  # per-file "Loading weights" bars from every searcher drown the log
# PEFT calls a transformers property deprecated in v5 on every LoRA forward setup; users can do nothing about it
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*is deprecated", category=FutureWarning)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerFast:
    name_or_path = resolve_source(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        if Path(name_or_path).exists():
            raise
        raise offline_hint(name_or_path, e) from e
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
        raise offline_hint(name_or_path, e) from e
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
    """Copy published `tensors` (see `synced_tensors`) into `model`, on whatever device it lives.

    Why the autocast cache is cleared: under torch.autocast a forward keeps the low-precision copy of each weight
    (that requires grad) until the outermost autocast context exits, and an in-place load does not invalidate it —
    a load inside one (search.weight_update=in_flight, a multi-turn episode's next turn, with model.autocast) would
    otherwise leave the sampler generating with the old weights while its tokens are stamped with the new version.
    """
    target = synced_tensors(model)
    if target.keys() != tensors.keys():
        missing, extra = sorted(target.keys() - tensors.keys()), sorted(tensors.keys() - target.keys())
        raise ValueError(f"published weights do not match the model: missing {missing[:3]}, unexpected {extra[:3]}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            target[name].copy_(tensor)
    torch.clear_autocast_cache()


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


def save_checkpoint(model, tokenizer, path: Path) -> None:
    """save_pretrained (safetensors) for both, so `AutoModelForCausalLM.from_pretrained(path)` works."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def save_buckets(path: Path, buckets, *, config, generation_config=None, peft=None) -> None:
    """A `from_pretrained` directory written from `buckets` of named host tensors as they come (a sharded trainer's
    master weights, gathered a bucket at a time: no process ever holds the whole model): one safetensors file per
    bucket plus transformers' index, or one file when a single bucket holds everything. `peft`: a PEFT model whose
    adapters the buckets hold — written as PEFT saves them (adapter_config.json, adapter_model.safetensors, adapter
    names stripped), loadable with tba.models.load_model."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    if peft is not None:
        from peft.utils import get_peft_model_state_dict

        state = {k: v for bucket in buckets for k, v in bucket.items()}
        save_file(get_peft_model_state_dict(peft, state_dict=state), str(path / "adapter_model.safetensors"),
                  metadata={"format": "pt"})
        peft.peft_config["default"].save_pretrained(str(path))
        return
    config.save_pretrained(path)
    if generation_config is not None:
        generation_config.save_pretrained(path)
    files, weight_map, total = [], {}, 0
    for bucket in buckets:
        if not bucket:
            continue
        name = f"part-{len(files):05d}.safetensors"
        save_file({k: v.contiguous() for k, v in bucket.items()}, str(path / name), metadata={"format": "pt"})
        files.append(name)
        for k, v in bucket.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()
    if len(files) == 1:
        (path / files[0]).rename(path / "model.safetensors")
        return
    final = {f: f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i, f in enumerate(files)}
    for old, new in final.items():
        (path / old).rename(path / new)
    index = {"metadata": {"total_size": total}, "weight_map": {k: final[f] for k, f in weight_map.items()}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
