"""A benchmark's scratch directory: its runs (checkpoints and all) live in one temp folder that is removed when
the benchmark finishes — the results file holds everything its table says — and kept, and named on stderr, when
it fails, since the runs' logs are then the evidence. Left behind on every run, these folders filled the disk."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def scratch_dir(prefix: str, keep: bool = False) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    except BaseException:
        print(f"run directories kept for inspection in {root}", file=sys.stderr)
        raise
    if keep:
        print(f"run directories kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
