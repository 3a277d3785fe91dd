"""The Python API, in the shape TRL's users know: a config dataclass and a trainer that takes a model, reward
functions and a dataset.

    from tba import TBAConfig, TBATrainer

    def accuracy(prompts, completions, answer, **kwargs):       # TRL's reward signature, unchanged
        return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]

    args = TBAConfig.from_yaml(None, "trainer.steps=100", "output_dir=runs/mine")   # or TBAConfig() and set fields
    trainer = TBATrainer(model="HuggingFaceTB/SmolLM2-135M-Instruct", reward_funcs=[accuracy],
                         train_dataset="data/train.jsonl", args=args)
    summary = trainer.train()                                    # also written to output_dir/summary.json

`TBAConfig` is the run's config (tba.config.schema.RunConfig: the same fields as a YAML recipe). The trainer's
arguments override the parts they name: `model` → model.policy (a name, a path, or a loaded PreTrainedModel,
saved once to output_dir/start so that searcher processes can load it), `train_dataset` / `eval_dataset` /
`reward_funcs` / `reward_weights` → the `dataset` task (tba.tasks.dataset), `peft_config` → model.lora,
`processing_class` → the tokenizer saved with a loaded model. `callbacks` are called as `fn(step, metrics)`
after every update. `tba train` is this same class, given a config only.

Reward functions and datasets reach searcher processes pickled: a function by reference (its module and name),
so it must be importable there — defined at the top of a .py file, not a lambda or a closure, and not in a
notebook (whose functions the searcher processes cannot import). What cannot cross fails before training,
naming the function and what to do instead; runtime=inline runs everything in one process and takes anything.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import sys
from collections.abc import Callable
from pathlib import Path

from tba.config import load_config, override, validate
from tba.config.schema import RunConfig
from tba.errors import ConfigError


@dataclasses.dataclass
class TBAConfig(RunConfig):
    """The run's config (every field: tba.config.schema), with the two ways in a YAML user has: a recipe and dotted
    overrides."""

    @classmethod
    def from_yaml(cls, path: str | Path | None = None, *overrides: str) -> TBAConfig:
        """A recipe (a file, a shipped recipe's name, or None: the embedded default) with `key=value` overrides."""
        cfg = load_config(path, overrides)
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(RunConfig)})

    def override(self, *overrides: str) -> TBAConfig:
        """A copy with dotted `key=value` overrides applied and the whole config validated again."""
        return override(self, *overrides)


class TBATrainer:
    def __init__(self, model=None, reward_funcs: Callable | list | None = None, args: RunConfig | None = None,
                 train_dataset=None, eval_dataset=None, processing_class=None,
                 reward_weights: list[float] | None = None, callbacks: list[Callable] | None = None,
                 peft_config=None, environment_factory: Callable | None = None, rollout_func: Callable | None = None):
        cfg = copy.deepcopy(args) if args is not None else TBAConfig()
        if model is not None:
            cfg.model.policy = model if isinstance(model, str | Path) else "<in memory>"
            cfg.sft.enabled = False
        self._model_object = None if model is None or isinstance(model, str | Path) else model
        self.processing_class = processing_class
        if rollout_func is not None:
            raise ConfigError(ROLLOUT_FUNC)
        if environment_factory is not None:
            if train_dataset is None:
                raise ConfigError("environment_factory: give train_dataset too — each row is handed to reset(**row); "
                                  "TRL's dataset-free mode, where reset writes the prompt, is not supported")
            options = {"source": train_dataset, "environment_factory": environment_factory}
            if reward_funcs is not None:
                options["reward"] = reward_funcs
            if eval_dataset is not None:
                options["test_source"] = eval_dataset
            if reward_weights is not None:
                options["reward_weights"] = list(reward_weights)
            kept = cfg.task.options if cfg.task.name == "factory" else None
            cfg.task.name, cfg.task.options = "factory", {**(kept or {}), **options}
        elif train_dataset is not None or reward_funcs is not None:
            if train_dataset is None or reward_funcs is None:
                raise ConfigError("train_dataset and reward_funcs go together: the dataset task needs both")
            options = {"source": train_dataset, "reward": reward_funcs}
            if eval_dataset is not None:
                options["test_source"] = eval_dataset
            if reward_weights is not None:
                options["reward_weights"] = list(reward_weights)
            kept = cfg.task.options if cfg.task.name == "dataset" else None  # another task's options mean nothing here
            cfg.task.name, cfg.task.options = "dataset", {**(kept or {}), **options}
        if peft_config is not None:
            cfg.model.lora = lora_section(peft_config)
        self.args, self.callbacks = cfg, list(callbacks or [])
        self.summary: dict | None = None

    def train(self, *, resume: bool = False, overwrite: bool = False, set_aside_buffer: bool = False) -> dict:
        """Train to `args.trainer.steps` (a fresh run, or `resume` the one in args.output_dir); returns the
        summary. `overwrite` replaces a finished or stopped run in output_dir; `set_aside_buffer` (with `resume`)
        moves aside a replay buffer that cannot be read and resumes with the groups it can still read."""
        from tba.run.progress import log_to_console
        from tba.run.train import train

        log_to_console(only_if_unconfigured=True)

        cfg = self.args
        if self._model_object is not None:
            cfg.model.policy = self._save_start(Path(cfg.output_dir), overwrite or resume)
        validate(cfg)
        check_crossing(cfg)
        self.summary = train(cfg, resume=resume, overwrite=overwrite, set_aside_buffer=set_aside_buffer,
                             callbacks=self.callbacks)
        return self.summary

    @property
    def model(self):
        """The trained policy (output_dir/checkpoint, loaded on first use)."""
        from tba.models import load_model

        if self.summary is None:
            raise RuntimeError("train() first")
        return load_model(self.summary["checkpoint"], self.args.model.dtype)

    def save_model(self, path: str | Path) -> Path:
        """A servable `save_pretrained` model (LoRA merged, tokenizer included): `tba export`."""
        from tba.run.export import export

        return export(self.args.output_dir, path)

    def _save_start(self, out: Path, replace: bool) -> str:
        """A model given as an object is saved once (with its tokenizer) to output_dir/start: searcher processes
        and vLLM load the start from a path."""
        from tba.models import save_checkpoint

        model, tokenizer = self._model_object, self.processing_class
        if getattr(model, "peft_config", None):
            raise ConfigError("model: give the base model and peft_config=LoraConfig(...), not a PeftModel")
        if tokenizer is None:
            raise ConfigError("processing_class: a model given as an object needs its tokenizer "
                              "(processing_class=tokenizer), saved beside it for the searchers")
        start = out / "start"
        if replace or not (start / "config.json").is_file():
            save_checkpoint(model, tokenizer, start)
        return str(start)


