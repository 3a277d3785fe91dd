"""The validation rules a config field can carry, written beside the field in tba.config.schema:

    steps: int = setting(200, positive)

A rule takes the field's value and returns None when it is fine, else what is wrong ("must be > 0"); tba.config
applies every field's rules and then each section's own `check()` (rules between its fields), and names the
dotted key in the error. Rules that span sections are `RunConfig.check`'s.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import field

Rule = Callable[[object], "str | None"]


def setting(default=None, *rules: Rule, factory: Callable | None = None):
    """A dataclass field with its validation rules beside it (`factory` for a mutable default)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"rules": rules})
    return field(default=default, metadata={"rules": rules})


def positive(v) -> str | None:
    return None if v > 0 else "must be > 0"


def positive_or_none(v) -> str | None:
    return None if v is None or v > 0 else "must be > 0 or null"


def non_negative(v) -> str | None:
    return None if v >= 0 else "must be ≥ 0"


def sync_period(v) -> str | None:
    return None if v >= 0 else ("must be ≥ 1 (publish every k updates) or 0 (never: searchers keep sampling from "
                                "the starting policy)")


def probability(v) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be in [0, 1]"


def fraction(v) -> str | None:
    return None if 0.0 < v <= 1.0 else "must be in (0, 1]"


def one_of(choices, *, plugin: str | None = None) -> Rule:
    """The value must be one of `choices` (a tuple, or a registry: a mapping whose keys are the names), or —
    where `plugin` describes one — a `tba.plugins` target with a colon."""

    def rule(v) -> str | None:
        names = tuple(choices) if isinstance(choices, Mapping) else choices
        if v in names or (plugin is not None and isinstance(v, str) and ":" in v):
            return None
        return f"must be one of {', '.join(map(str, names))}{f' or {plugin}' if plugin else ''}"

    return rule


def or_none(rule: Rule) -> Rule:
    """`rule`, with None (unset: "take the default from elsewhere") also allowed."""
    return lambda v: None if v is None else rule(v)


DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")


def devices(v) -> str | None:
    """cpu | cuda | cuda:N | auto, or a comma list of them (None passes: it means "as the trainer")."""
    if v is None:
        return None
    if all(d.strip() == "auto" or d.strip().split(":")[0] in DEVICE_TYPES for d in str(v).split(",")):
        return None
    return "must be cpu, cuda, cuda:N or auto (search.device: or a comma list)"


def installed(module: str) -> bool:
    """Whether an optional dependency can be imported, without importing it."""
    return importlib.util.find_spec(module) is not None
