"""GSM8K task: the paper's answer extraction, the reward on every real gold answer, and loading."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from paths import FIXTURES
from paths import SHARED as SHARED_FOLDER

from tba.tasks.base import Prompt, accuracy
from tba.tasks.gsm8k import PROMPT_TEMPLATE, GSM8KTask, extract_answer, gsm8k_reward, load_rows

FIXTURE = FIXTURES / "gsm8k"  # 20 train + 10 test rows of the real data, in the repo
SHARED = SHARED_FOLDER / "data" / "gsm8k"  # the full data, where a machine has it


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 1,234.", 1234.0),
        ("#### 1,000,000", 1e6),
        ("costs 2.25 dollars", 2.25),
        ("so 3.", 3.0),
        ("about .5 of it", 0.5),
        ("1e5 atoms", 1e5),
        ("2.5E-3", 0.0025),
        ("it fell to -2", -2.0),
        ("+7 points", 7.0),
        ("5 - 3 = 2 apples, then 10 pears", 10.0),  # the last number wins
        ("#### 18", 18.0),
        ("no digits here.", None),
        ("", None),
        ("e. E", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_reward_hand_cases():
    assert gsm8k_reward("So she makes $18.00 a day.", "... #### 18") == 1.0
    assert gsm8k_reward("1,234", "#### 1234") == 1.0
    assert gsm8k_reward("17", "#### 18") == 0.0
    assert gsm8k_reward("I don't know", "#### 18") == 0.0


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check_gold_answers(rows: list[dict]) -> None:
    for i, row in enumerate(rows):
        gold = float(row["answer"].split("####")[-1].strip().replace(",", ""))
        assert extract_answer(row["answer"]) == gold, i
        assert gsm8k_reward(row["answer"], row["answer"]) == 1.0, i


@pytest.mark.parametrize("split, n", [("train", 20), ("test", 10)])
def test_every_fixture_gold_answer(split, n):
    rows = _rows(FIXTURE / f"{split}.jsonl")
    assert len(rows) == n
    _check_gold_answers(rows)


def test_every_shared_gold_answer():
    """All 1,319 real test answers: needs the full data set, so skipped where it is absent."""
    path = SHARED / "test.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not present (the fixture's answers are checked by test_every_fixture_gold_answer)")
    rows = _rows(path)
    assert len(rows) > 1000
    _check_gold_answers(rows)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_task_from_local_dir(tmp_path):
    train = [
        {"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(4)
    ]
    test = [{"question": "What is 2 x 500?", "answer": "2 x 500 = 1000\n#### 1,000"}]
    _write_jsonl(tmp_path / "train.jsonl", train)
    _write_jsonl(tmp_path / "test.jsonl", test)

    task = GSM8KTask(source=str(tmp_path), train_size=3)
    assert task.name == "gsm8k"
    assert [p.id for p in task.train] == [0, 1, 2] and len(task.test) == 1
    assert task.train[2] == Prompt(
        id=2, text=PROMPT_TEMPLATE.format(question="What is 2 + 1?"), answer=train[2]["answer"]
    )
    assert task.test[0].text == "[MATH TASK] Problem:\nWhat is 2 x 500?\n\nSolution:\n"
    assert task.reward(task.test[0], "2 times 500 is 1,000.") == 1.0
    assert task.reward(task.test[0], "It is 100.") == 0.0
    demos = task.demonstrations(task.train, seed=0)
    assert demos == [r["answer"] for r in train[:3]]
    assert accuracy(task, task.train, demos) == 1.0

    # A single file serves any split.
    assert load_rows(str(tmp_path / "test.jsonl"), "train") == test


def test_missing_answer_names_row_and_field(tmp_path):
    rows = [
        {"question": "q0", "answer": "#### 1"},
        {"question": "q1", "answer": "#### 2"},
        {"question": "q2"},
    ]
    _write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(ValueError, match=r"row 2 of .*train\.jsonl: missing field 'answer'"):
        load_rows(str(tmp_path), "train")


def test_gold_without_number_and_empty_question(tmp_path):
    # Separate files: `datasets` caches by path and mtime, so rewriting one file could serve stale rows.
    no_number, blank = tmp_path / "no_number.jsonl", tmp_path / "blank.jsonl"
    _write_jsonl(no_number, [{"question": "q", "answer": "#### 3"}, {"question": "q", "answer": "#### none"}])
    with pytest.raises(ValueError, match="row 1 .*no number"):
        load_rows(str(no_number), "test")
    _write_jsonl(blank, [{"question": " ", "answer": "#### 3"}])
    with pytest.raises(ValueError, match="row 0 .*field 'question'"):
        load_rows(str(blank), "test")


@pytest.mark.parametrize("name, text, line, what", [
    ("train.jsonl", '{"question": "q", "answer": "#### 1"}\n\n{"question": "q2", "answer": "#### 2"}\nnull,\n',
     4, r"is not valid JSON \(Extra data"),
    ("train.jsonl", '{"question": "q", "answer": "#### 1"}\n{"question": "q2", "answer": "#### 2"\n', 2,
     "is not valid JSON"),
    ("train.jsonl", '{"question": "q", "answer": "#### 1"}\n[1, 2]\n', 2, "is a JSON array, not an object"),
    ("train.jsonl", b'{"question": "q", "answer": "#### 1"}\n{"question": "\xff"}\n', 2, "is not UTF-8 text"),
    ("train.json", '[{"question": "q", "answer": "#### 1"},\n {"question": "q2", "answer": "#### 2"\n]\n', 3,
     "is not valid JSON"),
])
def test_a_bad_json_line_is_named_with_file_and_line(tmp_path, name, text, line, what):
    """`datasets` alone says "Unexpected character found when decoding 'null'", naming no file or line."""
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match=rf"^gsm8k: {re.escape(str(path))} line {line} {what}"):
        load_rows(str(path), "train")
    with pytest.raises(ValueError, match=rf"line {line} {what}"):  # found in a directory too
        GSM8KTask(source=str(tmp_path))


def test_a_json_array_file_and_blank_lines_still_load(tmp_path):
    rows = [{"question": "q", "answer": "#### 1"}, {"question": "q2", "answer": "#### 2"}]
    (tmp_path / "a.json").write_text(json.dumps(rows, indent=2))
    assert load_rows(str(tmp_path / "a.json"), "test") == rows
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert load_rows(str(tmp_path / "b.jsonl"), "test") == rows


def test_missing_local_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="test.jsonl"):
        load_rows(str(tmp_path), "test")
    with pytest.raises(FileNotFoundError):
        load_rows(str(tmp_path / "nope.jsonl"), "test")


def test_real_data_loads():
    task = GSM8KTask(source=str(FIXTURE), train_size=5, test_size=None)
    assert len(task.train) == 5 and len(task.test) == 10
    assert task.train[0].text.startswith("[MATH TASK] Problem:\nNatalia sold clips")
    assert task.test[0].text.startswith("[MATH TASK] Problem:\nJanet")
    assert task.reward(task.test[0], "She makes 18 dollars.") == 1.0


def test_unreachable_hub_is_runtime_error(offline_hub):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"unreachable.*task\.options\.source=/path/to"):
        load_rows("nonexistent-org/nonexistent-ds", "test")
    assert time.monotonic() - start < 5
