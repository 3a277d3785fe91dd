"""Typed run configuration: YAML recipes and dotted CLI overrides into tba.config.schema's dataclasses, validated.

Why dataclasses and not a dict: every setting has one documented home, a typo is an error instead of a
silently ignored key, and the whole config is validated before any model is built (a config error must
never cost the user a 10-second transformers import or a half-written run directory). The rules live beside
their fields in tba.config.schema; this module applies them, naming the dotted key. Only tba.run.build reads the
resulting `RunConfig`: every component receives its own section(s).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import sys
import types
import typing
from pathlib import Path

import yaml

from tba.config.schema import RunConfig
from tba.errors import ConfigError

RENAMED = {"search.samples_per_prompt": "search.generations_per_prompt"}
"""Keys renamed before 0.1.0's release, kept so that a recipe written with the old name stops with one message
naming the new key instead of running with the default: S (generated per prompt) and K (trained on per prompt,
trainer.samples_per_prompt) had the same name."""

DEFAULT_RECIPE = Path(__file__).parents[1] / "recipes" / "arith_tiny_cpu.yaml"


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
    if origin is list:  # list[str] (logging.report_to): a list, or a comma list from the command line
        item = typing.get_args(annotation)[0]
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list):
            return [_coerce(key, v, item) for v in value]
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


def _item_type(annotation) -> type | None:
    """X for a field annotated `list[X] | None` with X a config dataclass (search.groups), else None."""
    for option in (typing.get_args(annotation) or (annotation,)):
        if typing.get_origin(option) is list and dataclasses.is_dataclass(typing.get_args(option)[0]):
            return typing.get_args(option)[0]
    return None


def _check_keys(obj, keys: list[str], prefix: str) -> None:
    """Every key of `keys` that section `obj` does not have, reported at once (each with its nearest names)."""
    names = [f.name for f in dataclasses.fields(obj)]
    unknown = [k for k in keys if k not in names]
    if not unknown:
        return
    described = []
    for k in unknown:
        near = difflib.get_close_matches(k, names, n=3)
        described.append(f"'{prefix}{k}'" + (f" (did you mean {', '.join(prefix + n for n in near)}?)" if near else ""))
    raise ConfigError(f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(described)}")


def _set_all(section, mapping: dict, prefix: str) -> None:
    """Set every key of `mapping` on `section`, its unknown keys reported together first."""
    renamed = [prefix + str(k) for k in mapping if prefix + str(k) in RENAMED]
    _check_keys(section, [str(k) for k in mapping if prefix + str(k) not in renamed], prefix)
    for k, v in mapping.items():
        _apply(section, str(k), v, prefix)


def _apply(obj, key: str, value, prefix: str = "") -> None:
    """Set dotted `key` on nested dataclass `obj`, validating the name and the type."""
    head, _, rest = key.partition(".")
    full = prefix + head
    if (renamed := RENAMED.get(f"{full}.{rest}" if rest else full)) is not None:
        raise ConfigError(f"{full}{'.' + rest if rest else ''} is now {renamed} (S, completions generated per "
                          "prompt; trainer.samples_per_prompt is K, the samples of a prompt an update trains on)")
    hints = typing.get_type_hints(type(obj))
    _check_keys(obj, [head], prefix)
    current = getattr(obj, head)
    if dataclasses.is_dataclass(current):
        if rest:
            _apply(current, rest, value, full + ".")
        elif isinstance(value, dict):
            _set_all(current, value, full + ".")
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
    item = _item_type(hints[head])
    if item is not None and value is not None:  # a list of sections: each item a mapping of that section's keys
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise ConfigError(f"{full}: expected a list of mappings ({item.__name__} fields), got {value!r}")
        items = []
        for i, entry in enumerate(value):
            items.append(item())
            _set_all(items[-1], entry, f"{full}[{i}].")
        value = items
    setattr(obj, head, value if item is not None else _coerce(full, value, hints[head]))


def validate(section, prefix: str = "", *, check_installed: bool = True) -> None:
    """Apply every field's rules (tba.config.rules) and each section's own `check()`, depth first; the root's
    `check()` (rules between sections) runs last, then — unless `check_installed` is false — its
    `check_installed()`: that the optional libraries the config names can be imported here. Only a plan for another
    machine (`tba plan`) skips that: a run always checks it."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            validate(value, f"{prefix}{f.name}.")
            continue
        if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            for i, item in enumerate(value):
                validate(item, f"{prefix}{f.name}[{i}].")
            continue
        for rule in f.metadata.get("rules", ()):
            if (problem := rule(value)) is not None:
                raise ConfigError(f"{prefix}{f.name}: {problem}, got {'null' if value is None else repr(value)}")
    if hasattr(section, "check"):
        section.check()
    if check_installed and isinstance(section, RunConfig):
        section.check_installed()


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


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


def recipe_path(path: str | Path | None) -> Path:
    """A recipe file; a bare name such as `tldr-pythia` is a recipe shipped in tba/recipes; None the default."""
    path = Path(path) if path is not None else DEFAULT_RECIPE
    if path.is_file():
        return path
    packaged = DEFAULT_RECIPE.parent / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
    if len(path.parts) != 1 or not packaged.is_file():
        names = ", ".join(sorted(p.stem for p in DEFAULT_RECIPE.parent.glob("*.yaml")))
        raise ConfigError(f"config file not found: {path} (packaged recipes, usable by name: {names})")
    return packaged


def apply_override(cfg: RunConfig, text: str) -> None:
    """Apply one dotted `key=value` override. A different task.name drops the options set so far: they were the
    other task's (a recipe's reasoning-gym options mean nothing to the dataset task)."""
    key, value = parse_override(text)
    if key == "task.name" and value != cfg.task.name:
        cfg.task.options = None
    _apply(cfg, key, value)


def override(cfg: RunConfig, *overrides: str, check_installed: bool = True) -> RunConfig:
    """A copy of `cfg` with dotted `key=value` overrides applied, validated again (`validate`)."""
    new = copy.deepcopy(cfg)
    for text in overrides:
        apply_override(new, text)
    validate(new, check_installed=check_installed)
    return new


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = (), *,
                check_installed: bool = True) -> RunConfig:
    """Defaults ← recipe YAML (the embedded default recipe if `path` is None) ← dotted overrides, validated
    (`validate`; `check_installed` false only to plan a run for another machine)."""
    cfg = RunConfig()
    path = recipe_path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    for key, value in data.items():
        _apply(cfg, str(key), value)
    for text in overrides:
        apply_override(cfg, text)
    validate(cfg, check_installed=check_installed)
    return cfg


def plain(value):
    """`value` as YAML can hold it. A Python object given through the API (a reward function, a dataset) is
    written as what names it: an importable function as its `module:name` target (a script's as
    `path/to/script.py:name`), anything else as `<python: …>`, which no run can load back."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if callable(value) and module and "<" not in name:
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        return f"{main}:{name}" if module == "__main__" and main else f"{module}:{name}" if module != "__main__" \
            else f"<python: {name}>"
    rows = f" of {len(value)} rows" if hasattr(value, "__len__") else ""
    return f"<python: {type(value).__name__}{rows}>"


def save_config(cfg: RunConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(plain(to_dict(cfg)), sort_keys=False))
