"""User code named in the config: `package.module:name` or `path/to/file.py:name` (a custom task's factory,
a custom sampler's builder). Loaded in whichever process needs it — a file path works in spawned searchers
and on Ray workers of the same machine alike — with an error that names the config key."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from tba.errors import ConfigError


def load_object(spec: str, key: str):
    where, _, attr = spec.rpartition(":")
    try:
        if where.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location(f"tba_custom_{abs(hash(where))}", where)
            if module_spec is None or not Path(where).is_file():
                raise FileNotFoundError(where)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        return getattr(module, attr)
    except (ImportError, FileNotFoundError, AttributeError) as e:
        raise ConfigError(f"{key}: cannot load {spec!r}: {type(e).__name__}: {e}") from None
