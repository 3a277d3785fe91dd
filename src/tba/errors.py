"""Errors a user's input can cause, named once so that every module can raise them without importing the
module that reads the config (which imports the task and objective registries: a circle otherwise)."""


class ConfigError(ValueError):
    """A bad key or value; the message names the dotted key."""
