"""`tba buffer stats|dump`: a run's durable buffer, read-only, decoded with the run's tokenizer."""

import json

from tba.algorithm.store import BufferStore
from tba.algorithm.types import Group, Sample
from tba.cli import main
from tba.config import load_config, save_config
from tba.models import save_checkpoint


def test_dump_decodes_a_run_that_stopped_before_any_checkpoint(tmp_path, tiny_model, tiny_tokenizer, capsys):
    """No checkpoint/, no init/ (a hub or directory policy is not copied there): the config's model.policy still
    names the tokenizer the samples were made with."""
    save_checkpoint(tiny_model, tiny_tokenizer, tmp_path / "model")
    run = tmp_path / "run"
    run.mkdir()
    save_config(load_config(None, [f"model.policy={tmp_path / 'model'}", "task.name=reasoning_gym"]),
                run / "config.yaml")
    prompt, answer = tiny_tokenizer("12+34=")["input_ids"], tiny_tokenizer("46", add_special_tokens=False)["input_ids"]
    store = BufferStore(run)
    store.append([Group(0, prompt, [Sample(answer, [-1.0] * len(answer), 1.0, 0)])], step=0)
    store.close()
    assert main(["buffer", "dump", str(run)]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["prompt"].endswith("12+34=") and row["samples"][0]["text"] == "46"


def test_dump_shows_each_samples_policy_versions_as_spans(tmp_path, capsys):
    """A sample whose tokens came from several versions (in-flight weight updates) is dumped with [first token,
    version] spans; one from a single version has none."""
    store = BufferStore(tmp_path)
    mixed = Sample([5, 6, 7, 8], [-1.0] * 4, 1.0, 3, versions=[3, 3, 4, 4])
    store.append([Group(0, [1, 2], [mixed, Sample([5], [-1.0], 0.0, 4)])], step=0)
    store.close()
    assert main(["buffer", "dump", str(tmp_path)]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert row["samples"][0]["versions"] == [[0, 3], [2, 4]] and row["samples"][0]["version"] == 3
    assert "versions" not in row["samples"][1]
