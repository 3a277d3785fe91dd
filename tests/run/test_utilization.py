"""trainer/mfu = the update's model FLOPs / (its seconds × the devices' peak)."""

import torch

from tba.algorithm.types import Draw, Sample
from tba.models.flops import ModelFlops
from tba.run.peak import Peak
from tba.run.utilization import Utilization, utilization

FLOPS = ModelFlops(body=20480, head=4096, layers=2, attention_width=32)


def draw(prompt: int, responses: list[int]) -> Draw:
    return Draw(0, [5] * prompt, [Sample([7] * r, [0.0] * r, 0.0, 0) for r in responses], online=True)


def test_mfu_is_the_hand_count_over_seconds_and_peak():
    hand = 6 * 20480 * 17 + 6 * 4096 * 7 + 768 * (64 + 81)  # tests/models/test_flops.py's group, each sample alone
    mfu = Utilization(FLOPS, Peak(1e9, "test"), devices=2, shared_prompts=False)([draw(5, [3, 4])], 0.5)
    assert mfu == {"trainer/mfu": hand / (0.5 * 1e9 * 2)}


def test_an_unknown_peak_logs_no_mfu_and_says_so(monkeypatch, caplog, tiny_model):
    import tba.run.utilization as u

    monkeypatch.setattr(u, "device_peak", lambda device, dtype: None)
    with caplog.at_level("INFO", logger="tba"):
        assert utilization([torch.device("cpu")], "float32", tiny_model.config, lora=False, shared_prompts=True) is None
    assert "trainer/mfu: not logged" in caplog.text


def test_a_cpu_trainer_gets_its_measured_peak(monkeypatch, tmp_path, tiny_model):
    monkeypatch.setenv("TBA_CACHE", str(tmp_path))
    made = utilization([torch.device("cpu")], "float32", tiny_model.config, lora=False, shared_prompts=True)
    assert made.peak.flops > 1e8 and made.flops.layers == tiny_model.config.num_hidden_layers
    assert (tmp_path / "gemm_peak.json").is_file()
