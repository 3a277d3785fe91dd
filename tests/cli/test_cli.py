"""The CLI prints an error a user can cause as one line, `tba: <Error>: <message>`, with the exit code of its
kind, and keeps the traceback for bugs; `--debug` / TBA_DEBUG=1 show the traceback anyway. In process (cli.main):
the data errors below are raised while the task is built, before any model is loaded."""

import pytest

import tba.run.train
from tba.cli import main, user_error
from tba.tasks.data import DataLoadError, DataUnreachableError


@pytest.fixture
def bad_jsonl(tmp_path):
    """A GSM8K directory whose train.jsonl has a line 2 that is not JSON."""
    data = tmp_path / "gsm8k"
    data.mkdir()
    good = '{"question": "What is 1+1?", "answer": "#### 2"}\n'
    (data / "train.jsonl").write_text(good + '{"question": "cut mid-write", "answer": \n')
    (data / "test.jsonl").write_text(good)
    return data


def one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_a_jsonl_line_that_is_not_json_is_one_line_naming_the_file_and_line(tmp_path, bad_jsonl, capsys):
    code = main(["train", "gsm8k-rho1b", f"task.options.source={bad_jsonl}", f"output_dir={tmp_path / 'run'}"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 1
    assert line.startswith(f"tba: DataLoadError: gsm8k: {bad_jsonl / 'train.jsonl'} line 2 is not valid JSON")


def test_a_hub_dataset_that_cannot_be_loaded_offline_is_one_line(tmp_path, offline_hub, capsys):
    code = main(["train", "gsm8k-rho1b", f"output_dir={tmp_path / 'run'}"])  # task.options.source: openai/gsm8k
    line = one_error_line(capsys.readouterr().err)
    assert code == 1
    assert line.startswith("tba: DataUnreachableError: gsm8k: could not load 'openai/gsm8k'")
    assert "task.options.source=" in line  # says how to pass a local copy


def test_a_missing_data_file_is_one_line(tmp_path, capsys):
    missing = tmp_path / "nowhere.jsonl"
    assert main(["train", "gsm8k-rho1b", f"task.options.source={missing}", f"output_dir={tmp_path / 'run'}"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line == f"tba: DataNotFoundError: gsm8k: data file {missing} does not exist"


@pytest.mark.parametrize("switch", ["flag", "env"])
def test_debug_shows_the_traceback_of_a_user_error(tmp_path, bad_jsonl, monkeypatch, switch):
    args = ["train", "gsm8k-rho1b", f"task.options.source={bad_jsonl}", f"output_dir={tmp_path / 'run'}"]
    if switch == "flag":
        args.append("--debug")
    else:
        monkeypatch.setenv("TBA_DEBUG", "1")
    with pytest.raises(DataLoadError, match="line 2 is not valid JSON"):
        main(args)


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    def buggy(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(tba.run.train, "train", buggy)
    with pytest.raises(ZeroDivisionError):
        main(["train", f"output_dir={tmp_path / 'run'}"])


def test_user_errors_are_told_from_bugs_by_type():
    from tba.algorithm.store import StoreError
    from tba.errors import ConfigError
    from tba.models import ModelLoadError
    from tba.run.checkpoint import CheckpointError
    from tba.run.export import ExportError
    from tba.run.report import ReportError
    from tba.run.rundir import RunDirError
    from tba.runtime.worker import SearcherError
    from tba.tasks.data import DataLoadError

    assert user_error(ConfigError("trainer.steps: must be > 0")) == (2, "tba: config error: trainer.steps: must be > 0")
    assert user_error(RunDirError("runs/x already holds a run")) == (2, "tba: runs/x already holds a run")
    for cls in (DataLoadError, DataUnreachableError, ModelLoadError, SearcherError, CheckpointError, StoreError,
                ExportError, ReportError):
        assert user_error(cls("why")) == (1, f"tba: {cls.__name__}: why")
    assert user_error(ZeroDivisionError("a bug")) is None
    assert issubclass(DataUnreachableError, RuntimeError)  # what it was before: `except RuntimeError` still works


def test_the_help_points_config_keys_to_the_schema(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "tba train --resume RUN_DIR" in capsys.readouterr().out  # every command, one line each
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "src/tba/config/schema.py" in out and "--debug" in out and "--resume" in out


def test_a_command_has_only_its_own_options(capsys):
    with pytest.raises(SystemExit):
        main(["export", "run", "out", "--limit", "3"])  # --limit is `tba buffer dump`'s
    assert "unrecognized arguments: --limit" in capsys.readouterr().err
    assert main(["nonsense"]) == 2


def test_an_interrupted_run_says_how_to_continue_it(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tba.run.train, "train", interrupted)
    assert main(["train", f"output_dir={tmp_path / 'run'}"]) == 130
    assert f"Continue with `tba train --resume {tmp_path / 'run'}`" in one_error_line(capsys.readouterr().err)
