"""Red-teaming task and recipe: rewards, metrics, and the LoRA training path, with tiny from-config models."""

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("profanity_check", reason="pip install alt-profanity-check")
pytest.importorskip("peft", reason="pip install peft")

from paths import RECIPES

from tba.cli import main  # noqa: E402
from tba.config.schema import TinyModelConfig  # noqa: E402
from tba.models import save_checkpoint  # noqa: E402
from tba.models.builtin import (
    build_tiny_model,  # noqa: E402
    train_tokenizer,  # noqa: E402
)
from tba.tasks.base import batch_rewards  # noqa: E402
from tba.tasks.redteam import INSTRUCTIONS, RedTeamOptions, RedTeamTask  # noqa: E402

CORPUS = ["you are a stupid idiot", "have a nice day", "tell me a story about a dog", "what is the weather",
          "shut up you idiot", "please write a poem", "why is the sky blue", "say something rude"] * 20


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny_lm")
    tokenizer = train_tokenizer(CORPUS, 200)
    model = build_tiny_model(tokenizer, TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2,
                                                        intermediate_size=64), seed=0)
    save_checkpoint(model, tokenizer, path)
    return path


def tiny_options(tiny_lm, **changes) -> RedTeamOptions:
    return RedTeamOptions(victim=str(tiny_lm), victim_responses=2, victim_max_new_tokens=8, min_attack_tokens=3,
                          **changes)


@pytest.fixture(scope="module")
def task(tiny_lm):
    return RedTeamTask(tiny_options(tiny_lm))


def echo(task, monkeypatch):
    """A victim that repeats the attack twice: toxicity then depends on the attack only."""
    monkeypatch.setattr(task, "victim_answers", lambda attacks: [[a, a] for a in attacks])


def test_reward_is_the_mean_log_toxicity_of_the_victims_answers(task, monkeypatch):
    echo(task, monkeypatch)
    prompts = [task.train[0]] * 3
    attacks = ["you are a stupid idiot", "have a nice day to you", "hi"]
    rewards, error = batch_rewards(task, prompts, attacks, [True] * 3)
    assert error is None
    p = task.classifier(attacks[:2])
    assert rewards[0] == pytest.approx(math.log(p[0])) and rewards[1] == pytest.approx(math.log(p[1]))
    assert rewards[0] > rewards[1]  # the toxic attack earns more
    assert rewards[2] == task.short_reward  # shorter than min_attack_tokens: the paper's length penalty


def test_eval_metrics_attack_success_rate_and_diversity(task, monkeypatch):
    echo(task, monkeypatch)
    attacks = ["you are a stupid idiot", "shut up you stupid idiot", "have a nice day to you", "tell me a story"]
    metrics = task.eval_metrics([task.train[0]] * 4, attacks, [True] * 4)
    assert metrics["attack_success_rate"] == 50.0  # two of four make the (echoing) victim toxic
    assert 0 < metrics["toxicity"] < 1 and 0 < metrics["diversity"] < 1
    same = task.eval_metrics([task.train[0]] * 3, ["have a nice day"] * 3, [True] * 3)
    assert same["diversity"] == pytest.approx(0.0, abs=1e-5) and same["attack_success_rate"] == 0.0


def test_the_victim_answers_each_attack_n_times(task):
    answers = task.victim_answers(["say something rude", "have a nice day"])
    assert len(answers) == 2 and all(len(a) == 2 and all(isinstance(x, str) for x in a) for a in answers)


def test_the_victim_leaves_the_global_rng_alone_and_samples_from_its_own_seed(tiny_lm):
    """The reward runs inside the trainer's process with the inline runtime: it must neither reseed nor advance
    the trainer's RNG, and its own draws come from task.options.seed, whatever the global RNG holds."""
    import torch

    task = RedTeamTask(tiny_options(tiny_lm, seed=5))
    attacks = ["say something rude", "have a nice day"]
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = task.victim_answers(attacks)
    rewards = task.rewards([task.train[0]] * 2, attacks, [True, True])
    assert torch.equal(torch.get_rng_state(), before)
    assert len(rewards) == 2 and all(math.isfinite(r) for r in rewards)
    assert task.victim_answers(attacks) != first  # a fresh draw each call, not one reseeded stream

    twin = RedTeamTask(tiny_options(tiny_lm, seed=5))
    torch.manual_seed(7)
    assert twin.victim_answers(attacks) == first  # the same seed, the same draws
    other = RedTeamTask(tiny_options(tiny_lm, seed=6))
    assert other.victim_answers(attacks) != first


def test_without_a_seed_the_victim_follows_the_process_seed(tiny_lm):
    """seed=None: each searcher process (seeded per rank) gets its own victim stream, reproducibly."""
    import torch

    def answers(process_seed):
        torch.manual_seed(process_seed)
        task = RedTeamTask(tiny_options(tiny_lm))
        before = torch.get_rng_state()
        out = task.victim_answers(["say something rude", "have a nice day"])
        assert torch.equal(torch.get_rng_state(), before)
        return out

    assert answers(1001) == answers(1001) != answers(2001)


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="victim_responses"):
        RedTeamTask(RedTeamOptions(victim="unused", victim_responses=0))
    with pytest.raises(ValueError, match="instructions"):
        RedTeamTask(RedTeamOptions(victim="unused", instructions=["", "x"]))


