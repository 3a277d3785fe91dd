"""The one lazy loader: every registry entry and every piece of user code named in a config is a target,
`package.module:name` or `path/to/file.py:name`, imported only when a run needs it.

Why strings and not imports: validating a config must not import torch, vLLM or Ray (a typo should cost a
second, not a model build), and a registry that imported its entries would import every engine there is. A
file path works in spawned searcher processes and on Ray workers of the same machine alike. Every failure is a
ConfigError naming the config key, in one style: `<key>: cannot load '<target>': <why>`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path

from tba.errors import ConfigError

_FILES: dict[str, object] = {}
"""Modules loaded from a file path, by resolved path: loading one twice would give two copies of its classes."""


def load_object(target: str, key: str):
    """The object `target` names (`module:name` or `file.py:name`); ConfigError naming `key` if it cannot load."""
    where, _, attr = target.rpartition(":")
    if not where or not attr:
        raise ConfigError(f"{key}: cannot load {target!r}: expected `package.module:name` or `path/to/file.py:name`")
    try:
        if where.endswith(".py"):
            path = Path(where).resolve()
            if not path.is_file():
                raise FileNotFoundError(f"no file {where}")
            module = _FILES.get(str(path))
            if module is None:
                spec = importlib.util.spec_from_file_location(f"tba_plugin_{len(_FILES)}_{path.stem}", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                _FILES[str(path)] = module
        else:
            module = importlib.import_module(where)
        return getattr(module, attr)
    except (ImportError, FileNotFoundError, AttributeError, SyntaxError) as e:
        raise ConfigError(f"{key}: cannot load {target!r}: {type(e).__name__}: {e}") from None


def call_with_options(factory: Callable, options: dict, key: str, **context):
    """`factory(**options, **context)`, its options checked against its signature first.

    `options` are what the user wrote (`task.options`): a name the factory does not take is a ConfigError that
    lists the ones it does. `context` (e.g. train_size) is passed only where the factory names it, so that a
    factory takes exactly what it declares."""
    params = inspect.signature(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if unknown := sorted(set(options) - set(named)) if not takes_any else []:
        raise ConfigError(f"{key}: {getattr(factory, '__name__', factory)} does not take {unknown}; it takes "
                          f"{', '.join(n for n in named if n not in context) or 'no options'}")
    missing = [n for n, p in params.items() if p.default is p.empty and n not in options and n not in context
               and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if missing:
        raise ConfigError(f"{key}: {getattr(factory, '__name__', factory)} needs {', '.join(missing)}")
    return factory(**options, **{k: v for k, v in context.items() if k in named})
