"""Full checkpoints: atomic, complete, and read back without unpickling anything."""

import copy
import errno
import json
import random

import numpy as np
import pytest
import torch

from tba.algorithm.seeding import rng_state, set_rng_state
from tba.run import checkpoint as ckpt


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
    set_rng_state(state["rng"])
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


TENSORS = "tensors.safetensors"


def _truncate(file, keep=0.5):
    data = file.read_bytes()
    file.write_bytes(data[:int(len(data) * keep)])


def test_a_truncated_newest_checkpoint_is_skipped_with_a_warning_naming_the_file(tmp_path, tiny_model,
                                                                                 tiny_tokenizer, caplog):
    model, opt = _trained(tiny_model)
    old, new = (ckpt.save(tmp_path, step=s, policy=model, tokenizer=tiny_tokenizer, optimizer=opt, state={})
                for s in (1, 2))
    assert ckpt.latest(tmp_path) == new
    _truncate(new / "model" / "model.safetensors")
    assert ckpt.latest(tmp_path) == old
    logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(logged) == 1 and str(new / "model" / "model.safetensors") in logged[0]
    assert "truncated" in logged[0] and f"using {old} instead" in logged[0]

    _truncate(old / "model" / "model.safetensors")
    (old / TENSORS).write_bytes((old / TENSORS).read_bytes()[:-1])  # one byte short is caught as well
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.latest(tmp_path, quiet=True)
    msg = str(info.value)
    for bad in (new / "model" / "model.safetensors", old / "model" / "model.safetensors", old / TENSORS):
        assert f"{bad}: truncated" in msg
    assert msg.startswith(f"no usable checkpoint in {tmp_path / 'checkpoints'}") and len(logged) == 1



def test_unusable_checkpoint_files_are_each_named_with_the_reason(tmp_path, tiny_model, tiny_tokenizer):
    model, opt = _trained(tiny_model)
    path = ckpt.save(tmp_path, step=1, policy=model, tokenizer=tiny_tokenizer, optimizer=opt, state={},
                     reference=model)
    assert ckpt.problems(path) == []
    config, ref, tensors = path / "model" / "config.json", path / "reference" / "model.safetensors", path / TENSORS
    config.write_text('{"model_type": ')
    size = ref.stat().st_size
    ref.write_bytes(ref.read_bytes() + b"\0")  # a trailing byte: safetensors refuses it too
    header = 8 + int.from_bytes(tensors.read_bytes()[:8], "little")
    tensors.write_bytes(tensors.read_bytes()[:header - 1])  # cut inside the header
    assert ckpt.problems(path) == [f"{config}: corrupt (JSONDecodeError: Expecting value: line 1 column 16 (char 15))",
                                   f"{ref}: too long ({size + 1} bytes, the header says {size})",
                                   f"{tensors}: truncated ({header - 1} bytes, the header alone needs {header})"]
    (path / "model" / "model.safetensors").unlink()
    assert f"{path / 'model'}: no *.safetensors weights" in ckpt.problems(path)
    with pytest.raises(ckpt.CheckpointError, match="no usable checkpoint"):
        ckpt.latest(tmp_path)


class _FakeCuda:
    """torch.cuda's RNG API for `n` devices, without a GPU: states are byte tensors, set ones are recorded."""

    def __init__(self, monkeypatch, n: int, initialized: bool = True):
        self.states = [torch.arange(16, dtype=torch.uint8) + 16 * i for i in range(n)]
        self.restored = None
        for name, fake in {"is_available": lambda: True, "is_initialized": lambda: initialized,
                           "device_count": lambda: n, "get_rng_state_all": self.get,
                           "set_rng_state_all": self.set}.items():
            monkeypatch.setattr(torch.cuda, name, fake)

    def get(self):
        return [s.clone() for s in self.states]

    def set(self, states):
        self.restored = [s.clone() for s in states]


def test_cuda_rng_states_are_saved_and_restored_on_as_many_devices(tmp_path, tiny_model, tiny_tokenizer,
                                                                    monkeypatch):
    model, opt = _trained(tiny_model)
    fake = _FakeCuda(monkeypatch, 2)
    path = ckpt.save(tmp_path, step=1, policy=model, tokenizer=tiny_tokenizer, optimizer=opt, state={})
    state = ckpt.load(path)["rng"]
    assert len(state["cuda"]) == 2
    set_rng_state(state)
    assert fake.restored is not None and all(map(torch.equal, fake.restored, fake.states))

    fewer = _FakeCuda(monkeypatch, 1)  # resumed with another number of GPUs: a warning, nothing restored
    with pytest.warns(RuntimeWarning, match=r"2 CUDA generator\(s\) but this process sees 1"):
        set_rng_state(state)
    assert fewer.restored is None
    older = {k: v for k, v in state.items() if k != "cuda"}  # a checkpoint from before CUDA states were kept
    set_rng_state(older)
    assert fewer.restored is None

    _FakeCuda(monkeypatch, 2, initialized=False)  # CUDA available but unused: not initialised to save
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("would initialise CUDA"))
    assert "cuda" not in rng_state()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_rng_round_trip_on_a_gpu():
    torch.cuda.manual_seed_all(5)
    torch.rand(1, device="cuda")  # initialises CUDA and advances its generator
    state = json.loads(json.dumps(rng_state()))
    assert len(state["cuda"]) == torch.cuda.device_count()
    expected = torch.rand(8, device="cuda")
    torch.cuda.manual_seed_all(6)
    set_rng_state(state)
    assert torch.equal(torch.rand(8, device="cuda"), expected)


def test_a_checkpoint_of_another_format_is_refused_with_what_to_do(tmp_path, tiny_model, tiny_tokenizer):
    model, opt = _trained(tiny_model)
    path = ckpt.save(tmp_path, step=1, policy=model, tokenizer=tiny_tokenizer, optimizer=opt, state={})
    assert ckpt.load(path)["format_version"] == ckpt.FORMAT_VERSION
    state = json.loads((path / "state.json").read_text())
    state["format_version"] = ckpt.FORMAT_VERSION + 1
    (path / "state.json").write_text(json.dumps(state))
    with pytest.raises(ckpt.CheckpointError, match=rf"of format {ckpt.FORMAT_VERSION + 1}; this tba reads format "
                                                   rf"{ckpt.FORMAT_VERSION}\. Start the run over .*model.policy="):
        ckpt.load(path)
