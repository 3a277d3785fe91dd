"""The Python API (tba.api) and the dataset task: a reward function written for TRL runs unchanged, from Python
and from the CLI; chat prompts and extra columns reach it; what cannot cross to searcher processes fails before
training, naming itself."""

import copy
import json
import re

import pytest
from api_rewards import CALLS, answer_in_completion, length_penalty
from paths import TESTS

from tba import TBAConfig, TBATrainer
from tba.cli import main
from tba.config import load_config
from tba.errors import ConfigError
from tba.models import save_checkpoint

QUICK = ["trainer.steps=2", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
         "trainer.micro_batch_prompts=2", "search.prompts_per_batch=2", "search.generations_per_prompt=2",
         "search.max_new_tokens=6", "eval.max_new_tokens=6", "buffer.prefill_samples=4", "eval.every_steps=2",
         "logging.progress=false", "logging.tensorboard=false", "runtime=inline", "mode=sync"]
CHAT = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}A:{% endif %}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_model, tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = CHAT
    path = tmp_path_factory.mktemp("model") / "tiny"
    save_checkpoint(tiny_model, tokenizer, path)
    return str(path)


def rows(n=12, chat=False):
    out = []
    for i in range(n):
        question = f"{i}+{i + 1}="
        out.append({"prompt": [{"role": "user", "content": question}] if chat else question,
                    "answer": str(2 * i + 1), "difficulty": i % 3})
    return out


def test_a_trl_reward_function_runs_unchanged_through_the_api(tmp_path, model_dir):
    CALLS.clear()
    args = TBAConfig.from_yaml(None, f"output_dir={tmp_path / 'run'}", *QUICK)
    trainer = TBATrainer(model=model_dir, reward_funcs=[answer_in_completion, length_penalty], args=args,
                         train_dataset=rows(), reward_weights=[1.0, 0.5], callbacks=[lambda s, m: seen.append(s)])
    seen = []
    summary = trainer.train()
    assert summary["trainer_steps"] == 2 and seen == [1, 2] and summary["test_problems"] == 1
    call = CALLS[0]
    assert set(call) >= {"prompts", "completions", "completion_ids", "answer", "difficulty"}
    assert isinstance(call["completions"][0], str) and isinstance(call["completion_ids"][0], list)
    assert len(call["prompts"]) == len(call["completions"]) == len(call["answer"])
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"reward/answer_in_completion", "reward/length_penalty"} <= metrics[-1].keys()
    assert {"reward/answer_in_completion", "reward/length_penalty"} <= summary["eval_end"].keys()
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "api_rewards:answer_in_completion" in config  # importable functions are saved as their targets


def test_chat_prompts_and_extra_columns_reach_the_reward(tmp_path, model_dir):
    CALLS.clear()
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(chat=True)))
    args = TBAConfig.from_yaml(None, f"output_dir={tmp_path / 'run'}", *QUICK)
    TBATrainer(model=model_dir, reward_funcs=answer_in_completion, args=args, train_dataset=str(data)).train()
    call = CALLS[-1]
    assert call["prompts"][0][0]["role"] == "user"  # as the dataset holds them
    assert call["completions"][0][0]["role"] == "assistant"  # conversational completions, as TRL passes them
    assert set(call["difficulty"]) <= {0, 1, 2}


def test_the_same_reward_from_the_cli(tmp_path, model_dir):
    CALLS.clear()
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    rewards = TESTS / "api_rewards.py"
    code = main(["train", f"output_dir={tmp_path / 'run'}", "task.name=dataset", f"model.policy={model_dir}",
                 f"task.options.source={data}", f"task.options.reward={rewards}:answer_in_completion,"
                 f"{rewards}:length_penalty", "sft.enabled=false", *QUICK])
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["trainer_steps"] == 2
    assert {"reward/answer_in_completion", "reward/length_penalty"} <= summary["eval_end"].keys()


