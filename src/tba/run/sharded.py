"""A run's sharded trainer (trainer.world_size = N > 1), from the config: what every rank builds its part from
(`RankBuild`, pickled into each rank's process), where the ranks run (`rank_devices`, local processes or Ray actors),
and the controller's handle on them (tba.ranks.controller.ShardedTrainer).

The controller — the run's own process — never loads the policy onto a training device. Every rank builds the
policy's architecture on the meta device, shards it, and reads its own shards from the start's safetensors files:
the run's start (its source, or RUN_DIR/start when the start exists only in the controller: the builtin model,
LoRA's fresh adapters) or, on resume, the checkpoint's model/. Where the files cannot serve (LoRA adapters), rank 0
loads the start into host memory and broadcasts it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from tba.algorithm.objectives import OBJECTIVES
from tba.algorithm.objectives.tb import beta_schedule
from tba.config import RunConfig
from tba.models import DTYPES, apply_lora, load_model, load_tokenizer
from tba.models.shape import source_config
from tba.ranks.controller import ShardedTrainer, Timeouts
from tba.ranks.rank import RankModels, RankParts
from tba.rollout.episodes import Limits
from tba.rollout.evaluate import ShareEvaluation
from tba.run.searchers import aging_sources, ray_section, task_spec
from tba.tasks.base import Scoring
from tba.tasks.prepare import apply_chat_template
from tba.tasks.prepare import build_task as build_task_from_spec

logger = logging.getLogger(__name__)


def rank_devices(cfg: RunConfig) -> list[torch.device]:
    """One device per rank: trainer.fsdp.devices as a list, or a type (cuda: rank r on cuda:r), or model.device's
    type."""
    t = cfg.trainer
    given = [d.strip() for d in (t.fsdp.devices or cfg.model.device).split(",")]
    if len(given) == t.world_size:
        return [torch.device(d) if d != "cuda" else torch.device("cuda", r) for r, d in enumerate(given)]
    kind = torch.device(given[0].replace("auto", "cuda" if torch.cuda.is_available() else "cpu")).type
    return [torch.device(kind, r) if kind != "cpu" else torch.device("cpu") for r in range(t.world_size)]


def compute_dtype(cfg: RunConfig) -> str:
    """The dtype the trainer's forward and backward run in: trainer.fsdp.param_dtype when sharded, else model.dtype."""
    return (cfg.trainer.fsdp.param_dtype if cfg.trainer.world_size > 1 else None) or cfg.model.dtype


def skeleton(base: str, lora, dtype: str) -> torch.nn.Module:
    """The policy's architecture in `dtype`, its parameters on the meta device (no weight is read or initialised),
    its buffers computed on the CPU (the rotary frequencies: each rank has them without a broadcast): `base`'s
    config, with LoRA's adapters when `lora` is a LoraConfig (their base recorded as `base`, so a checkpoint's
    adapters load again)."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(source_config(base), dtype=DTYPES[dtype])
    model.tie_weights()  # again outside: the context re-creates each parameter it registers, which unties them
    if lora is not None:
        with init_empty_weights(include_buffers=False):
            model = apply_lora(model, lora)
        model.peft_config["default"].base_model_name_or_path = base
    return model


def rank_evaluation(cfg: RunConfig, tokenizer_source: str, reference_source: str) -> ShareEvaluation:
    """A rank's side of the run's evaluation (tba.rollout.evaluate.ShareEvaluation), built in the rank's process:
    the task as the controller built it (for multi-turn environments and exact metrics), the tokenizer, the frozen
    π_ref loaded only when a metric needs it."""
    tokenizer = load_tokenizer(tokenizer_source)
    task = build_task_from_spec(task_spec(cfg), tokenizer)
    apply_chat_template(task, tokenizer, every_prompt=cfg.task.chat_template)
    scoring = Scoring(temperature=cfg.search.temperature, max_new_tokens=cfg.search.max_new_tokens,
                      beta=beta_schedule(cfg.tb)(cfg.trainer.steps), top_p=cfg.search.top_p)
    return ShareEvaluation(tokenizer, task, cfg.eval, limits=Limits.of(cfg.search, cfg.eval.max_new_tokens),
                           scoring=scoring, reference=functools.partial(load_model, reference_source,
                                                                       compute_dtype(cfg)))


def rank_trainer_args(cfg: RunConfig, pad_id: int) -> dict:
    """The Trainer's arguments on a rank: those of one process (tba.run.build.trainer_args) but π_ref, which a
    rank keeps sharded itself when its objective owns one."""
    objective = OBJECTIVES[cfg.objective]
    args = dict(loss=objective.bind(cfg.tb, cfg.baselines, max_tokens=cfg.search.max_new_tokens), cfg=cfg.trainer,
                beta=beta_schedule(cfg.tb), temperature=cfg.search.temperature, pad_id=pad_id,
                aging=aging_sources(cfg), autocast=cfg.model.autocast)
    if objective.owns_reference:
        args["reference_reset_steps"] = cfg.baselines.reference_reset_steps
    return args


@dataclasses.dataclass(frozen=True)
class RankBuild:
    """How every rank builds its part (picklable: each rank builds it in its own process)."""

    cfg: RunConfig
    start: str
    """What rank 0 loads the start weights from (tba.models.load_model: a directory, a hub name, LoRA adapters)."""
    base: str
    """The policy's own source: its architecture (a LoRA run's base model), its tokenizer."""
    reference: str
    """The run's frozen π_ref (evaluation's reference and exact metrics; TBA′'s start)."""
    own_reference: str | None
    """TBA′'s resetting π_ref to load: the run's π_ref, or a checkpoint's reference/ on resume."""
    pad_id: int

    def __call__(self) -> RankModels:
        m, dtype = self.cfg.model, compute_dtype(self.cfg)
        make = functools.partial(skeleton, self.base, m.lora if m.lora.enabled else None)
        owns = OBJECTIVES[self.cfg.objective].owns_reference
        return RankModels(
            policy=make(m.dtype), trainer_args=rank_trainer_args(self.cfg, self.pad_id),
            start=functools.partial(load_model, self.start, m.dtype), start_source=self.start,
            reference=functools.partial(load_model, self.own_reference or self.reference, dtype) if owns else None,
            reference_source=(self.own_reference or self.reference) if owns else None,
            evaluation=functools.partial(rank_evaluation, self.cfg, self.base, self.reference),
            skeleton=functools.partial(skeleton, self.base, None) if owns else make)


def build_sharded(cfg: RunConfig, build: RankBuild, *, threads: int, publish_dtype: str, run_dir: Path
                  ) -> ShardedTrainer:
    """Start the ranks (local processes, or Ray actors with runtime=ray) and return the controller's trainer."""
    t = cfg.trainer
    parts = RankParts(build, t.fsdp, cfg.model.dtype, publish_dtype, threads)
    devices, t0 = rank_devices(cfg), time.perf_counter()
    if cfg.runtime == "ray":  # imports Ray only then
        from tba.ranks.ray import RayRanks

        group = RayRanks(parts, devices, ray_section(cfg), run_dir)
    else:
        from tba.ranks.local import LocalRanks

        group = LocalRanks(parts, devices)
    logger.info(f"trainer: {len(devices)} ranks ({', '.join(str(d) for d in devices)}; {group.where}), FSDP2, ready "
                f"in {time.perf_counter() - t0:.1f} s")
    return ShardedTrainer(group, t, aging=aging_sources(cfg),
                          timeouts=Timeouts(t.fsdp.collective_timeout_s, t.fsdp.checkpoint_timeout_s))
