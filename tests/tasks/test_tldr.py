"""TL;DR task: loading and validating the cleanrl TL;DR format, the RM reward, and the gold-RM win rate.

The data are a fixture in the real dataset's format (a pre-formatted `query` ending in "TL;DR:" and a
`reference_response` " summary<|endoftext|>"); the reward models are tiny random GPT-NeoX classifiers.
"""

from __future__ import annotations

import json
import time

import pytest
from test_reward_model import save_rm  # the same tiny GPT-NeoX reward model (tests/tasks is on sys.path)

from tba.config import load_config
from tba.models.builtin import train_tokenizer
from tba.tasks.base import batch_rewards
from tba.tasks.tldr import TLDRTask, load_rows, strip_eos


def tldr_rows(n: int, offset: int = 0) -> list[dict]:
    return [{"query": f"SUBREDDIT: r/cats\n\nTITLE: sock thief {i}\n\nPOST: my cat stole {i} socks from the "
                      f"laundry and hid them under the bed\n\nTL;DR:",
             "reference_response": f" cat stole {i} socks<|endoftext|>", "subreddit": "cats"}
            for i in range(offset, offset + n)]


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tldr")
    write_jsonl(path / "train.jsonl", tldr_rows(12))
    write_jsonl(path / "validation.jsonl", tldr_rows(5, offset=100))
    return path


@pytest.fixture(scope="module")
def rms(tmp_path_factory):
    rows = tldr_rows(20)
    tokenizer = train_tokenizer([r["query"] + r["reference_response"] for r in rows], 200)
    return (save_rm(tmp_path_factory.mktemp("rm"), tokenizer, seed=0, max_positions=256),
            save_rm(tmp_path_factory.mktemp("gold"), tokenizer, seed=1, max_positions=256))


@pytest.fixture(scope="module")
def task(data_dir, rms):
    return TLDRTask(str(data_dir), reward_model=rms[0], gold_reward_model=rms[1], batch_size=4)


def test_loads_queries_and_references_without_the_eos_string(task):
    assert len(task.train) == 12 and len(task.test) == 5
    p = task.test[0]
    assert p.text.endswith("TL;DR:") and "sock thief 100" in p.text
    assert p.answer == " cat stole 100 socks"  # leading space kept, "<|endoftext|>" stripped
    assert task.demonstrations(task.train[:2], seed=0) == [" cat stole 0 socks", " cat stole 1 socks"]
    assert strip_eos(" a<|endoftext|><|endoftext|>") == " a"


def test_sizes_and_split(data_dir, rms, tmp_path):
    write_jsonl(tmp_path / "train.jsonl", tldr_rows(4))
    write_jsonl(tmp_path / "test.jsonl", tldr_rows(3, offset=50))
    small = TLDRTask(str(tmp_path), train_size=2, test_size=2, reward_model=rms[0], test_split="test")
    assert len(small.train) == 2 and [p.answer for p in small.test] == [" cat stole 50 socks", " cat stole 51 socks"]
    assert len(load_rows(str(data_dir), "validation", 100)) == 5


def test_hub_snapshot_layout_reads_every_parquet_shard(tmp_path):
    """The Hub dataset stores train as 5 shards data/train-0000k-of-00005-*.parquet: all of them are read."""
    import datasets

    (tmp_path / "data").mkdir()
    for k, rows in enumerate((tldr_rows(3), tldr_rows(2, offset=3))):
        datasets.Dataset.from_list(rows).to_parquet(tmp_path / f"data/train-0000{k}-of-00002-abc.parquet")
    rows = load_rows(str(tmp_path), "train")
    assert [r["reference_response"] for r in rows] == [f" cat stole {i} socks<|endoftext|>" for i in range(5)]
    assert set(rows[0]) == {"query", "reference_response"}  # other columns (token ids in the real data) dropped


