"""Dataset rows for tasks, from the Hub or from a local copy, with errors that name the file, row and field.

Training machines are often offline, so every dataset-backed task accepts either a Hub name (loaded with
`datasets`) or a local path: a jsonl/json/parquet file, a directory holding `{split}.jsonl` (or `.json`,
`.parquet`), or a Hub snapshot directory with `**/{split}-*.parquet` shards. A row with a missing or empty
field fails before training, naming the row, rather than becoming an empty prompt.

Every such failure is the user's data, not a bug, so it is a `DataLoadError` (the CLI prints it as one line):
the base class for a file that cannot be parsed or a row that lacks a field, `DataNotFoundError` for a local
path that is not there, `DataUnreachableError` for a Hub name that cannot be loaded. The two subclasses are
also a FileNotFoundError / RuntimeError, the types these errors had before.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import NoReturn

from tba.errors import UserError

LOCAL_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DataLoadError(UserError, ValueError):
    """A data source that cannot be read or parsed; the message names the source and, where there is one, the
    row or line and the field."""


class DataNotFoundError(DataLoadError, FileNotFoundError):
    """A local data path (file, or `{split}` file in a directory) that does not exist."""


class DataUnreachableError(DataLoadError, RuntimeError):
    """A Hub dataset name that could not be loaded (offline, unreachable or unknown) and is no local path."""


def local_files(source: str, split: str, task: str) -> list[Path] | None:
    """The local file(s) holding `split`; None if `source` is no local path (then it is a Hub name).

    A directory is searched for `{split}.jsonl`/`.json`/`.parquet`, else for a Hub snapshot's
    `**/{split}-*.parquet` shards (all of them). A single file serves every split, so pass a directory when
    the splits must differ.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        found = [path / f"{split}{suffix}" for suffix in LOCAL_SUFFIXES if (path / f"{split}{suffix}").is_file()]
        found = found[:1] or sorted(path.glob(f"**/{split}-*.parquet"))
        if not found:
            raise DataNotFoundError(f"{task}: no {split}.jsonl, {split}.json, {split}.parquet or "
                                    f"{split}-*.parquet shards in directory {path}")
        return found
    if path.suffix in LOCAL_SUFFIXES:
        if not path.is_file():
            raise DataNotFoundError(f"{task}: data file {path} does not exist")
        return [path]
    return None


_JSON_KINDS = {list: "a JSON array", str: "a JSON string", int: "a JSON number", float: "a JSON number",
               bool: "a JSON boolean", type(None): "JSON null"}


def json_problem(path: Path) -> str | None:
    """What makes the local .jsonl/.json file `path` unreadable as rows, as "line N ..." (1-based), or None if
    every line is a JSON object (JSON lines) or the file is one JSON array of objects.

    `datasets` reports a bad line as e.g. "Unexpected character found when decoding 'null'", naming neither
    the file nor the line; this finds them. It reads the whole file, so it runs only once loading has failed.
    """
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        return f"line {line} is not UTF-8 text ({e.reason} at byte {e.start})"
    whole = None
    if path.suffix == ".json":  # one JSON document (an array of objects), or JSON lines like a .jsonl
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            whole = e
        else:
            if isinstance(doc, list):
                for i, item in enumerate(doc):
                    if not isinstance(item, dict):
                        return f"item {i} of its top-level array is {_JSON_KINDS.get(type(item))}, not an object"
                return None
            return None if isinstance(doc, dict) else f"line 1 is {_JSON_KINDS.get(type(doc))}, not an object"
    lines = text.split("\n")  # not splitlines(): JSON strings may hold U+2028 and other line breaks unescaped
    first = next((n for n, line in enumerate(lines, 1) if line.strip()), None)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if whole is not None and n == first:  # not JSON lines either: the document's own error
                return f"line {whole.lineno} is not valid JSON ({whole.msg} at column {whole.colno})"
            return f"line {n} is not valid JSON ({e.msg} at column {e.colno})"
        if not isinstance(row, dict):
            return f"line {n} is {_JSON_KINDS.get(type(row))}, not an object"
    return None


