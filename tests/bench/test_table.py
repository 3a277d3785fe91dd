"""bench/README.md is the map from claim to script to result to command, and nothing in it is copied by hand where it
could go stale: the script and command cells are what the result files' headers say, each command runs as written
(its script's parser accepts it), every file in bench/results is on the map, every script is on it, and every
relative link in README.md, docs/ and bench/README.md resolves. No benchmark runs here."""

import re
from pathlib import Path

import pytest

from bench.lib import table

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
LINK = re.compile(r"\]\(([^)\s]+)\)")
# a path written out in prose or a code span, e.g. `bench/claims/offpolicy.py`; `af104a2:bench/…` names a file in
# git history (read it with `git show`), not in the tree
PATH = re.compile(r"(?<![\w:/])bench/[\w./-]+\.(?:py|md|png|jsonl|json|html|sh)\b")
ROWS = table.rows()
CLAIMS = [r for r in ROWS if r.table == "claims"]


def test_the_table_is_what_the_headers_say():
    text = table.README.read_text()
    assert table.render(text) == text, "bench/README.md is stale: run `python -m bench.lib.table`"


def test_one_result_per_claim_and_at_most_25_claims():
    results = [r.result for r in CLAIMS]
    assert 0 < len(CLAIMS) <= 25
    assert len(set(results)) == len(results), "a result file backs two claims"
    for row in ROWS:
        assert (BENCH / row.result).is_file(), f"{row.result} does not exist"


@pytest.mark.parametrize("row", CLAIMS, ids=[Path(r.result).stem for r in CLAIMS])
def test_each_claims_command_runs_as_written(row):
    """The result's header names its command, and the command's script accepts those arguments today."""
    command = table.command_of(row.result)
    assert command, f"{row.result}: no `- command:` line in its header"
    table.check_parses(command)


def test_every_results_file_is_on_the_map():
    """Nothing in bench/results but the tables' files and the raw rows (`.json`) a row's command writes beside one."""
    listed = {(BENCH / r.result).resolve() for r in ROWS}
    siblings = {p.with_suffix(".json") for p in listed if p.suffix == ".md"}
    stray = [p.relative_to(BENCH).as_posix() for p in (BENCH / "results").rglob("*")
             if p.is_file() and p.resolve() not in listed | siblings]
    assert not stray, f"in bench/results but not in bench/README.md's tables: {stray}"


def test_every_script_is_on_the_map():
    text = table.README.read_text()
    scripts = [p for group in ("claims", "perf") for p in (BENCH / group).glob("*.py") if p.name != "__init__.py"]
    assert scripts
    for path in scripts:
        assert f"]({path.relative_to(BENCH).as_posix()})" in text, f"bench/README.md does not link {path}"
    assert {p.name for p in BENCH.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))} <= {
        "claims", "perf", "lib", "results"}, "bench/ holds a folder the README does not describe"


DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")), "bench/README.md"]


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_and_bench_paths_resolve(doc):
    path = REPO / doc
    text = path.read_text()
    targets = [t.split("#")[0] for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and t[0] != "#"]
    broken = [t for t in targets if t and not (path.parent / t).exists()]
    assert not broken, f"{doc}: broken links {broken}"
    if doc != "bench/README.md":  # its commands are the result files' own, with the paths they wrote to
        missing = [p for p in PATH.findall(text) if not (REPO / p).exists()]
        assert not missing, f"{doc}: names missing files {missing}"


@pytest.mark.parametrize("doc", ["README.md", "docs/results.md"])
def test_the_results_docs_quote_only_files_on_the_map(doc):
    """README's and docs/results.md's numbers come from the claims' result files (or the other files listed)."""
    path = REPO / doc
    on_map = {(BENCH / r.result).resolve() for r in ROWS}
    cited = [t for t in LINK.findall(path.read_text()) if "bench/results/" in t]
    off = [t for t in cited if (path.parent / t.split("#")[0]).resolve() not in on_map]
    assert not off, f"{doc} links results files that are not in bench/README.md's tables: {off}"
