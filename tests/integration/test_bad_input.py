"""Bad input never corrupts a run: rewards that raise or are not finite are dropped and counted, prompts over
the length limit are skipped or truncated and counted. (Non-finite losses: tests/test_trainer.py; malformed
dataset rows: tests/tasks/test_gsm8k.py; a dataset that cannot be read, printed as one line: tests/test_cli.py,
tests/tasks/test_data.py; bad config keys: tests/test_config.py; unwritable output dir and a
full disk: tests/test_resume.py, tests/test_checkpoint.py, tests/test_store.py.)"""

import json

import pytest

from tba.cli import main
from tba.config.schema import SearchConfig
from tba.rollout.samplers.hf import HFSampler
from tba.rollout.searcher import Searcher
from tba.tasks.arith import ArithTask
from tba.tasks.prepare import fit_prompts


class FlakyReward(ArithTask):
    """Every third reward call raises, every third returns NaN, the rest are real."""

    calls = 0

    def reward(self, prompt, completion):
        FlakyReward.calls += 1
        if FlakyReward.calls % 3 == 0:
            raise ZeroDivisionError("user reward bug")
        if FlakyReward.calls % 3 == 1:
            return float("nan")
        return super().reward(prompt, completion)


def test_searcher_drops_and_counts_samples_whose_reward_raises_or_is_nan(tiny_model, tiny_tokenizer):
    task = FlakyReward(digits=2, train_size=20, test_size=2)
    searcher = Searcher(HFSampler(tiny_model, tiny_tokenizer), tiny_model, tiny_tokenizer, task,
                        SearchConfig(generations_per_prompt=3, prompts_per_batch=4, max_new_tokens=4), seed=0)
    groups = searcher.step()
    kept = sum(len(g.samples) for g in groups)
    assert kept == 4 and searcher.stats.rewards_dropped == 8  # 12 completions: 4 raised, 4 NaN
    assert all(s.reward in (0.0, 1.0) for g in groups for s in g.samples)
    error = searcher.stats.last_reward_error
    assert "ZeroDivisionError: user reward bug" in error or "nan" in error
    assert searcher.state_dict()["rewards_dropped"] == 8


@pytest.mark.parametrize("mode", ["skip", "truncate"])
def test_prompts_over_the_limit_are_skipped_or_truncated_and_counted(tiny_tokenizer, mode):
    task = ArithTask(digits=2, train_size=50, test_size=10,
                     prompt_template="Please add {a} and {b}, then answer: {a}+{b}=")
    long = task.train[3].__class__(task.train[3].id, "word " * 40 + task.train[3].text, task.train[3].answer)
    normal = [p for i, p in enumerate(task.train + task.test) if i != 3]
    task.train[3] = long
    n_train, limit = len(task.train), max(len(tiny_tokenizer(p.text)["input_ids"]) for p in normal) + 2
    counts = fit_prompts(task, tiny_tokenizer, limit, mode)
    assert counts["prompts_too_long"] == 1
    if mode == "skip":
        assert len(task.train) == n_train - 1 and counts["prompts_truncated"] == 0
    else:
        assert len(task.train) == n_train and counts["prompts_truncated"] == 1
        fitted = next(p for p in task.train if p.id == 3)
        assert len(tiny_tokenizer(fitted.text)["input_ids"]) <= limit and fitted.text.endswith("=")
    assert all(len(tiny_tokenizer(p.text)["input_ids"]) <= limit for p in task.train + task.test)


@pytest.mark.slow
def test_a_run_with_a_flaky_reward_and_long_prompts_completes_and_reports_both(tmp_path, monkeypatch, capsys):
    import tba.tasks.arith

    monkeypatch.setattr(tba.tasks.arith, "ArithTask", FlakyReward)
    out = tmp_path / "run"
    code = main(["train", f"output_dir={out}", f"sft.cache_dir={tmp_path / 'cache'}", "sft.steps=20",
                 "task.options.digits=1", "task.train_size=200", "task.test_size=8", "trainer.steps=4",
                 "buffer.prefill_samples=12", "search.prompts_per_batch=4", "search.generations_per_prompt=6",
                 "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "logging.progress=false",
                 "runtime=inline", "mode=sync", "task.max_prompt_tokens=5", "eval.max_new_tokens=8"])
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples_dropped_bad_reward"] > 0 and summary["trainer_steps"] == 4
    assert summary["prompts_too_long"] > 0 and summary["skipped_steps"] == 0
    assert "samples dropped: reward raised or was not finite" in err and "task.long_prompts" in err
