"""The paper's recipes with the model swapped for a tiny from-config one: their code paths run offline."""

import json
from pathlib import Path

import pytest

from tba.cli import main
from tba.config import TinyModelConfig, load_config
from tba.models import build_tiny_model, save_checkpoint, train_tokenizer

RECIPES = Path(__file__).parents[1] / "src" / "tba" / "recipes"
SHARED = Path(__file__).parents[2] / "shared/data/gsm8k"


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
    assert cfg.model.policy == "realtreetune/rho-1b-sft-GSM8K" and cfg.model.dtype == "bfloat16"
    assert (s.temperature, s.samples_per_prompt, s.num_searchers, s.max_new_tokens) == (0.7, 24, 3, 512)
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
                 f"task.source={source}", "task.train_size=200", "task.test_size=20", "trainer.steps=2",
                 "search.num_searchers=1", "search.max_new_tokens=16", "eval.max_new_tokens=16",
                 "buffer.prefill_samples=24", "search.samples_per_prompt=8", "trainer.samples_per_prompt=4",
                 "trainer.prompts_per_step=2", "trainer.lr_schedule=constant", "trainer.warmup_steps=0",
                 "trainer.stable_steps=null", "trainer.decay_steps=0", "logging.progress=false"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 2 and summary["test_problems"] == 20
    assert [e[0] for e in summary["evals"]] == [0, 2]  # greedy pass@1 at the start and at the end
