"""A run's held-out evaluation, built in one place for the two that use it: the in-run evaluation (tba.run.build)
and `tba eval` (tba.run.eval_command), so that `tba eval RUN_DIR` computes the run's own final `score` by the same
code, on the same task, with the same settings.

What it builds from a config: the task as a run prepares it (`prepare_task`: the factory, the chat template, the
prompt-length limit), the `Scoring` of a task that measures π_θ exactly, and the evaluator (`run_evaluator`: the
rollout's `Evaluator`, under the run's autocast). What `tba eval` may be pointed at (`resolve_target`): a run
directory (its final policy `checkpoint/`, else its newest usable full checkpoint, as `tba export` picks), one
checkpoint `checkpoints/step_N`, a model directory (an export, a run's `checkpoint/`), or a model name (a Hub id,
`package:…`); a run's saved config.yaml gives the task and evaluation settings, else a recipe does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import tba.run.checkpoint as ckpt
from tba.algorithm.objectives.tb import beta_schedule
from tba.config import RunConfig, load_config
from tba.errors import UserError
from tba.models import precision
from tba.models.shape import source_config
from tba.rollout.episodes import Limits
from tba.rollout.evaluate import Evaluator
from tba.run.export import policy_source
from tba.run.searchers import task_spec
from tba.tasks.base import Scoring, TaskAdapter
from tba.tasks.prepare import apply_chat_template, fit_prompts, prompt_limit
from tba.tasks.prepare import build_task as build_task_from_spec

logger = logging.getLogger(__name__)


class EvalError(UserError, ValueError):
    """Nothing to evaluate at the path given, or settings `tba eval` cannot honour."""

    label = "eval"


def scoring(cfg: RunConfig) -> Scoring:
    """How this run samples and scores responses (for a task's exact evaluation): the trainer's temperature, the
    search budget and nucleus, and the β of the last update."""
    return Scoring(temperature=cfg.search.temperature, max_new_tokens=cfg.search.max_new_tokens,
                   beta=beta_schedule(cfg.tb)(cfg.trainer.steps), top_p=cfg.search.top_p)


def limits(cfg: RunConfig) -> Limits:
    """A multi-turn task's episode limits in evaluation."""
    return Limits.of(cfg.search, cfg.eval.max_new_tokens)


@dataclasses.dataclass
class CurrentPolicy:
    """The one-process trainer's evaluation: its policy as it is now, computed as training computes
    (model.autocast, tba.models.precision)."""

    evaluator: Evaluator
    autocast: str | None = None

    def __call__(self) -> dict[str, float]:
        with precision.autocast(self.evaluator.policy.device, self.autocast):
            return self.evaluator()

    def describe(self, metrics: dict[str, float]) -> str:
        return self.evaluator.describe(metrics)


def run_evaluator(cfg: RunConfig, task, policy, tokenizer, reference) -> CurrentPolicy:
    """The evaluation a one-process run repeats (and `tba eval` runs once): `policy` on the task's test prompts (an
    agent task's: the agent against an endpoint over `policy`, tba.serve.agents)."""
    adapted = TaskAdapter.of(task)
    if adapted.agentic:
        from tba.serve.agents import AgentEvaluator

        limit = getattr(getattr(policy, "config", None), "max_position_embeddings", None) or 4096
        return CurrentPolicy(AgentEvaluator(policy, tokenizer, adapted.task, cfg.eval, search=cfg.search,
                                            max_model_len=int(limit)), cfg.model.autocast)
    return CurrentPolicy(Evaluator(policy, tokenizer, task, cfg.eval, reference=reference, scoring=scoring(cfg),
                                   limits=limits(cfg)), cfg.model.autocast)


def fit_task(cfg: RunConfig, task, tokenizer, architecture) -> tuple[int, dict[str, int]]:
    """The run's prompts in the tokenizer's chat template (task.chat_template, or chat-message prompts) and within
    the prompt-length limit of the model `architecture` describes; returns (that limit, fit_prompts' counts)."""
    apply_chat_template(task, tokenizer, every_prompt=cfg.task.chat_template)
    limit = prompt_limit(cfg.task.max_prompt_tokens, architecture, max(cfg.search.max_new_tokens,
                                                                       cfg.eval.max_new_tokens))
    fitted = fit_prompts(task, tokenizer, limit, cfg.task.long_prompts)
    if fitted["prompts_too_long"]:
        logger.info(f"{fitted['prompts_too_long']} prompts longer than {limit} tokens: "
                    f"{'truncated' if cfg.task.long_prompts == 'truncate' else 'skipped'} (task.long_prompts)")
    return limit, fitted


def prepare_task(cfg: RunConfig, tokenizer, architecture) -> TaskAdapter:
    """The configured task, its prompts prepared as a run prepares them (`fit_task`)."""
    task = build_task_from_spec(task_spec(cfg))
    fit_task(cfg, task, tokenizer, architecture)
    return task


# ---- what `tba eval` is pointed at -----------------------------------------------------------------------------
@dataclasses.dataclass
class Target:
    """A policy to evaluate and where its settings come from."""

    kind: str
    """run | checkpoint | model"""
    policy: str
    """A loadable model: a save_pretrained (or LoRA adapter) directory, a Hub id, `package:…`."""
    name: str
    """The results file's default name (RUN_DIR/eval/<name>.json)."""
    run_dir: Path | None = None
    config: Path | None = None
    """The run's config.yaml, when the target belongs to a run."""
    step: int | None = None
    """Trainer updates behind the policy, when known."""


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def _run_config(run_dir: Path) -> Path | None:
    return run_dir / "config.yaml" if (run_dir / "config.yaml").is_file() else None


def resolve_target(target: str) -> Target:
    """What `target` names (see the module docstring); EvalError for a path that holds nothing to evaluate."""
    path = Path(target)
    if not path.exists():
        if target.startswith(("/", ".", "~")) or target.count("/") > 1 or target.endswith((".yaml", ".json")):
            raise EvalError(f"{target}: no such run directory, checkpoint or model")
        return Target("model", target, _safe_name(target))  # a Hub id or package:…, loaded as a run loads one
    if path.is_file():
        if path.suffix == ".gguf":
            return Target("model", str(path), _safe_name(path.stem))
        raise EvalError(f"{target}: a file; give a run directory, a checkpoint or a model directory")
    if (path / "config.yaml").is_file() and not _is_model_dir(path):  # a run directory
        if not ((path / "checkpoint").is_dir() or (path / "checkpoints").is_dir()):
            raise EvalError(f"{target}: a run directory with no policy yet (no checkpoint/ or checkpoints/)")
        try:
            source = policy_source(path)
        except UserError as e:
            raise EvalError(str(e)) from None
        final = source == path / "checkpoint"
        return Target("run", str(source), "final" if final else source.parent.name, path, path / "config.yaml",
                      _final_step(path) if final else _checkpoint_step(source.parent))
    if (path / "model").is_dir() and (path / ckpt.STATE).is_file():  # checkpoints/step_N
        run_dir = path.parent.parent
        return Target("checkpoint", str(path / "model"), path.name, run_dir if _run_config(run_dir) else None,
                      _run_config(run_dir), _checkpoint_step(path))
    if _is_model_dir(path):  # an export, or a run's checkpoint/ (its run's config then applies)
        run_dir = path.parent if path.name == "checkpoint" and _run_config(path.parent) else None
        return Target("model", str(path), "final" if run_dir else _safe_name(path.resolve().name), run_dir,
                      _run_config(run_dir) if run_dir else None, _final_step(run_dir) if run_dir else None)
    raise EvalError(f"{target}: neither a run directory (config.yaml), a checkpoint (state.json, model/) nor a model "
                    "directory (config.json)")


def _safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text.split(":")[-1].strip("/")) or "model"


