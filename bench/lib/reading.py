"""Results files end with a hand-written "## Reading" section (what the numbers mean, written after the runs);
a script that rewrites its table keeps that section instead of deleting it."""

from __future__ import annotations

from pathlib import Path

MARK = "\n## Reading"


def write_keeping_reading(path: Path, table: str) -> None:
    """Write `table` to `path`, followed by the reading `path` already ended with, if any."""
    old = path.read_text() if path.is_file() else ""
    reading = old[old.index(MARK):] if MARK in old else ""
    path.write_text(table.rstrip("\n") + "\n" + reading)
