"""Each logging.report_to backend through its own library, offline: what MetricsLogger writes reads back from the
library's own store (TensorBoard's events, MLflow's SQLite store, trackio's local store, W&B's offline run)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tba.config.reporting import LoggingConfig
from tba.errors import ConfigError
from tba.run.logger import MetricsLogger
from tba.run.reporters import REPORTERS, open_reporters, run_name, scalars, wandb_logged_in

SRC = Path(__file__).parents[2] / "src"
LINES = [(1, {"trainer/loss": 1.5, "searcher/reward_mean": float("nan"), "wall_clock_s": 3.0}),
         (2, {"trainer/loss": 0.5, "searcher/reward_mean": 0.25, "wall_clock_s": 4.0})]


def write(out: Path, cfg: LoggingConfig) -> MetricsLogger:
    metrics = MetricsLogger(out, cfg, {"seed": 3})
    for step, line in LINES:
        metrics.log(step, line)
    metrics.close()
    return metrics


def test_what_the_backends_get_and_the_run_name(tmp_path):
    assert scalars({"trainer/loss": 1, "x/nan": float("nan"), "wall_clock_s": 2.0, "x/flag": True}) == {
        "trainer/loss": 1.0}
    assert run_name(LoggingConfig(), tmp_path / "seed7") == "seed7"
    assert run_name(LoggingConfig(run_name="mine"), tmp_path / "seed7") == "mine"
    assert set(REPORTERS) == {"tensorboard", "wandb", "trackio", "mlflow"}


def test_none_writes_metrics_jsonl_only(tmp_path):
    write(tmp_path, LoggingConfig(report_to=["none"]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"step": 1, "trainer/loss": 1.5, "searcher/reward_mean": None, "wall_clock_s": 3.0}


def test_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write(tmp_path, LoggingConfig())
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("trainer/loss")] == [(1, 1.5), (2, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("searcher/reward_mean")] == [(2, 0.25)]  # NaN left out


def test_mlflow_writes_a_sqlite_store_under_the_run_directory(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    write(tmp_path, LoggingConfig(report_to=["mlflow"], project="arith", run_name="seed3"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("arith").experiment_id])[0]
    assert run.info.run_name == "seed3" and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "trainer/loss")] == [
        (1, 1.5), (2, 0.5)]
    assert (tmp_path / "mlflow" / "artifacts" / run.info.run_id / "artifacts" / "config.json").is_file()


TRACKIO = """
import sys
from pathlib import Path
from tba.config.reporting import LoggingConfig
from tba.run.logger import MetricsLogger
from trackio.sqlite_storage import SQLiteStorage
out = Path(sys.argv[1])
metrics = MetricsLogger(out, LoggingConfig(report_to=["trackio"], project="arith", wandb_group="sweep"), {"seed": 3})
metrics.log(1, {"trainer/loss": 1.5})
metrics.log(2, {"trainer/loss": 0.5, "eval/score": 0.25})
metrics.close()
print([(row["step"], row["trainer/loss"]) for row in SQLiteStorage.get_logs("arith", out.name)])
"""


def test_trackio_keeps_its_local_store(tmp_path):
    """In a process of its own: trackio reads TRACKIO_DIR when it is imported."""
    pytest.importorskip("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "seed3"
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", TRACKIO, str(out)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[(1, 1.5), (2, 0.5)]" in done.stdout.splitlines(), done.stdout
    assert (tmp_path / "trackio" / "arith.db").is_file()


def test_wandb_offline_unless_logged_in(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert not wandb_logged_in()
    cfg = LoggingConfig(report_to=["wandb"], run_name="seed3", wandb_entity="lab", wandb_tags=["a"],
                        wandb_group="sweep")
    metrics = MetricsLogger(tmp_path, cfg, {"seed": 3})
    (reporter,) = metrics.reporters
    run = reporter.run
    assert (run.name, run.group, tuple(run.tags), run.settings.mode) == ("seed3", "sweep", ("a",), "offline")
    assert run.config["seed"] == 3
    for step, line in LINES:
        metrics.log(step, line)
    metrics.close()
    wandb.teardown()  # the test's own: ends W&B's service process, which outlives a run
    (record,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")  # what `wandb sync` uploads
    assert b"trainer/loss" in record.read_bytes()


def test_a_missing_library_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow raises ImportError
    with pytest.raises(ConfigError, match=r"mlflow needs the mlflow package, which is not installed: "
                                          r"pip install 'tba\[mlflow\]'"):
        open_reporters(LoggingConfig(report_to=["tensorboard", "mlflow"]), tmp_path)