def _checkpoint_step(path: Path) -> int | None:
    try:
        return int(json.loads((path / ckpt.STATE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _final_step(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / "summary.json").read_text())["trainer_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def target_config(target: Target, recipe: str | None, overrides: list[str]) -> RunConfig:
    """The settings of the evaluation: the run's config.yaml, else `recipe` (None: the embedded default), then
    `overrides`. A model named directly becomes model.policy (the reference too, unless model.reference is set)."""
    if target.config is not None and recipe is not None:
        raise EvalError(f"{target.policy} belongs to a run: its settings are {target.config}; drop {recipe} "
                        "(overrides are fine)")
    config = str(target.config) if target.config is not None else recipe
    return load_config(config, overrides, check_installed=False)  # vLLM or Ray of the run's own: not needed here


def reference_source(target: Target, cfg: RunConfig) -> str:
    """π_ref for a task's exact or reference metrics: the run's (its checkpoint's record, else RUN_DIR/init, its
    saved start), model.reference, or the policy's start = the model itself when it was named directly."""
    if cfg.model.reference:
        return cfg.model.reference
    if target.run_dir is not None:
        latest = ckpt.latest(target.run_dir, quiet=True)
        recorded = json.loads((latest / ckpt.STATE).read_text()).get("reference_source") if latest else None
        if recorded and (Path(recorded).exists() or not recorded.startswith(("/", "."))):
            return recorded
        if (target.run_dir / "init").is_dir():
            return str(target.run_dir / "init")
        if cfg.model.policy != "builtin":
            return cfg.model.policy
    return target.policy


def architecture(source: str):
    """The model config of `source` (its context length bounds the prompts), read without loading weights."""
    return source_config(source)
