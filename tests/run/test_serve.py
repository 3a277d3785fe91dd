"""What `tba serve` serves: a recipe's starting policy, or a run's newest policy at the version it was trained to."""

import json
import shutil

import pytest
import torch
from paths import TINY

from tba.models import save_checkpoint
from tba.run.serve import load, served


def test_a_recipe_serves_its_starting_policy():
    cfg, run_dir = load(TINY, ["sft.enabled=false"])
    policy = served(cfg, run_dir, slots=4)
    try:
        assert run_dir is None and policy.version == 0 and policy.name == "builtin" and policy.slots == 4
        assert policy.max_model_len == 256  # the builtin model's context
        assert policy.sampler.generate([[1, 5]], num_samples=1, temperature=1.0, top_p=1.0, max_new_tokens=3)
    finally:
        policy.close()


@pytest.mark.parametrize("final", [True, False])
def test_a_run_serves_its_newest_policy_at_its_version(tmp_path, tiny_model, tiny_tokenizer, final):
    run = tmp_path / "my-run"
    run.mkdir()
    shutil.copy(TINY, run / "config.yaml")
    if final:
        save_checkpoint(tiny_model, tiny_tokenizer, run / "checkpoint")
        (run / "summary.json").write_text(json.dumps({"trainer_steps": 7}))
    else:
        from tba.run import checkpoint as ckpt

        ckpt.save(run, step=5, policy=tiny_model, tokenizer=tiny_tokenizer,
                  optimizer=torch.optim.SGD(tiny_model.parameters(), lr=0.1), state={"version": 5})
    cfg, run_dir = load(str(run), [])
    policy = served(cfg, run_dir)
    try:
        assert policy.version == (7 if final else 5) and policy.name == "my-run"
        weights = next(iter(policy.sampler.model.state_dict().values()))
        assert torch.equal(weights, next(iter(tiny_model.state_dict().values())))
    finally:
        policy.close()
