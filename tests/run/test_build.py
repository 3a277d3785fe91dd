"""The builder: registries turn config names into objects, and nothing it opens is left open."""

import pytest

from tba.algorithm.objectives import OBJECTIVES
from tba.algorithm.store import BufferStore
from tba.algorithm.types import Group, Sample
from tba.config import ConfigError, load_config
from tba.config.schema import BaselineConfig, TBConfig
from tba.plugins import load_object
from tba.rollout.samplers import SAMPLERS
from tba.run import build
from tba.runtime import RUNTIMES
from tba.tasks import TASKS


def test_the_offline_buffer_store_is_closed_after_loading(tmp_path, monkeypatch):
    """runtime=offline read the saved buffer through a BufferStore that nobody closed."""
    saved = BufferStore(tmp_path / "saved")
    saved.append([Group(prompt_id=1, prompt_tokens=[1, 2], samples=[
        Sample(response=[3, 4], ref_logprobs=[-1.0, -1.0], reward=1.0, version=0)])], step=0)
    saved.close()
    opened, closed = [], []

    class Counting(BufferStore):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            opened.append(self)

        def close(self):
            closed.append(self)
            super().close()

    monkeypatch.setattr("tba.algorithm.buffer.BufferStore", Counting)
    cfg = load_config(None, [f"output_dir={tmp_path / 'run'}", "runtime=offline",
                             f"buffer.source={tmp_path / 'saved'}"])
    buffer = build.build_buffer(cfg, tmp_path / "run", None, None)
    assert len(buffer) == 1 and buffer.store is None
    assert opened and opened == closed


def test_every_registered_objective_and_task_is_accepted_by_config_validation():
    for name in OBJECTIVES:
        assert load_config(None, [f"objective={name}"]).objective == name
        assert callable(OBJECTIVES[name].bind(TBConfig(), BaselineConfig(), max_tokens=8).fn)
    for name, spec in TASKS.items():
        policy = [] if spec.builtin_model else ["model.policy=some/model"]
        assert load_config(None, [f"task.name={name}", *policy]).task.name == name
    with pytest.raises(ConfigError, match="tb, dr_grpo"):
        load_config(None, ["objective=ppo"])
    with pytest.raises(ConfigError, match="give gsm8k a real model"):
        load_config(None, ["task.name=gsm8k"])


def test_an_objective_that_owns_its_reference_gets_a_copy(tiny_model, tiny_tokenizer):
    cfg = load_config(None, ["objective=tba_prime"])
    trainer = build.build_trainer(cfg, tiny_model, tiny_model, tiny_tokenizer)
    assert trainer.reference is not None and trainer.reference is not tiny_model
    assert build.build_trainer(load_config(None, []), tiny_model, tiny_model, tiny_tokenizer).reference is None


@pytest.mark.parametrize("registry", [TASKS, RUNTIMES, SAMPLERS, OBJECTIVES], ids=["tasks", "runtimes", "samplers",
                                                                                  "objectives"])
def test_every_registry_entry_names_a_loadable_target(registry):
    for entry in registry.values():
        assert callable(load_object(entry.target, "test")), entry


def test_a_target_that_cannot_load_is_a_config_error_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"task.name: cannot load 'tba.nowhere:f': ModuleNotFoundError"):
        load_object("tba.nowhere:f", "task.name")
    with pytest.raises(ConfigError, match=r"search.backend: cannot load '.*x.py:build': FileNotFoundError"):
        load_object(f"{tmp_path / 'x.py'}:build", "search.backend")
    (tmp_path / "y.py").write_text("def other(): pass\n")
    with pytest.raises(ConfigError, match=r"search.backend: cannot load .*: AttributeError"):
        load_object(f"{tmp_path / 'y.py'}:build", "search.backend")