def test_what_cannot_reach_searcher_processes_fails_before_training(tmp_path, model_dir):
    def make_closure(bonus):
        def closure(completions, **kwargs):
            return [bonus] * len(completions)
        return closure

    for bad, name in ((lambda completions, **kw: [0.0] * len(completions), "<lambda>"),
                      (make_closure(1.0), "closure")):
        args = TBAConfig.from_yaml(None, f"output_dir={tmp_path / 'run'}", *QUICK, "runtime=local", "mode=async")
        with pytest.raises(ConfigError, match=f"task.options.reward: .*{name}.* cannot reach the searcher processes"
                                              ".*runtime=inline"):
            TBATrainer(model=model_dir, reward_funcs=[bad], args=args, train_dataset=rows()).train()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing trained
    inline = TBAConfig.from_yaml(None, f"output_dir={tmp_path / 'inline'}", *QUICK)
    summary = TBATrainer(model=model_dir, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                         args=inline, train_dataset=rows()).train()
    assert summary["trainer_steps"] == 2  # one process takes anything


def test_bad_dataset_input_names_the_row_or_column(model_dir):
    from tba.tasks.data import DataLoadError
    from tba.tasks.dataset import DatasetTask

    with pytest.raises(DataLoadError, match="row 1: no 'prompt' column"):
        DatasetTask([{"prompt": "a"}, {"question": "b"}], reward=answer_in_completion)
    with pytest.raises(DataLoadError, match="row 0: 'prompt' must be non-empty text or a list of chat messages"):
        DatasetTask([{"prompt": ""}], reward=answer_in_completion)
    with pytest.raises(ConfigError, match="needs at least one reward function"):
        DatasetTask(rows())
    with pytest.raises(ConfigError, match="2 weights for 1 reward functions"):
        DatasetTask(rows(), reward=answer_in_completion, reward_weights=[1, 2])


def test_none_skips_a_function_and_a_completion_no_function_scored_is_dropped():
    from tba.tasks.dataset import DatasetTask

    def maybe(completions, **kwargs):
        return [None if c == "skip" else 1.0 for c in completions]

    def never(completions, **kwargs):
        return [None] * len(completions)

    task = DatasetTask(rows(), reward=[maybe, never], reward_weights=[2.0, 1.0])
    p = task.train[0]
    assert task.rewards([p, p], ["ok", "skip"], [True, True]) == [2.0, None]
    assert task.reward_metrics() == pytest.approx({"reward/maybe": 1.0, "reward/never": float("nan")}, nan_ok=True)


def test_a_config_round_trips_and_overrides():
    args = TBAConfig.from_yaml(None, "trainer.steps=7")
    assert isinstance(args, TBAConfig) and args.trainer.steps == 7
    assert args.override("trainer.lr=1e-4").trainer.lr == 1e-4 and args.trainer.lr == 2e-5
    with pytest.raises(ConfigError, match="trainer.stepz"):
        args.override("trainer.stepz=3")
    assert load_config(None, ["task.name=dataset", "model.policy=x/y"]).task.name == "dataset"


@pytest.mark.parametrize("fn, says", [("one_value", r"reward function one_value returned 1 values for \d+ completions"),
                                      ("moods", r"reward function moods returned 'high' \(str\) for completion 0")])
def test_a_reward_function_that_breaks_its_contract_stops_the_run_in_one_line(tmp_path, model_dir, capsys, fn, says):
    """Wrong count or wrong type: one line naming the function, what it returned and what it must return — no
    traceback, and nothing left running (the local searcher process is stopped)."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    code = main(["train", f"output_dir={tmp_path / 'run'}", "task.name=dataset", f"model.policy={model_dir}",
                 f"task.options.source={data}", f"task.options.reward={TESTS / 'api_rewards.py'}:{fn}",
                 "sft.enabled=false", *QUICK])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    line = next(x for x in err.splitlines() if x.startswith("tba: reward error:"))
    assert re.search(says, line) and "it must return a list of" in line