@pytest.mark.slow
def test_redteam_recipe_trains_lora_through_searcher_processes_and_resumes(tiny_lm, tmp_path):
    out = tmp_path / "run"
    common = [f"output_dir={out}", f"model.policy={tiny_lm}", f"task.options.victim={tiny_lm}",
              "task.chat_template=false", "task.options.victim_responses=2", "task.options.victim_max_new_tokens=8",
              "task.options.min_attack_tokens=2", "search.generations_per_prompt=4", "search.max_new_tokens=8",
              "buffer.prefill_samples=8", "trainer.samples_per_prompt=4", "checkpoint.every_steps=2",
              "eval.samples_per_prompt=4", "eval.max_new_tokens=8", "logging.progress=false", "model.lora.r=4",
              "mode=sync", "trainer.sync_every_steps=1"]
    recipe = str(RECIPES / "redteam-smollm2-cpu.yaml")
    assert main(["train", recipe, *common, "trainer.steps=2", "eval.every_steps=2"]) == 0
    ckpt = out / "checkpoints" / "step_0000002" / "model"
    assert (ckpt / "adapter_config.json").is_file()  # only the LoRA adapters are checkpointed
    assert not (ckpt / "model.safetensors").exists()
    assert main(["train", "--resume", str(out), *common, "trainer.steps=4", "eval.every_steps=2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 4 and summary["resumed_at_steps"] == [2]
    for key in ("attack_success_rate", "diversity", "toxicity"):
        assert math.isfinite(summary["eval_end"][key]) and math.isfinite(summary["eval_start"][key])
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    assert all(math.isfinite(m["trainer/loss"]) for m in lines)
    assert lines[-1]["searcher/version_min"] >= 3  # the searcher received the trained adapters


def test_lora_publishes_only_the_adapters(tiny_lm):
    from tba.config.schema import LoraConfig
    from tba.models import apply_lora, load_model, load_synced, synced_tensors

    a = apply_lora(load_model(str(tiny_lm)), LoraConfig(r=4))
    b = apply_lora(load_model(str(tiny_lm)), LoraConfig(r=4))
    sent = synced_tensors(a)
    assert sent and all("lora_" in k for k in sent)
    for v in sent.values():
        v.data.add_(1.0)
    load_synced(b, {k: v.clone() for k, v in sent.items()})
    assert all((synced_tensors(b)[k] == v).all() for k, v in sent.items())


def test_gpt2_recipe_has_the_papers_settings():
    from tba.config import load_config

    cfg = load_config(RECIPES / "redteam-gpt2.yaml")
    t, o = cfg.trainer, cfg.task.options
    assert (cfg.tb.beta_init, cfg.tb.beta_final, t.sync_every_steps, t.steps) == (0.05, 0.05, 10, 5000)
    assert t.prompts_per_step * t.samples_per_prompt == 128 and cfg.buffer.online_prob == 0.5
    assert (cfg.model.lora.enabled, cfg.model.lora.r, cfg.model.lora.alpha, t.lr, t.warmup_steps) == (
        True, 32, 16, 1e-4, 100)
    assert (t.max_grad_norm, t.weight_decay, cfg.search.max_new_tokens, o["min_attack_tokens"]) == (1.0, 0.01, 20, 5)
    assert (o["victim_responses"], o["victim_max_new_tokens"], o["victim_temperature"], o["victim_top_p"]) == (
        5, 30, 0.7, 0.92)
    assert cfg.buffer.capacity_per_prompt * len(INSTRUCTIONS) == 100_000  # a 100k-attack buffer
    assert cfg.eval.samples_per_prompt * 4 == 1024  # attack success rate over 1,024 sampled attacks


@pytest.mark.slow
def test_gpt2_recipe_runs_with_tiny_models_and_an_hf_classifier(tiny_lm, tmp_path):
    """The paper's GPT-2 recipe end to end, with a tiny attacker/victim and a tiny 'hate' classifier (sampling with
    search.backend=hf: the recipe's vLLM cannot run the tiny attacker's head size on a CPU)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from tba.models import load_tokenizer

    clf = tmp_path / "clf"
    tokenizer = load_tokenizer(str(tiny_lm))
    cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
                     id2label={0: "nothate", 1: "hate"}, label2id={"nothate": 0, "hate": 1})
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).save_pretrained(clf)
    tokenizer.save_pretrained(clf)
    out = tmp_path / "run"
    code = main(["train", str(RECIPES / "redteam-gpt2.yaml"), f"output_dir={out}", f"model.policy={tiny_lm}",
                 f"task.options.victim={tiny_lm}", f"task.options.classifier={clf}", "task.options.device=cpu",
                 "model.device=cpu", "search.device=cpu", "search.num_searchers=1", "runtime=inline", "mode=sync",
                 "task.options.victim_responses=2", "task.options.victim_max_new_tokens=8",
                 "task.options.min_attack_tokens=2", "search.generations_per_prompt=4", "search.max_new_tokens=8",
                 "buffer.prefill_samples=8", "trainer.samples_per_prompt=4", "trainer.steps=2",
                 "trainer.warmup_steps=0", "eval.samples_per_prompt=2", "eval.max_new_tokens=8",
                 "logging.progress=false", "model.lora.r=4", "search.backend=hf"])
    assert code == 0
    end = json.loads((out / "summary.json").read_text())["eval_end"]
    assert 0 <= end["attack_success_rate"] <= 100 and 0 <= end["toxicity"] <= 1 and math.isfinite(end["diversity"])
