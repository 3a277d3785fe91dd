"""Every data source that cannot be read is a DataLoadError naming it; the subclasses keep the types these errors
had before (FileNotFoundError for a missing local path, RuntimeError for an unreachable Hub name)."""

import pytest

from tba.tasks.data import DataLoadError, DataNotFoundError, load_split

FIELDS = ("question", "answer")


def load(source):
    return load_split(str(source), "train", task="t", fields=FIELDS, local_hint="task.options.source=DIR")


def test_a_file_that_is_not_parquet_names_the_file(tmp_path):
    bad = tmp_path / "train.parquet"
    bad.write_bytes(b"not a parquet file")
    with pytest.raises(DataLoadError, match=rf"t: could not read {bad} as parquet \("):
        load(bad)


def test_a_row_without_a_field_names_the_row_and_field(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "q", "answer": "a"}\n{"question": "q2"}\n')
    with pytest.raises(DataLoadError, match=r"t row 1 of .*train\.jsonl: missing field 'answer'"):
        load(data)


def test_a_missing_path_is_a_data_load_error_and_still_a_file_not_found_error(tmp_path):
    with pytest.raises(DataNotFoundError, match="does not exist") as caught:
        load(tmp_path / "absent.jsonl")
    assert isinstance(caught.value, DataLoadError) and isinstance(caught.value, FileNotFoundError)
