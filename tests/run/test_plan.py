"""The memory plan (tba.run.plan) by hand on a small shape: one process's parameters, gradients and AdamW's moments;
N identical ranks holding a shard of each, π_ref only for an objective that owns one, and at their peak their largest
phase (update, evaluation, publication); the controller's host copy and the transport's buffers where they live;
each GPU process's CUDA context; a vLLM engine given the share of its GPU the others leave; LoRA, quantized copies,
refusals and unknown capacities."""

import pytest

from tba.config import load_config
from tba.config.schema import TinyModelConfig
from tba.models.builtin import tiny_config
from tba.models.shape import builtin_shape
from tba.run.plan import GB, make_plan, target_machine, vllm_memory_utilization, vllm_shares
from tba.run.plan.ledger import GPU_HEADROOM
from tba.run.plan.terms import CUDA_CONTEXT_BYTES

SMALL = ["model.tiny.hidden_size=16", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
         "model.tiny.intermediate_size=32", "model.tiny.vocab_size=20", "task.max_prompt_tokens=8",
         "search.max_new_tokens=4", "runtime=inline", "mode=sync"]
# embeddings 20·16 = 320 (the head is tied: counted once); per layer q, k, v, o 4·16·16 = 1024, MLP 3·16·32 = 1536,
# two norms 32: 2592; two layers 5184; final norm 16
PARAMS = 320 + 2 * 2592 + 16
ROOT = PARAMS - 2 * 2592
ROOMY = lambda device: 64 * GB  # noqa: E731
SHARDED = [*SMALL, "trainer.world_size=2", "trainer.fsdp.devices=cpu", "trainer.prompts_per_step=8", "runtime=local",
           "mode=async"]


def term(occupant, prefix: str):
    return next(t for t in occupant.terms if t.name.startswith(prefix))


def size(occupant, prefix: str) -> int:
    return term(occupant, prefix).bytes


def occupant(plan, name: str):
    return next(o for d in plan.devices for o in d.occupants if o.name == name)


def device_of(plan, name: str) -> str:
    return next(d.name for d in plan.devices for o in d.occupants if o.name == name)


def test_the_shape_counts_parameters_on_the_meta_device_tied_head_once():
    shape = builtin_shape(TinyModelConfig(16, 2, 2, 32, 20))
    assert shape.params == PARAMS
    assert (shape.layers, shape.hidden, shape.kv_heads, shape.head_dim, shape.vocab) == (2, 16, 2, 8, 20)
    assert shape.layer_params == 2592


def test_one_process_holds_weights_moments_and_pi_ref_and_its_gradients_during_updates():
    one = occupant(make_plan(load_config(None, SMALL), ROOMY), "trainer")
    assert size(one, "parameters") == size(one, "π_ref") == PARAMS * 4
    assert size(one, "AdamW moments") == 2 * PARAMS * 4
    assert (size(one, "gradients"), term(one, "gradients").phase) == (PARAMS * 4, "update")
    always = sum(t.bytes for t in one.terms if t.phase is None)
    phases = {p: sum(t.bytes for t in one.terms if t.phase == p) for p in ("update", "evaluation")}
    assert one.bytes == always + max(phases.values())


