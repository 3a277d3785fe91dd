"""The verifiers task (tba.tasks.verifiers): its name's env id reaches the task, verifiers' branches are checked
against the calls the endpoint served (ids, mask, log-probs, every call in a branch), options are checked, and the
reward is the trace's. The episodes themselves run in tests/integration/test_verifiers_train.py."""

import sys
from types import SimpleNamespace

import pytest
from paths import FIXTURES

from tba.config import RunConfig
from tba.errors import ConfigError
from tba.run.searchers import task_spec
from tba.tasks import task_target
from tba.tasks.verifiers import importable, mismatch


def call(prompt, tokens, logprobs=None):
    sample = {"token_ids": tokens, "logprobs": logprobs or [-0.5] * len(tokens)}
    return {"prompt_token_ids": prompt, "samples": [sample]}


def branch(ids, mask, logprobs=None):
    return SimpleNamespace(token_ids=ids, sampled_mask=[bool(m) for m in mask],
                           logprobs=logprobs or [-0.5 if m else 0.0 for m in mask])


def test_the_name_carries_the_env_id():
    assert task_target("verifiers:owner/env@0.1") == ("tba.tasks.verifiers:VerifiersTask", {"env_id": "owner/env@0.1"})
    assert task_target("arith") == ("tba.tasks.arith:ArithTask", {})
    assert task_target("my.module:factory") == ("my.module:factory", {})
    cfg = RunConfig()
    cfg.task.name, cfg.task.options = "verifiers:tiny_add", {"timeout_s": 5}
    assert task_spec(cfg).options == {"timeout_s": 5, "env_id": "tiny_add"}
    cfg.task.options = {"env_id": "other"}
    with pytest.raises(ConfigError, match="env_id"):
        task_spec(cfg)


def test_branches_must_be_the_served_calls():
    calls = [call([1, 2], [3, 4]), call([1, 2, 3, 4, 5], [6])]
    two_turns = branch([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1])
    assert mismatch([two_turns], calls) is None
    assert mismatch([branch([1, 2, 3, 4], [0, 0, 1, 1]), branch([9, 6], [0, 1])], calls[:1] + [call([9], [6])]) is None
    assert "served calls are in no branch" in mismatch([branch([1, 2, 3, 4], [0, 0, 1, 1])], calls)
    assert "sampled_mask" in mismatch([branch([1, 2, 3, 4, 5, 6], [0, 1, 1, 1, 0, 1])], calls)
    assert "log-probs" in mismatch([branch([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1], [0, 0, -0.5, -0.4, 0, -0.5])],
                                   calls)
    assert "after the last call" in mismatch([branch([1, 2, 3, 4, 7], [0, 0, 1, 1, 0])], calls[:1])
    assert "starts with no served call" in mismatch([branch([8, 3, 4], [0, 1, 1])], calls[:1])


@pytest.fixture
def tasksets(monkeypatch):
    pytest.importorskip("verifiers")
    monkeypatch.syspath_prepend(str(FIXTURES / "vf_envs"))


def test_tasks_are_the_tasksets_and_options_are_checked(tasksets):
    from tba.tasks.base import TaskAdapter
    from tba.tasks.verifiers import VerifiersTask

    task = VerifiersTask("tiny_add", env={"taskset": {"num_tasks": 30}}, test_size=2, train_size=20)
    assert TaskAdapter(task).agentic and not TaskAdapter(task).missing()
    assert len(task.train) == 20 and len(task.test) == 2
    assert task.train[3].text.startswith("What is 3 + 4?") and task.test[0].meta["idx"] == 28
    trace = SimpleNamespace(rewards={"exact": SimpleNamespace(score=1.0)}, reward=1.0)
    assert task.score(task.train[0], trace, "") == (1.0, {"exact": 1.0})
    assert task.score(task.train[0], SimpleNamespace(rewards={"exact": None}, reward=0.0), "") == (None, {})
    assert task.reward_metrics() == {"reward/exact": 1.0}
    multi = VerifiersTask("tiny_multi")  # two tasks, no prompt text: one held out, named by index
    assert [p.text for p in multi.train + multi.test] == ["tiny_multi task 0", "tiny_multi task 1"]
    for options, match in (({"on_break": "merge"}, "on_break"), ({"timeout_s": 0}, "timeout_s"),
                           ({"env": {"taskset": {"num_tasks": "many"}}}, "refused the environment config")):
        with pytest.raises(ConfigError, match=match):
            VerifiersTask("tiny_add", **options)


def test_a_tasksets_folder_is_imported_by_its_name_from_its_parent(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "my_taskset").mkdir()
    (tmp_path / "my_taskset" / "__init__.py").write_text("")
    assert importable(str(tmp_path / "my_taskset")) == "my_taskset" and sys.path[0] == str(tmp_path)
    assert importable("owner/name@1.0") == "owner/name@1.0" and importable("tiny_add") == "tiny_add"
    (tmp_path / "not_a_package").mkdir()
    assert importable(str(tmp_path / "not_a_package")) == str(tmp_path / "not_a_package")
