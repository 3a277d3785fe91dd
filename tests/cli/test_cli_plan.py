"""`tba plan` prints the plan and exits 1 when it does not fit; `tba train` refuses such a run with the same message
before loading any model, and `--ignore-plan` goes past it (in process: cli.main)."""

import pytest

import tba.api
import tba.run.build
import tba.run.plan
from tba.cli import main

SMALL = ["model.tiny.hidden_size=16", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
         "model.tiny.intermediate_size=32", "task.max_prompt_tokens=8", "runtime=inline", "mode=sync"]


@pytest.fixture
def tiny_capacity(monkeypatch):
    monkeypatch.setattr(tba.run.plan, "machine_capacity", lambda device: 1024**2)


def test_plan_exits_0_when_it_fits(capsys):
    assert main(["plan", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "trainer" in out and "searcher 0 (policy)" in out and "cpu: fits" in out


def test_plan_exits_1_naming_the_device_when_it_does_not_fit(tiny_capacity, capsys):
    assert main(["plan", *SMALL]) == 1
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.out
    assert captured.err.startswith("tba: plan: the run does not fit in memory") and "cpu needs about" in captured.err


def test_train_refuses_before_loading_a_model_and_ignore_plan_goes_on(tiny_capacity, monkeypatch, tmp_path, capsys):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(tba.run.build, "build_models", no_model)
    args = ["train", *SMALL, f"output_dir={tmp_path / 'run'}"]
    assert main(args) == 1
    assert "tba: plan: the run does not fit in memory" in capsys.readouterr().err
    trained = []
    monkeypatch.setattr(tba.api.TBATrainer, "train", lambda self, **kwargs: trained.append(kwargs) or {})
    assert main([*args, "--ignore-plan"]) == 0
    assert trained


def test_a_plan_that_cannot_be_made_never_stops_a_run(monkeypatch, tmp_path, caplog):
    def broken(cfg, capacity=None):
        raise RuntimeError("no config")

    monkeypatch.setattr(tba.run.plan, "make_plan", broken)
    monkeypatch.setattr(tba.api.TBATrainer, "train", lambda self, **kwargs: {})
    with caplog.at_level("DEBUG", logger="tba"):
        assert main(["train", *SMALL, f"output_dir={tmp_path / 'run'}"]) == 0
    assert "memory plan skipped" in caplog.text
