"""What every `tba` command module shares: its declaration (`Command`) and the one-line form of a user error."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from tba.errors import UserError


@dataclass(frozen=True)
class Command:
    """One `tba` command: its parser's arguments and what it runs (each returns the exit code)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def user_error(error: BaseException) -> tuple[int, str] | None:
    """(exit code, the one line to print) for an error the user caused; None for a bug."""
    if not isinstance(error, UserError):
        return None
    label = type(error).__name__ if error.label is None else error.label
    return error.exit_code, f"tba: {label}: {error}" if label else f"tba: {error}"