def test_sharded_ranks_are_identical_each_holding_a_shard_and_no_whole_copy_outside_an_evaluation():
    plan = make_plan(load_config(None, SHARDED), ROOMY)
    ranks = [occupant(plan, f"trainer rank {r}") for r in (0, 1)]
    assert [(t.name, t.bytes, t.phase) for t in ranks[0].terms] == [(t.name, t.bytes, t.phase) for t in ranks[1].terms]
    r = ranks[0]
    assert size(r, "parameters") == PARAMS * 4 // 2
    assert size(r, "AdamW moments") == PARAMS * 4
    assert (size(r, "gradients"), term(r, "gradients").phase) == (PARAMS * 4 // 2, "update")
    assert not [t for t in r.terms if t.name.startswith("π_ref")]  # TB reads the searchers' stored log-probs
    assert (size(r, "evaluation's whole policy copy"), term(r, "evaluation's whole policy copy").phase) == (
        PARAMS * 4, "evaluation")
    # gathered in the compute dtype (model.dtype here): the root unit and two decoder layers at a time
    assert size(r, "gathered parameters") == (ROOT + 2 * 2592) * 4
    assert term(r, "publication bucket").phase == "publication"
    always = sum(t.bytes for t in r.terms if t.phase is None)
    peak = max(sum(t.bytes for t in r.terms if t.phase == p) for p in ("update", "evaluation", "publication"))
    assert r.bytes == always + peak
    controller = occupant(plan, "controller (buffer, loop, searchers' host)")
    assert device_of(plan, controller.name) == "cpu" and size(controller, "host copy") == PARAMS * 4


def test_ranks_compute_in_param_dtype_and_an_objective_that_owns_a_reference_shards_it():
    plan = make_plan(load_config(None, [*SHARDED, "trainer.fsdp.param_dtype=bfloat16", "objective=tba_prime"]),
                     ROOMY)
    r = occupant(plan, "trainer rank 1")
    assert size(r, "parameters") == PARAMS * 4 // 2  # the masters stay in model.dtype
    assert size(r, "gathered parameters") == (ROOT + 2 * 2592) * 2
    assert size(r, "evaluation's whole policy copy") == PARAMS * 2
    assert size(r, "π_ref (bfloat16, 1/2 shard") == PARAMS * 2 // 2


def test_bfloat16_halves_the_weights():
    plan = make_plan(load_config(None, [*SMALL, "model.dtype=bfloat16"]), ROOMY)
    assert size(occupant(plan, "trainer"), "parameters") == PARAMS * 2


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
    assert size(lora, "gradients") == adapters * 4 < size(full, "gradients")
    assert size(lora, "AdamW moments") == 2 * adapters * 4
    assert size(lora, "parameters") == size(full, "parameters")  # the base model is still held


def test_a_quantized_searcher_samples_from_a_smaller_copy():
    plan = make_plan(load_config(None, [*SMALL, "runtime=local", "mode=async", "search.quantize=int8"]), ROOMY)
    searcher = occupant(plan, "searcher 0 (policy)")
    # CPU int8: embeddings and norms (400) copied to float32, the linear weights at 1 byte (the tied head gets its
    # own: 5120 + 320), the MLP down projections (2·512) kept in float32
    assert size(searcher, "int8 copy") == 400 * 4 + (5440 - 1024) + 1024 * 4
    assert size(searcher, "int8 copy") < size(searcher, "policy weights") == PARAMS * 4
    assert size(searcher, "staging copy of the published weights") == PARAMS * 4


def test_a_capacity_too_small_is_refused_naming_device_need_and_what_to_change():
    plan = make_plan(load_config(None, SMALL), lambda device: 1024**2)
    assert not plan.fits
    message = plan.refusal()
    assert message.startswith("the run does not fit in memory") and "cpu needs about" in message
    assert "trainer.world_size" in message and "--ignore-plan" in message
    assert make_plan(load_config(None, SMALL), ROOMY).refusal() is None


def test_a_device_whose_capacity_is_unknown_is_not_checked():
    plan = make_plan(load_config(None, [*SMALL, "model.device=cuda:3"]), lambda device: None)
    assert plan.fits and plan.devices[0].fits is None and plan.unchecked() == ["cuda:3"]
    assert any("capacity unknown" in n for n in plan.notes)


def test_searchers_go_where_search_device_puts_them():
    cfg = [*SMALL, "runtime=local", "mode=async", "search.num_searchers=3", "search.device=cpu,cuda:1"]
    plan = make_plan(load_config(None, cfg), lambda device: 64 * GB if device == "cpu" else None)
    where = {o.name: d.name for d in plan.devices for o in d.occupants}
    assert where == {"trainer": "cpu", "searcher 0 (policy)": "cpu", "searcher 1 (policy)": "cuda:1",
                     "searcher 2 (policy)": "cpu", "weight transport (shared)": "cpu"}


GPU = [*SMALL, "runtime=local", "mode=async", "model.device=cuda:0"]


def test_the_shared_transport_is_cuda_ipc_on_the_trainers_gpu_only_when_every_searcher_is_there():
    machine = target_machine("2x8GB")
    together = make_plan(load_config(None, [*GPU, "search.device=cuda:0"]), machine)
    apart = make_plan(load_config(None, [*GPU, "search.device=cuda:1"]), machine)
    assert device_of(together, "weight transport (shared)") == "cuda:0"
    assert "CUDA IPC" in occupant(together, "weight transport (shared)").terms[0].name
    assert device_of(apart, "weight transport (shared)") == "cpu"
    assert "host shared memory" in occupant(apart, "weight transport (shared)").terms[0].name
    for name in ("trainer", "searcher 0 (policy)"):  # every process on a GPU has its CUDA context there
        assert size(occupant(apart, name), "CUDA context") == CUDA_CONTEXT_BYTES


def test_sharded_ranks_publish_from_the_controllers_host_copy():
    cfg = [*GPU, "trainer.world_size=2", "trainer.fsdp.devices=cuda:0,cuda:1", "trainer.prompts_per_step=8",
           "search.device=cuda:0"]
    plan = make_plan(load_config(None, cfg), target_machine("2x8GB"))
    assert device_of(plan, "weight transport (shared)") == "cpu"
    assert device_of(plan, "controller (buffer, loop, searchers' host)") == "cpu"


VLLM = [*GPU, "search.backend=vllm", "search.device=cuda:1"]


def vllm_config(*more: str, utilization: float | None = None):
    cfg = load_config(None, [*VLLM, *more], check_installed=False)
    cfg.search.vllm.gpu_memory_utilization = utilization  # null: the default once search.vllm's schema has it
    return cfg


def test_a_vllm_engine_gets_the_share_of_its_gpu_the_other_occupants_leave():
    machine = target_machine("2x8GB")
    plan = make_plan(vllm_config(), machine)
    gpu = next(d for d in plan.devices if d.name == "cuda:1")
    searcher = occupant(plan, "searcher 0 (policy)")
    engine = term(searcher, "vLLM engine")
    others = gpu.need - engine.bytes
    share = plan.vllm_shares[0]
    assert share == int(100 * (8e9 * (1 - GPU_HEADROOM) - others) / 8e9) / 100
    assert engine.bytes == int(share * 8e9) and gpu.fits
    assert vllm_memory_utilization(vllm_config(), 0, machine) == share
    two = make_plan(vllm_config("search.num_searchers=2", "search.device=cuda:1,cuda:1"), machine)
    gpu = next(d for d in two.devices if d.name == "cuda:1")
    others = gpu.need - sum(term(o, "vLLM engine").bytes for o in gpu.occupants)
    assert two.vllm_shares[0] == two.vllm_shares[1] == int(100 * (8e9 * (1 - GPU_HEADROOM) - others) / 2 / 8e9) / 100


def test_a_vllm_share_smaller_than_its_weights_and_batch_is_refused_and_a_set_share_is_kept():
    small = make_plan(vllm_config(), target_machine("2x600MB"))  # its CUDA context alone nearly fills the GPU
    assert not small.fits and "less than its weights and one batch's KV cache" in small.refusal()
    fixed = make_plan(vllm_config(utilization=0.5), target_machine("2x8GB"))
    assert fixed.vllm_shares == {}
    assert size(occupant(fixed, "searcher 0 (policy)"), "vLLM engine") == int(0.5 * 8e9)


def test_a_share_of_an_unknown_gpu_is_left_to_the_engine(caplog):
    """A GPU this process cannot read (a Ray actor's on another node): no share, the engine sizes itself, said once."""
    with caplog.at_level("INFO", logger="tba.run.plan"):
        assert vllm_shares(vllm_config(), lambda device: None) == {}
    assert "each vLLM engine sizes itself" in caplog.text


def test_a_hub_model_is_planned_offline_from_its_published_shape(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    plan = make_plan(load_config(None, [*SMALL, "model.policy=Qwen/Qwen2.5-0.5B-Instruct", "task.name=gsm8k"]),
                     ROOMY)
    assert size(occupant(plan, "trainer"), "parameters") == 494032768 * 4
