"""Full checkpoints: atomic, complete, and read back without unpickling anything."""

import copy
import errno
import json
import random

import numpy as np
import pytest
import torch

from tba import checkpoint as ckpt


def _trained(tiny_model):
    model = copy.deepcopy(tiny_model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(input_ids=torch.tensor([[1, 5, 6, 7]]), labels=torch.tensor([[1, 5, 6, 7]])).loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_save_then_load_restores_optimizer_rng_and_state(tmp_path, tiny_model, tiny_tokenizer):
    model, opt = _trained(tiny_model)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    path = ckpt.save(tmp_path, step=7, policy=model, tokenizer=tiny_tokenizer, optimizer=opt,
                     state={"version": 7, "loop": {"evals": [[0, 0.5, 0.0]]}})
    expected = (random.random(), np.random.rand(), torch.rand(1))
    assert ckpt.latest(tmp_path) == path and path.name == "step_0000007"
    assert {p.suffix for p in path.rglob("*") if p.is_file()} <= {".json", ".safetensors", ".jinja", ""}

    model2 = copy.deepcopy(tiny_model)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=5.0)
    state = ckpt.load(path, optimizer=opt2)
    assert state["step"] == 7 and state["loop"]["evals"] == [[0, 0.5, 0.0]]
    for p, p2 in zip(model.parameters(), model2.parameters(), strict=True):
        a, b = opt.state[p], opt2.state[p2]
        assert all(torch.equal(a[k], b[k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    ckpt.set_rng_state(state["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


def test_half_written_checkpoints_are_never_latest_and_old_ones_are_pruned(tmp_path, tiny_model, tiny_tokenizer):
    model, opt = _trained(tiny_model)
    for step in (1, 2, 3):
        ckpt.save(tmp_path, step=step, policy=model, tokenizer=tiny_tokenizer, optimizer=opt, state={}, keep=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_0000002", "step_0000003"]
    (root / "step_0000004.tmp").mkdir()  # a kill in the middle of writing step 4
    (root / "step_0000005").mkdir()  # or a directory without its state file
    assert ckpt.latest(tmp_path).name == "step_0000003"
    (root / "latest").write_text("step_0000009")  # a pointer to something that is not there
    assert ckpt.latest(tmp_path).name == "step_0000003"


def test_disk_full_names_the_problem_and_keeps_the_last_good_checkpoint(tmp_path, tiny_model, tiny_tokenizer,
                                                                      monkeypatch):
    model, opt = _trained(tiny_model)
    good = ckpt.save(tmp_path, step=1, policy=model, tokenizer=tiny_tokenizer, optimizer=opt, state={"x": 1})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "save_file", full)
    with pytest.raises(ckpt.CheckpointError, match=r"disk full: checkpoint of step 2 .* last good checkpoint "
                                                   r".*step_0000001\) is intact"):
        ckpt.save(tmp_path, step=2, policy=model, tokenizer=tiny_tokenizer, optimizer=opt, state={})
    assert ckpt.latest(tmp_path) == good and json.loads((good / "state.json").read_text())["x"] == 1
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
