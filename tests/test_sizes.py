"""What a newcomer reads stays short enough to be read: the README, docs/results.md (the current state, history in
git), all of docs/, and each module of the package (a module past 400 lines is two ideas)."""

import pytest
from paths import REPO

KB = 1000
LIMITS = [("README.md", [REPO / "README.md"], 10 * KB), ("docs/results.md", [REPO / "docs" / "results.md"], 25 * KB),
          ("docs/*.md", sorted((REPO / "docs").glob("*.md")), 160 * KB)]


@pytest.mark.parametrize("name, paths, limit", LIMITS, ids=[n for n, _, _ in LIMITS])
def test_the_docs_stay_within_their_size(name, paths, limit):
    size = sum(len(p.read_bytes()) for p in paths)
    assert paths and size <= limit, f"{name}: {size} bytes, more than {limit}: rewrite, don't append"


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(REPO)): n for p in (REPO / "src" / "tba").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"modules over 400 lines: {long}"
