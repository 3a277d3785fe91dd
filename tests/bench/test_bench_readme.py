"""bench/README.md maps each claim to its script and results file; README.md and docs/ link to those files. A moved
or renamed file must not leave a claim pointing at nothing: every script and results file the map names exists,
every script in bench/ is on the map, and every relative link in README.md, docs/*.md and bench/README.md resolves."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
LINK = re.compile(r"\]\(([^)\s]+)\)")
# a path written out in prose or a code span, e.g. `bench/claims/offpolicy.py`
PATH = re.compile(r"\bbench/[\w./-]+\.(?:py|md|png|jsonl|json|html|sh)\b")


def claim_rows() -> list[list[str]]:
    """The cells of each row of bench/README.md's claims table."""
    text = (BENCH / "README.md").read_text()
    table = text.split("## Claims → script → results → command", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| claim | script | results |")
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows[1:] if not row.startswith("|---")]


def relative_links(path: Path) -> list[str]:
    return [t.split("#")[0] for t in LINK.findall(path.read_text()) if not re.match(r"[a-z]+:", t) and t[0] != "#"]


def test_every_claim_names_scripts_and_results_that_exist():
    rows = claim_rows()
    assert len(rows) >= 20
    for claim, script, results, command in rows:
        scripts = LINK.findall(script)
        assert scripts or "tba " in script, f"{claim}: no script"
        for target in scripts:
            assert target.endswith(".py") and (BENCH / target).is_file(), f"{claim}: {target} does not exist"
        files = LINK.findall(results)
        assert files, f"{claim}: no results file"
        for target in files:
            assert target.startswith("results/") and (BENCH / target).is_file(), f"{claim}: {target} does not exist"
        assert command.count("`") >= 2, f"{claim}: no command"


def test_every_script_is_on_the_map():
    text = (BENCH / "README.md").read_text()
    scripts = [p for group in ("claims", "perf", "tools", "archive") for p in (BENCH / group).glob("*.py")
               if p.name != "__init__.py"]
    assert scripts
    for path in scripts:
        assert f"]({path.relative_to(BENCH).as_posix()})" in text, f"bench/README.md does not link {path}"


DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")), "bench/README.md"]


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_and_bench_paths_resolve(doc):
    path = REPO / doc
    broken = [t for t in relative_links(path) if t and not (path.parent / t).exists()]
    assert not broken, f"{doc}: broken links {broken}"
    if doc != "bench/README.md":  # its commands are quoted as recorded, with the paths of the time
        missing = [p for p in PATH.findall(path.read_text()) if not (REPO / p).exists()]
        assert not missing, f"{doc}: names missing files {missing}"
