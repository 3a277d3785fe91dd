"""`tba plan` prints the plan and exits 1 when it does not fit (naming the smallest change that fits), 2 when a GPU
of the layout could not be checked; `--gpus` plans for a target from a machine without GPUs, vLLM or the model's
files; `tba train` refuses a run that does not fit with the same message before loading any model, and
`--ignore-plan` goes past it (in process: cli.main). The GPU recipes fit the machines they are written for."""

import importlib.util

import pytest

import tba.api
import tba.run.build
import tba.run.plan
import tba.run.plan.machine
from tba.cli import main

SMALL = ["model.tiny.hidden_size=16", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
         "model.tiny.intermediate_size=32", "task.max_prompt_tokens=8", "runtime=inline", "mode=sync"]


@pytest.fixture
def tiny_capacity(monkeypatch):
    monkeypatch.setattr(tba.run.plan.machine, "machine_capacity", lambda device: 1024**2)


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


@pytest.fixture
def no_vllm_no_download(monkeypatch):
    """A laptop: no vLLM, no Hugging Face cache (the recipes' models come from the published shapes)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_the_7b_recipe_fits_8_h100s_and_with_one_trainer_rank_names_the_change_that_fits(no_vllm_no_download, capsys):
    assert main(["plan", "--gpus", "8xH100", "gsm8k-qwen7b-8gpu"]) == 0
    out = capsys.readouterr().out
    assert "DOES NOT FIT" not in out and all(f"cuda:{k}: fits" in out for k in range(8))
    assert "trainer rank 3" in out and "vLLM engine" in out
    assert main(["plan", "--gpus", "8xH100", "gsm8k-qwen7b-8gpu", "trainer.world_size=1"]) == 1
    captured = capsys.readouterr()
    assert "cuda:0: DOES NOT FIT" in captured.out
    assert captured.err.splitlines()[-1] == "tba: plan: it fits with trainer.world_size=4"


@pytest.mark.parametrize("recipe, gpus", [("gsm8k-qwen1.5b-1gpu", "1xH100"), ("gsm8k-qwen1.5b-4gpu", "4xA100-80GB"),
                                          ("gsm8k-qwen1.5b-8gpu", "8xH100")])
def test_each_1_5b_recipe_fits_the_gpus_it_is_written_for(recipe, gpus, no_vllm_no_download, capsys):
    assert main(["plan", "--gpus", gpus, recipe]) == 0
    assert "DOES NOT FIT" not in capsys.readouterr().out


def test_a_gpu_layout_planned_where_no_gpu_is_visible_exits_2_and_suggests_gpus(monkeypatch, capsys):
    monkeypatch.setattr(tba.run.plan.machine, "machine_capacity",
                        lambda device: 64 * 2**30 if device == "cpu" else None)
    assert main(["plan", *SMALL, "model.device=cuda:0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tba: plan: cuda:0: capacity unknown on this machine, not checked") and "--gpus 8xH100" in err
    assert main(["plan", "--gpus", "1x24GB", *SMALL, "model.device=cuda:0"]) == 0
