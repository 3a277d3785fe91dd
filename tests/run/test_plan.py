"""The memory plan (tba.run.plan) by hand on a small shape: parameters, gradients and AdamW's moments, ÷ N over
sharded ranks; LoRA shrinks the trainable terms; a quantized searcher's copy is smaller than its full model; a
capacity too small is refused with the device, the need and what to change."""

import pytest

from tba.config import load_config
from tba.config.schema import TinyModelConfig
from tba.models.builtin import tiny_config
from tba.models.shape import builtin_shape
from tba.run.plan import GB, make_plan

SMALL = ["model.tiny.hidden_size=16", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
         "model.tiny.intermediate_size=32", "model.tiny.vocab_size=20", "task.max_prompt_tokens=8",
         "search.max_new_tokens=4", "runtime=inline", "mode=sync"]
# embeddings 20·16 = 320 (the head is tied: counted once); per layer q, k, v, o 4·16·16 = 1024, MLP 3·16·32 = 1536,
# two norms 32: 2592; two layers 5184; final norm 16
PARAMS = 320 + 2 * 2592 + 16
ROOMY = lambda device: 64 * GB  # noqa: E731


def term(occupant, prefix: str) -> int:
    return next(t.bytes for t in occupant.terms if t.name.startswith(prefix))


def occupant(plan, name: str):
    return next(o for d in plan.devices for o in d.occupants if o.name == name)


def test_the_shape_counts_parameters_on_the_meta_device_tied_head_once():
    shape = builtin_shape(TinyModelConfig(16, 2, 2, 32, 20))
    assert shape.params == PARAMS
    assert (shape.layers, shape.hidden, shape.kv_heads, shape.head_dim, shape.vocab) == (2, 16, 2, 8, 20)
    assert shape.layer_params == 2592


def test_trainer_terms_by_hand_and_divided_over_two_ranks():
    one = occupant(make_plan(load_config(None, SMALL), ROOMY), "trainer")
    assert term(one, "parameters") == PARAMS * 4
    assert term(one, "gradients") == PARAMS * 4
    assert term(one, "AdamW moments") == 2 * PARAMS * 4
    assert term(one, "π_ref") == PARAMS * 4
    two = make_plan(load_config(None, [*SMALL, "trainer.world_size=2", "trainer.fsdp.devices=cpu",
                                       "trainer.prompts_per_step=8", "runtime=local"]), ROOMY)
    for rank in (0, 1):
        r = occupant(two, f"trainer rank {rank}")
        assert term(r, "parameters") == PARAMS * 4 // 2
        assert term(r, "gradients") == PARAMS * 4 // 2
        assert term(r, "AdamW moments") == PARAMS * 4
    assert [t.name for t in occupant(two, "trainer rank 1").terms if t.name.startswith("π_ref")] == []
    assert term(occupant(two, "rank 0's unsharded policy (evaluation, publication)"), "parameters") == PARAMS * 4


def test_bfloat16_halves_the_weights():
    plan = make_plan(load_config(None, [*SMALL, "model.dtype=bfloat16"]), ROOMY)
    assert term(occupant(plan, "trainer"), "parameters") == PARAMS * 2


@pytest.fixture
def small_dir(tmp_path):
    """A save_pretrained directory of the small shape (its config only: the plan reads no weights)."""
    tiny_config(TinyModelConfig(16, 2, 2, 32, 20), 20, bos=1, eos=2, pad=0).save_pretrained(tmp_path)
    return str(tmp_path)


def test_lora_trains_only_the_adapters(small_dir):
    cfg = [*SMALL, f"model.policy={small_dir}", "task.name=gsm8k"]
    full = occupant(make_plan(load_config(None, cfg), ROOMY), "trainer")
    lora = occupant(make_plan(load_config(None, [*cfg, "model.lora.enabled=true", "model.lora.r=4"]), ROOMY),
                    "trainer")
    # r·(in + out) per linear layer but the head: q, k, v, o 4·4·32, gate, up 2·4·48, down 4·48 → 1088 per layer
    adapters = 2 * 1088
    assert term(lora, "gradients") == adapters * 4 < term(full, "gradients")
    assert term(lora, "AdamW moments") == 2 * adapters * 4
    assert term(lora, "parameters") == term(full, "parameters")  # the base model is still held


def test_a_quantized_searcher_samples_from_a_smaller_copy():
    plan = make_plan(load_config(None, [*SMALL, "runtime=local", "mode=async", "search.quantize=int8"]), ROOMY)
    searcher = occupant(plan, "searcher 0 (policy)")
    # CPU int8: embeddings and norms (400) copied to float32, the linear weights at 1 byte (the tied head gets its
    # own: 5120 + 320), the MLP down projections (2·512) kept in float32
    assert term(searcher, "int8 copy") == 400 * 4 + (5440 - 1024) + 1024 * 4
    assert term(searcher, "int8 copy") < term(searcher, "policy weights") == PARAMS * 4


def test_a_capacity_too_small_is_refused_naming_device_need_and_what_to_change():
    plan = make_plan(load_config(None, SMALL), lambda device: 1024**2)
    assert not plan.fits
    message = plan.refusal()
    assert message.startswith("the run does not fit in memory") and "cpu needs about" in message
    assert "trainer.world_size" in message and "--ignore-plan" in message
    assert make_plan(load_config(None, SMALL), ROOMY).refusal() is None


def test_a_device_whose_capacity_is_unknown_is_not_checked():
    plan = make_plan(load_config(None, [*SMALL, "model.device=cuda:3"]), lambda device: None)
    assert plan.fits and plan.devices[0].fits is None
    assert any("capacity unknown" in n for n in plan.notes)


def test_searchers_go_where_search_device_puts_them():
    cfg = [*SMALL, "runtime=local", "mode=async", "search.num_searchers=3", "search.device=cpu,cuda:1"]
    plan = make_plan(load_config(None, cfg), lambda device: 64 * GB if device == "cpu" else None)
    where = {o.name: d.name for d in plan.devices for o in d.occupants}
    assert where == {"trainer": "cpu", "searcher 0 (policy)": "cpu", "searcher 1 (policy)": "cuda:1",
                     "searcher 2 (policy)": "cpu"}