@pytest.mark.parametrize("row, message", [
    ({"query": "TL;DR:"}, r"row 2 of .*train\.jsonl: missing field 'reference_response'"),
    ({"query": "  ", "reference_response": " x"}, r"row 2 of .*train\.jsonl: field 'query' must be a non-empty"),
    ({"query": "TL;DR:", "reference_response": "<|endoftext|>"}, r"row 2 of .*'reference_response' is only an EOS"),
])
def test_bad_rows_name_file_row_and_field(tmp_path, row, message):
    rows = tldr_rows(2)
    write_jsonl(tmp_path / "train.jsonl", rows[:2] + [row])
    with pytest.raises(ValueError, match=message):
        load_rows(str(tmp_path), "train")


def test_missing_column_and_missing_split(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": "TL;DR:", "reference_response": " x"}])
    with pytest.raises(ValueError, match=r"row 0 of .*train\.jsonl: missing field 'query'"):
        load_rows(str(tmp_path), "train")
    with pytest.raises(FileNotFoundError, match=r"no validation\.jsonl.*in directory"):
        load_rows(str(tmp_path), "validation")


def test_unreachable_hub_is_runtime_error(offline_hub):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"unreachable.*task\.options\.source=/path/to/dir"):
        load_rows("nonexistent-org/nonexistent-tldr", "train")
    assert time.monotonic() - start < 5


def test_reward_is_the_training_rm_and_unfinished_completions_get_minus_one(task):
    prompts = task.train[:3]
    completions = [" cat stole socks", " cat stole socks", " the cat"]
    values, error = batch_rewards(task, prompts, completions, [True, False, True])  # the searchers' path
    assert error is None and values[1] == -1.0
    expected = task.reward_model.score_texts([p.text for p in prompts], completions)
    assert values[0] == pytest.approx(expected[0]) and values[2] == pytest.approx(expected[2])
    assert task.reward(prompts[0], completions[0]) == pytest.approx(expected[0])  # single: taken as finished


def test_gold_rm_is_loaded_lazily_and_only_when_configured(data_dir, rms):
    task = TLDRTask(str(data_dir), reward_model=rms[0], gold_reward_model=rms[1])
    assert task._gold is None  # searchers build the task too and must not pay for the gold RM
    no_gold = TLDRTask(str(data_dir), reward_model=rms[0])
    assert no_gold.eval_metrics(no_gold.test, [" x"] * 5, [True] * 5) == {}


def test_win_rate_is_strictly_better_than_reference_under_the_gold_rm(task):
    prompts = task.test
    # the reference summary itself ties with the reference: never a win (strict >)
    same = task.eval_metrics(prompts, [p.answer for p in prompts], [True] * len(prompts))
    assert same["win_rate"] == 0.0 and same["gold_score"] == pytest.approx(same["gold_score_reference"])
    completions = [" cat", " my cat stole socks", " laundry bed", " socks socks socks", prompts[4].answer]
    finished = [True, True, False, True, True]
    metrics = task.eval_metrics(prompts, completions, finished)
    gold = task.gold()
    queries = [p.text for p in prompts]
    policy = gold.score_texts(queries, completions, append_eos=finished)  # unfinished: scored as is, no penalty
    reference = gold.score_texts(queries, [p.answer for p in prompts])
    wins = sum(policy[i] > reference[i] for i in range(4))  # completion 4 is the reference: a tie, a loss
    assert metrics["win_rate"] == pytest.approx(wins / 5) and wins > 0  # this seed gives wins: both branches run
    assert metrics["gold_score"] == pytest.approx(sum(policy) / 5)
    assert metrics["gold_score_reference"] == pytest.approx(sum(reference) / 5)


def test_built_from_config_through_the_tldr_factory(data_dir, rms):
    from tba.run.build import build_task

    cfg = load_config(None, ["task.name=tldr", f"model.policy={rms[0]}", "task.train_size=3", "task.test_size=null",
                             f"task.options={{reward_model: {rms[0]}, batch_size: 2}}",
                             f"task.options.source={data_dir}"])
    task = build_task(cfg)
    assert isinstance(task.task, TLDRTask) and len(task.train) == 3 and len(task.test) == 5
    assert task.task.reward_model.batch_size == 2
