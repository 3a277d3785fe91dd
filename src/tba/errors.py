"""Errors a user's input can cause, with one base class so that the CLI tells them from bugs by type.

A `UserError` is printed by `tba` as one line, `tba: <label>: <message>`, and exits with `exit_code`; any
other exception is a bug and keeps its traceback. Each module defines its own subclass next to the code that
raises it (a bad checkpoint is `tba.run.checkpoint.CheckpointError`, a bad data file `tba.tasks.data.DataLoadError`);
only the config's error lives here, because the schema, the task factories and the plugin loader all raise it.
"""


class UserError(Exception):
    """Something the user can fix: a config value, a data file, a model path, a run directory."""

    exit_code = 1
    label: str | None = None
    """How the CLI's one line names the error; None = the class name, "" = no label (the message says it)."""


class ConfigError(UserError, ValueError):
    """A bad key or value; the message names the dotted key."""

    exit_code = 2
    label = "config error"


def raised(who: str, exc: BaseException, limit: int = 300) -> str:
    """What raised, on one line: `who raised Type: message` (the message's line breaks become spaces, cut at `limit`
    characters) — how a warning names a user's function that failed; its traceback goes to the log file."""
    text = " ".join(str(exc).split())
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return f"{who} raised {type(exc).__name__}" + (f": {text}" if text else "")
