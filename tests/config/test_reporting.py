"""logging.report_to: TRL's names and values, a comma list on the command line, and logging.tensorboard /
logging.wandb as aliases — LoggingConfig.backends is the one place that decides."""

import pytest

from tba.config import load_config
from tba.config.reporting import LoggingConfig
from tba.errors import ConfigError


def backends(*overrides):
    return load_config(None, list(overrides), check_installed=False).logging.backends()


def test_tensorboard_by_default_and_lists_as_trl_writes_them():
    assert backends() == ["tensorboard"]
    assert backends("logging.report_to=[wandb, trackio]") == ["wandb", "trackio"]
    assert backends("logging.report_to=wandb,mlflow") == ["wandb", "mlflow"]  # the command line's comma list
    assert backends("logging.report_to=mlflow") == ["mlflow"]
    assert backends("logging.report_to=none") == []
    assert LoggingConfig(report_to="wandb").backends() == ["wandb"]  # set as an attribute, TRL's string


def test_the_old_switches_add_or_remove_one_backend():
    assert backends("logging.tensorboard=false") == []
    assert backends("logging.wandb=true") == ["tensorboard", "wandb"]
    assert backends("logging.report_to=[mlflow]", "logging.tensorboard=true") == ["mlflow", "tensorboard"]
    assert backends("logging.report_to=[wandb, tensorboard]", "logging.wandb=false") == ["tensorboard"]
    assert backends("logging.report_to=none", "logging.wandb=true") == ["wandb"]


def test_all_is_every_backend_installed(monkeypatch):
    import tba.config.reporting as reporting

    monkeypatch.setattr(reporting, "installed", lambda module: module in ("tensorboard", "mlflow"))
    assert backends("logging.report_to=all") == ["tensorboard", "mlflow"]


@pytest.mark.parametrize("value, says", [("comet", "unknown backend 'comet'"), ("[none, wandb]", "stand alone"),
                                         ("[all, mlflow]", "stand alone")])
def test_a_bad_value_names_the_key(value, says):
    with pytest.raises(ConfigError, match=f"logging.report_to: .*{says}"):
        backends(f"logging.report_to={value}")


def test_a_backend_not_installed_is_one_line_naming_the_extra(monkeypatch):
    import tba.config.reporting as reporting

    monkeypatch.setattr(reporting, "installed", lambda module: module != "trackio")
    with pytest.raises(ConfigError, match=r"trackio needs the trackio package, which is not installed: "
                                          r"pip install 'tba\[trackio\]'"):
        load_config(None, ["logging.report_to=trackio"])


def test_names_and_wandb_settings_load():
    cfg = load_config(None, ["logging.run_name=seed3", "logging.wandb_entity=lab", "logging.wandb_tags=a,b",
                             "logging.wandb_group=sweep", "logging.project=tb"], check_installed=False).logging
    assert (cfg.run_name, cfg.wandb_entity, cfg.wandb_tags, cfg.wandb_group, cfg.project) == (
        "seed3", "lab", ["a", "b"], "sweep", "tb")