def _raise_json_problem(files: list[Path], task: str, error: Exception) -> NoReturn:
    """`datasets` failed to read local JSON `files` with `error`: a DataLoadError naming the file and line."""
    for path in files:
        if problem := json_problem(path):
            raise DataLoadError(f"{task}: {path} {problem}") from error
    raise DataLoadError(f"{task}: could not read {', '.join(map(str, files))} as JSON lines or a JSON array of "
                     f"objects ({type(error).__name__}: {error})") from error


@contextlib.contextmanager
def quiet(datasets):
    """No progress bar and no log lines from `datasets` while it reads a local file: for a file it cannot parse
    it logs its own error line (without the line number), and the DataLoadError raised instead says it all."""
    verbosity, bars = datasets.utils.logging.get_verbosity(), not datasets.are_progress_bars_disabled()
    datasets.utils.logging.set_verbosity(logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.utils.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


def load_split(source: str, split: str, *, task: str, fields: tuple[str, ...], hub_config: str | None = None,
               size: int | None = None, local_hint: str) -> tuple[list[dict], str]:
    """(rows, where): the first `size` rows (all if None) of `split`, only `fields`, each checked to be a
    non-empty string. `where` names the file or dataset, for the caller's own row checks.

    An unreachable Hub becomes a DataUnreachableError that says how to pass a local copy (`local_hint`), since the
    raw `datasets` error does not.
    """
    import datasets  # deferred: importing datasets costs ~1 s, which callers of a reward need not pay

    local = local_files(source, split, task)
    if local is not None:
        builder = LOCAL_SUFFIXES.get(local[0].suffix, "parquet")
        try:
            with quiet(datasets):
                ds = datasets.load_dataset(builder, data_files=[str(p) for p in local], split="train")
        except Exception as e:
            if builder != "json":
                raise DataLoadError(f"{task}: could not read {', '.join(map(str, local))} as parquet "
                                    f"({type(e).__name__}: {e})") from e
            _raise_json_problem(local, task, e)
        where = str(local[0]) if len(local) == 1 else f"{local[0].parent} ({split}-*.parquet)"
    else:
        try:
            ds = datasets.load_dataset(source, hub_config, split=split)
        # ConnectionError, OfflineModeIsEnabled, DatasetNotFoundError...: to the user they all mean the same
        except Exception as e:
            raise DataUnreachableError(
                f"{task}: could not load {source!r} (split {split!r}) from the Hugging Face Hub, which looks "
                f"unreachable ({type(e).__name__}: {e}); no local path {source!r} exists either. Pass a local "
                f"copy instead: {local_hint}. Set HF_HUB_OFFLINE=1 to skip Hub retries."
            ) from e
        where = f"{source} ({split})"
    for name in fields:
        if name not in ds.column_names:
            raise DataLoadError(f"{task} row 0 of {where}: missing field {name!r} (columns: {ds.column_names})")
    ds = ds.select_columns(list(fields))  # the Hub datasets may carry large columns the task never reads
    if size is not None:
        ds = ds.select(range(min(size, len(ds))))
    try:
        rows = ds.to_list()
    except UnicodeDecodeError as e:  # pyarrow keeps a JSON file's invalid UTF-8 in the column until it is read
        if local is None or LOCAL_SUFFIXES.get(local[0].suffix) != "json":
            raise
        _raise_json_problem(local, task, e)
    for i, row in enumerate(rows):
        for name in fields:
            value = row.get(name)
            if value is None:
                raise DataLoadError(f"{task} row {i} of {where}: missing field {name!r}")
            if not isinstance(value, str) or not value.strip():
                raise DataLoadError(f"{task} row {i} of {where}: field {name!r} must be a non-empty string")
    return rows, where
