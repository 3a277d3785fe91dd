"""The `logging` section of the config schema: where a run's metrics go besides RUN_DIR/metrics.jsonl (always
written), its name there, and the progress display. `report_to` takes TRL's name and values; `tensorboard` and
`wandb`, tba's older switches, are aliases that add or remove one backend — `LoggingConfig.backends` is the one place
that decides which backends a run opens (tba.run.reporters opens them).
"""

from __future__ import annotations

from dataclasses import dataclass

from tba.config.rules import installed, setting
from tba.errors import ConfigError

BACKENDS = {"tensorboard": ("tensorboard", "pip install tensorboard"), "wandb": ("wandb", "pip install 'tba[wandb]'"),
            "trackio": ("trackio", "pip install 'tba[trackio]'"), "mlflow": ("mlflow", "pip install 'tba[mlflow]'")}
"""report_to's backends → (the module each needs, what installs it: tensorboard is a dependency of tba, the others
optional extras)."""


def _listed(value: list[str] | str) -> list[str]:
    """report_to as a list: a string (TRL's `report_to="wandb"`, set as an attribute) is a comma list."""
    return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else list(value)


def _names(value: list[str] | str) -> str | None:
    value = _listed(value)
    unknown = [v for v in value if v not in BACKENDS and v not in ("all", "none")]
    if unknown:
        return f"unknown backend {', '.join(map(repr, unknown))}: use {', '.join(BACKENDS)}, all or none"
    if len(value) > 1 and ("none" in value or "all" in value):
        return "'all' and 'none' stand alone"
    return None


@dataclass
class LoggingConfig:
    report_to: list[str] = setting(None, _names, factory=lambda: ["tensorboard"])
    """Where metrics go besides metrics.jsonl, as TRL's `report_to`: a list of tensorboard (RUN_DIR/tensorboard/),
    wandb, trackio, mlflow — each through its own library (pip install 'tba[wandb]', 'tba[trackio]', 'tba[mlflow]') —
    or `all` (every one installed) or `none`. On the command line a comma list: logging.report_to=tensorboard,wandb.
    W&B runs offline unless you are logged in (WANDB_MODE overrides; `wandb sync` uploads later), trackio keeps its
    local store (TRACKIO_DIR), MLflow writes RUN_DIR/mlflow/mlflow.db unless MLFLOW_TRACKING_URI is set."""
    tensorboard: bool | None = None
    """Alias kept from before report_to: true adds tensorboard to report_to, false removes it; null: as report_to."""
    wandb: bool | None = None
    """Alias kept from before report_to: true adds wandb to report_to, false removes it; null: as report_to."""
    run_name: str | None = None
    """The run's name in W&B, trackio and MLflow (TRL's run_name). None = the output directory's name."""
    project: str = "tba"
    """The project: trackio's project, MLflow's experiment (unless MLFLOW_EXPERIMENT_NAME is set), W&B's project
    unless wandb_project is given."""
    wandb_project: str | None = None
    """W&B project, when it differs from `project`."""
    wandb_entity: str | None = None
    """W&B entity (user or team). None = your default entity."""
    wandb_tags: list[str] | None = None
    """W&B tags of the run (a comma list on the command line)."""
    wandb_group: str | None = None
    """W&B group of the run (also trackio's group): e.g. one name for the seeds of one experiment."""
    progress: bool = True
    """Live progress bar (rich) on a terminal; without one, plain progress lines (see plain_every_s)."""
    plain_every_s: float = 30.0
    """Without a terminal (stderr redirected to a file, CI): one plain progress line every this many seconds."""

    def backends(self) -> list[str]:
        """The backends this run reports to, in report_to's order: report_to (`all`: every installed one; `none`:
        none), then the aliases — tensorboard / wandb true adds that one, false removes it."""
        names = _listed(self.report_to)
        if names == ["all"]:
            names = [b for b, (module, _) in BACKENDS.items() if installed(module)]
        elif names == ["none"]:
            names = []
        for name, switch in (("tensorboard", self.tensorboard), ("wandb", self.wandb)):
            if switch and name not in names:
                names.append(name)
            elif switch is False and name in names:
                names.remove(name)
        return list(dict.fromkeys(names))

    def check_installed(self) -> None:
        """Every backend asked for can be imported here: one line naming the extra that installs it."""
        for name in self.backends():
            module, install = BACKENDS[name]
            if not installed(module):
                raise ConfigError(f"logging.report_to: {name} needs the {module} package, which is not installed: "
                                  f"{install} (or drop {name} from logging.report_to)")
