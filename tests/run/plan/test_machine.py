"""The machine a plan is for (tba.run.plan.machine): `--gpus` in its forms — a GPU of the table with or without a
count, a size per GPU in GB (10^9) or GiB (2^30) — and what a target says of each device."""

import pytest

from tba.errors import UserError
from tba.run.plan.machine import GPUS, device_key, parse_gpus, parse_size, target_machine


def test_gpus_takes_a_count_and_a_name_or_a_size():
    assert parse_gpus("8xH100") == (8, GPUS["H100"][0], "H100")
    assert parse_gpus("4 x a100-80gb") == (4, GPUS["A100-80GB"][0], "A100-80GB")
    assert parse_gpus("NVIDIA H200") == (None, 141 * 10**9, "H200")
    assert parse_gpus("2x24GB")[:2] == (2, 24 * 10**9)
    assert parse_gpus("80GiB")[:2] == (None, 80 * 2**30)
    assert parse_gpus("4090")[2] == "RTX4090"


def test_an_ambiguous_or_unknown_gpu_is_refused_with_what_is_known():
    with pytest.raises(UserError, match="A100-40GB or A100-80GB"):
        parse_gpus("8xA100")
    with pytest.raises(UserError, match="known: H100, H100-NVL, H200"):
        parse_gpus("2xB9000")
    with pytest.raises(UserError, match="not a size"):
        parse_size("lots")


def test_every_table_entry_is_a_plausible_gpu_with_its_source():
    for name, (total, source) in GPUS.items():
        assert 14 * 2**30 < total < 150 * 2**30 and source, name


def test_a_target_knows_its_gpus_and_its_cpu_only_when_told():
    eight = target_machine("8xH100")
    assert eight.capacity("cuda:7") == GPUS["H100"][0] and eight.capacity("cuda:8") is None
    assert eight.capacity("cpu") is None and eight.gpu_count() == 8
    assert target_machine("8xH100", "1TB").capacity("cpu") == 10**12
    assert target_machine("24GB").capacity("cuda:11") == 24 * 10**9  # no count: every GPU the layout names
    assert device_key("auto", eight) == "cuda:0" and device_key("cuda", eight) == "cuda:0"
