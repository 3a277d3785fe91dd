"""What `tba serve RECIPE_OR_RUN` serves: the recipe's starting policy, or a run's newest policy, behind the sampler
the recipe names (search.backend), on the first searcher's device and dtype.

Why from the config, as a searcher does: a harness developed against `tba serve` should see the policy exactly as
the searchers will sample it in training — same weights, same backend, same dtype, same chat template — so what
it learns of the endpoint holds when training starts. A run directory serves its final policy (checkpoint/), else
its newest usable full checkpoint (checkpoints/step_N/model), at the version that checkpoint was trained to, so
the tokens it serves carry the versions a training run would give them.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tba.config import RunConfig, load_config
from tba.errors import UserError
from tba.models import load_tokenizer, resolve_device, save_checkpoint
from tba.models.shape import source_config
from tba.run import checkpoint as ckpt
from tba.run.build import build_models, build_task
from tba.run.export import policy_source
from tba.run.placement import searcher_dtype, searcher_placements
from tba.run.searchers import sampler_spec
from tba.runtime.worker import build_sampler

logger = logging.getLogger(__name__)


class ServeError(UserError):
    label = "serve"


@dataclass
class Served:
    sampler: object
    """A tba.rollout.samplers Sampler (hf or vllm)."""
    tokenizer: object
    version: int
    """The policy version every served token records."""
    name: str
    """The model name clients send (GET /v1/models)."""
    max_model_len: int
    slots: int
    source: str
    """Where the weights came from (a directory, a hub name, or "builtin")."""
    cleanup: tempfile.TemporaryDirectory | None = None

    def close(self) -> None:
        self.sampler.close()
        if self.cleanup is not None:
            self.cleanup.cleanup()


def is_run_dir(target: str) -> bool:
    return (Path(target) / "config.yaml").is_file() and Path(target).is_dir()


def load(target: str, overrides: list[str]) -> tuple[RunConfig, Path | None]:
    """(the config, the run directory or None): a run directory's saved config, else a recipe."""
    if is_run_dir(target):
        return load_config(Path(target) / "config.yaml", overrides), Path(target)
    return load_config(target, overrides), None


def run_version(run_dir: Path, source: Path) -> int:
    """The trainer version of a run's policy: summary.json's steps for the final one, state.json's for a
    checkpoint."""
    if source == run_dir / "checkpoint":
        summary = run_dir / "summary.json"
        try:
            return int(json.loads(summary.read_text())["trainer_steps"])
        except (OSError, ValueError, KeyError, TypeError):
            logger.warning(f"{summary}: no trainer_steps; serving {source} as version 0")
            return 0
    return int(ckpt.load(source.parent).get("version", 0))


def served(cfg: RunConfig, run_dir: Path | None, *, name: str | None = None, slots: int | None = None,
           max_model_len: int | None = None) -> Served:
    """Build the policy's sampler as the run's first searcher would, on its device and dtype."""
    placement = searcher_placements(cfg)[0]
    spec = sampler_spec(cfg, placement.search, rank=placement.rank, dtype=searcher_dtype(cfg, placement.device))
    device = resolve_device(placement.device.split("+")[0])
    cleanup, policy = None, None
    if run_dir is not None:
        source = policy_source(run_dir)
        version, label = run_version(run_dir, source), run_dir.name
        tokenizer = load_tokenizer(str(source))
        source = str(source)
    else:
        task = build_task(cfg) if cfg.model.policy == "builtin" else None
        tokenizer, policy, _, source = build_models(cfg, task, reference=False)
        version, label = 0, Path(cfg.model.policy).name if cfg.model.policy != "builtin" else "builtin"
        if source is None:  # the builtin model in memory: a backend that loads its own copy needs it on disk
            cleanup = tempfile.TemporaryDirectory(prefix="tba-serve-")
            source = cleanup.name
            save_checkpoint(policy, tokenizer, Path(source))
        if not spec.takes_policy or cfg.model.lora.enabled:
            policy = None  # loaded from `source` by the backend (with adapters where the recipe trains LoRA)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    sampler = build_sampler(spec, source=source, tokenizer=tokenizer, device=device, seed=cfg.seed, policy=policy)
    limit = max_model_len or spec.max_model_len or _model_limit(source)
    s = cfg.search
    return Served(sampler, tokenizer, version, name or label, limit,
                  slots or s.slots or min(16, s.prompts_per_batch * s.generations_per_prompt), source, cleanup)


def _model_limit(source: str) -> int:
    try:
        limit = getattr(source_config(source), "max_position_embeddings", None)
    except Exception as e:  # noqa: BLE001 — a config that cannot be read here: a conservative default
        logger.debug(f"max_position_embeddings of {source} unknown ({type(e).__name__}: {e})")
        limit = None
    if not limit:
        logger.warning(f"{source}: the model's context length is unknown; serving up to 4096 tokens "
                       "(--max-model-len sets it)")
        return 4096
    return int(limit)


def check_serve_installed() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ServeError(f"needs the `serve` extra ({e.name} is missing): pip install -e '.[serve]'") from None
