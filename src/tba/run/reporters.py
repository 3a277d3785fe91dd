"""The backends `logging.report_to` names — TensorBoard, Weights & Biases, trackio, MLflow — each a small class over
the library itself, behind one protocol (`Reporter`). Which ones a run opens is `LoggingConfig.backends`' decision
(tba.config.reporting: report_to and its aliases); `open_reporters` opens them, `tba.run.logger.MetricsLogger` feeds
them every metrics.jsonl line's scalars.

Offline by default, wherever the library allows: W&B runs offline unless you are logged in (WANDB_API_KEY, or
`wandb login`'s netrc entry; WANDB_MODE overrides either way), trackio keeps its local store (TRACKIO_DIR, by default
in the Hugging Face cache), MLflow writes a SQLite store under the run directory unless MLFLOW_TRACKING_URI names
another. Each library is imported only when its backend is used.
"""

from __future__ import annotations

import logging
import math
import netrc
import os
import time
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from tba.config.reporting import BACKENDS, LoggingConfig
from tba.errors import ConfigError

logger = logging.getLogger(__name__)


class Reporter(Protocol):
    """One backend of logging.report_to, open for the run."""

    name: str

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """One step's scalars: `<component>/<quantity>` keys, finite numbers only."""

    def close(self) -> None:
        """Flush and finish the backend's run."""


def _library(name: str):
    """Import backend `name`'s library, or say in one line which extra installs it."""
    module, install = BACKENDS[name]
    try:
        return __import__(module)
    except ImportError as e:
        raise ConfigError(f"logging.report_to: {name} needs the {module} package, which is not installed: {install} "
                          f"(or drop {name} from logging.report_to)") from e


def run_name(cfg: LoggingConfig, out_dir: Path) -> str:
    """logging.run_name, else the run directory's name."""
    return cfg.run_name or Path(out_dir).resolve().name


class TensorBoardReporter:
    name = "tensorboard"

    def __init__(self, cfg: LoggingConfig, out_dir: Path, run_config: dict):
        _library("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


def wandb_logged_in() -> bool:
    """Whether W&B can authenticate without a prompt: WANDB_API_KEY, or the netrc entry `wandb login` writes for
    WANDB_BASE_URL's host (api.wandb.ai by default)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbReporter:
    name = "wandb"

    def __init__(self, cfg: LoggingConfig, out_dir: Path, run_config: dict):
        wandb = _library("wandb")
        mode = os.environ.get("WANDB_MODE") or ("online" if wandb_logged_in() else "offline")
        self.run = wandb.init(project=cfg.wandb_project or cfg.project, entity=cfg.wandb_entity,
                              name=run_name(cfg, out_dir), group=cfg.wandb_group, tags=cfg.wandb_tags,
                              config=run_config, dir=str(out_dir), mode=mode)
        if mode == "offline":
            logger.info(f"W&B offline (not logged in, or WANDB_MODE=offline): `wandb sync "
                        f"{out_dir}/wandb/offline-run-*` uploads the run later")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioReporter:
    name = "trackio"

    def __init__(self, cfg: LoggingConfig, out_dir: Path, run_config: dict):
        trackio = _library("trackio")
        self.run = trackio.init(project=cfg.project, name=run_name(cfg, out_dir), group=cfg.wandb_group,
                                config=run_config)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowReporter:
    name = "mlflow"

    def __init__(self, cfg: LoggingConfig, out_dir: Path, run_config: dict):
        _library("mlflow")
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        self.metric = Metric
        store = Path(out_dir).resolve() / "mlflow"
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            store.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{store / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or cfg.project
        found = self.client.get_experiment_by_name(experiment)
        artifacts = None if os.environ.get("MLFLOW_TRACKING_URI") else (store / "artifacts").as_uri()
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment, artifacts)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name(cfg, out_dir)).info.run_id
        self.client.log_dict(self.run_id, run_config, "config.json")
        logger.info(f"MLflow run {self.run_id} in experiment {experiment!r} at {uri}"
                    + ("" if os.environ.get("MLFLOW_TRACKING_URI") else f" (`mlflow ui --backend-store-uri {uri}`)"))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.metric(k, v, now, step) for k, v in scalars.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


REPORTERS: dict[str, type[Reporter]] = {"tensorboard": TensorBoardReporter, "wandb": WandbReporter,
                                        "trackio": TrackioReporter, "mlflow": MlflowReporter}
"""report_to's name → its class (tba.config.reporting.BACKENDS names the same ones)."""


def open_reporters(cfg: LoggingConfig, out_dir: Path, run_config: dict | None = None) -> list[Reporter]:
    """The backends `cfg` asks for (`LoggingConfig.backends`), each opened on the run; `run_config`: the whole run's
    config as a plain dict, for the backends' run pages. A backend that fails to open closes the ones before it."""
    opened: list[Reporter] = []
    try:
        for name in cfg.backends():
            opened.append(REPORTERS[name](cfg, Path(out_dir), run_config or {}))
    except BaseException:
        for reporter in opened:
            reporter.close()
        raise
    return opened


def scalars(metrics: dict) -> dict[str, float]:
    """What the backends get of a metrics line: `<component>/<quantity>` keys with finite numbers (a NaN — no fresh
    samples that step — is left out, as metrics.jsonl writes null)."""
    return {k: float(v) for k, v in metrics.items() if "/" in k and isinstance(v, int | float)
            and not isinstance(v, bool) and math.isfinite(v)}
