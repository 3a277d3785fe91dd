"""When a layout does not fit, the smallest change that does (tba.run.plan.fix): activation checkpointing before
smaller micro-batches before more ranks before fewer searchers, LoRA last, each candidate planned again."""

from tba.config import load_config
from tba.run.plan import make_plan, target_machine
from tba.run.plan.fix import advice, candidates, smallest_fix

SEVEN_B = "gsm8k-qwen7b-8gpu"


def test_candidates_come_cheapest_first_with_the_devices_more_ranks_need():
    cfg = load_config(SEVEN_B, ["trainer.world_size=1", "trainer.activation_checkpointing=false"],
                      check_installed=False)
    tried = list(candidates(cfg, target_machine("8xH100")))
    assert tried[0] == ["trainer.activation_checkpointing=true"]
    assert ["trainer.world_size=2", "trainer.fsdp.devices=cuda:0,cuda:1"] in tried
    assert ["trainer.world_size=4"] in tried  # the recipe's own four devices
    assert tried.index(["trainer.world_size=4"]) < tried.index(["search.num_searchers=3"])
    assert tried[-2][0] == "model.lora.enabled=true"


def test_a_7b_full_fine_tune_on_one_80_gb_gpu_fits_with_four_ranks():
    cfg = load_config(SEVEN_B, ["trainer.world_size=1"], check_installed=False)
    machine = target_machine("8xH100")
    assert not make_plan(cfg, machine).fits
    assert smallest_fix(cfg, machine) == ["trainer.world_size=4"]
    assert advice(cfg, machine) == "it fits with trainer.world_size=4"


def test_when_no_change_fits_the_advice_says_so():
    cfg = load_config(SEVEN_B, check_installed=False)
    assert smallest_fix(cfg, target_machine("8x4GB")) is None
    assert advice(cfg, target_machine("8x4GB")).startswith("no single change")
