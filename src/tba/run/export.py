"""`tba export RUN_DIR OUT_DIR`: the run's policy as a plain `save_pretrained` model a user can serve.

The source is the run's final policy (RUN_DIR/checkpoint), or — for a run that was stopped or killed — the
policy of its newest usable full checkpoint. A LoRA policy is merged into its base (PEFT
`merge_and_unload`), so OUT_DIR needs neither PEFT nor the base model; the tokenizer is saved beside it,
with its chat template when it has one. The export is then loaded back with
`AutoModelForCausalLM.from_pretrained` to prove it is complete.
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml
from transformers import AutoModelForCausalLM

import tba.run.checkpoint as ckpt
from tba.errors import UserError
from tba.models import load_model, load_tokenizer

logger = logging.getLogger(__name__)


class ExportError(UserError, RuntimeError):
    """Nothing to export, or the export could not be written or read back."""


def policy_source(run_dir: Path) -> Path:
    """Where the run's newest policy is: its final checkpoint, else its newest usable full checkpoint."""
    final = run_dir / "checkpoint"
    if (final / "config.json").is_file() or (final / "adapter_config.json").is_file():
        return final
    latest = ckpt.latest(run_dir)
    if latest is None:
        raise ExportError(f"{run_dir}: no final policy (checkpoint/) and no full checkpoint (checkpoints/) to export")
    logger.info(f"{run_dir} has no final policy (stopped early?): exporting checkpoint {latest.name}")
    return latest / "model"


def saved_dtype(run_dir: Path) -> str:
    """The run's `model.dtype`, read from its saved config.yaml (float32 if there is none)."""
    path = run_dir / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text()) if path.is_file() else {}
    except yaml.YAMLError as e:
        raise ExportError(f"{path}: not valid YAML: {e}") from None
    return ((config or {}).get("model") or {}).get("dtype") or "float32"


def export(run_dir: str | Path, out_dir: str | Path) -> Path:
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir}: no such run directory")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ExportError(f"{out_dir} exists and is not empty: choose a new directory")
    dtype = saved_dtype(run_dir)
    source = policy_source(run_dir)
    model, tokenizer = load_model(str(source), dtype), load_tokenizer(str(source))
    if getattr(model, "peft_config", None):
        model = model.merge_and_unload()  # W ← W + (α/r)·B·A in every adapted layer; plain modules again
        logger.info(f"LoRA adapters of {source} merged into the base model")
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    try:
        AutoModelForCausalLM.from_pretrained(out_dir)
    except (OSError, ValueError) as e:
        raise ExportError(f"the export in {out_dir} does not load back: {e}") from e
    template = " with its chat template" if getattr(tokenizer, "chat_template", None) else ""
    logger.info(f"exported {source} → {out_dir} (safetensors, tokenizer{template}); "
        f"load with AutoModelForCausalLM.from_pretrained({str(out_dir)!r}) or vllm.LLM({str(out_dir)!r})")
    return out_dir