ROLLOUT_FUNC = (
    "rollout_func: tba has no hook of this shape to alias. TRL's rollout_func(prompts, trainer) generates through the "
    "trainer and returns prompt_ids / completion_ids / logprobs; tba generates in searcher processes with a stale "
    "copy of the policy, so the same loop is written as an environment: environment_factory=Cls (tools) or a task "
    "with environment(prompt) (step / get_reward), both token-exact (docs/environments.md)")
"""Why `rollout_func` is refused: what it is in TRL, and what does its work in tba."""


def lora_section(peft_config):
    """A peft.LoraConfig as the `model.lora` section (what tba trains with PEFT)."""
    from tba.config.schema import LoraConfig

    targets = peft_config.target_modules
    targets = targets if isinstance(targets, str) else ",".join(sorted(targets)) if targets else "all-linear"
    return LoraConfig(enabled=True, r=peft_config.r, alpha=peft_config.lora_alpha,
                      dropout=peft_config.lora_dropout, target_modules=targets)


def check_crossing(cfg: RunConfig) -> None:
    """Reward functions and datasets given as Python objects must reach the searcher processes: pickled by
    reference on runtime=local, by Ray's cloudpickle on runtime=ray. Fail before training, naming what cannot
    cross and what to do instead."""
    if cfg.runtime not in ("local", "ray") or cfg.task.name not in ("dataset", "factory"):
        return
    options = cfg.task.options or {}
    rewards = options.get("reward")
    rewards = list(rewards) if isinstance(rewards, list | tuple) else [rewards]
    for fn in [*rewards, options.get("environment_factory")]:
        if fn is None or isinstance(fn, str):
            continue
        name = getattr(fn, "__qualname__", repr(fn))
        main = sys.modules.get("__main__")
        if getattr(fn, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
            raise ConfigError(f"task.options.reward: {name} is defined in a notebook or an interactive session, "
                              f"which searcher processes cannot import. Move it to a .py file and import it, or run "
                              f"in one process: runtime=inline")
        problem = _unpicklable(fn, cfg.runtime)
        if problem:
            raise ConfigError(f"task.options.reward: {name} cannot reach the searcher processes ({problem}). Define "
                              "it at the top level of a .py module — not a lambda, not inside a function, not "
                              "closing over a model (load models inside the function, once) — or run in one "
                              "process: runtime=inline")
    for key in ("source", "test_source"):
        value = options.get(key)
        if value is not None and not isinstance(value, str | Path) and (problem := _unpicklable(value, cfg.runtime)):
            raise ConfigError(f"task.options.{key}: the dataset cannot reach the searcher processes ({problem}); "
                              "give a file path or a Hub name, or runtime=inline")


def _unpicklable(obj, runtime: str) -> str | None:
    try:
        if runtime == "ray":
            import ray.cloudpickle  # Ray pickles by value what plain pickle cannot reach

            ray.cloudpickle.dumps(obj)
        else:
            pickle.dumps(obj)
    except Exception as e:  # PicklingError, AttributeError (local objects), TypeError (locks, models on threads)
        return f"{type(e).__name__}: {e}"
    return None
