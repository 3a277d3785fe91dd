"""`tba export RUN_DIR OUT_DIR`: the run's policy as a plain `save_pretrained` model a user can serve.

The source is the run's final policy (RUN_DIR/checkpoint), or — for a run that was stopped or killed — the
policy of its newest usable full checkpoint. A LoRA policy is merged into its base (PEFT
`merge_and_unload`), so OUT_DIR needs neither PEFT nor the base model; the tokenizer is saved beside it,
with its chat template when it has one. The export is then loaded back with
`AutoModelForCausalLM.from_pretrained` to prove it is complete.
"""

from __future__ import annotations

from pathlib import Path

from tba import checkpoint as ckpt


class ExportError(RuntimeError):
    """Nothing to export, or the export could not be written or read back."""


def policy_source(run_dir: Path, log=print) -> Path:
    """Where the run's newest policy is: its final checkpoint, else its newest usable full checkpoint."""
    final = run_dir / "checkpoint"
    if (final / "config.json").is_file() or (final / "adapter_config.json").is_file():
        return final
    latest = ckpt.latest(run_dir, log=log)
    if latest is None:
        raise ExportError(f"{run_dir}: no final policy (checkpoint/) and no full checkpoint (checkpoints/) to export")
    log(f"{run_dir} has no final policy (stopped early?): exporting checkpoint {latest.name}")
    return latest / "model"


def export(run_dir: str | Path, out_dir: str | Path, log=print) -> Path:
    from transformers import AutoModelForCausalLM

    from tba.config import load_config
    from tba.models import load_model, load_tokenizer

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir}: no such run directory")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ExportError(f"{out_dir} exists and is not empty: choose a new directory")
    dtype = load_config(str(run_dir / "config.yaml")).model.dtype if (run_dir / "config.yaml").is_file() else "float32"
    source = policy_source(run_dir, log)
    model, tokenizer = load_model(str(source), dtype), load_tokenizer(str(source))
    if getattr(model, "peft_config", None):
        model = model.merge_and_unload()  # W ← W + (α/r)·B·A in every adapted layer; plain modules again
        log(f"LoRA adapters of {source} merged into the base model")
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    try:
        AutoModelForCausalLM.from_pretrained(out_dir)
    except (OSError, ValueError) as e:
        raise ExportError(f"the export in {out_dir} does not load back: {e}") from e
    template = " with its chat template" if getattr(tokenizer, "chat_template", None) else ""
    log(f"exported {source} → {out_dir} (safetensors, tokenizer{template}); "
        f"load with AutoModelForCausalLM.from_pretrained({str(out_dir)!r}) or vllm.LLM({str(out_dir)!r})")
    return out_dir
