"""bench/README.md's tables, with each row's script and command read from its result's header, so that they cannot
go stale.

A claims row is written by hand as `| claim | [name](results/<script>/<name>.md) | | |`: the claim and the one
result file. The script and the command cells are not: `python -m bench.lib.table` fills them in from the result
file's `- command:` header line (`bench.lib.header.recorded_command`), and `python -m bench.lib.table --check`
exits 1 when bench/README.md differs from what it would write (tests/bench/test_table.py runs the same check). The
table of other kept files works the same way, with the command cell only.

A command is `python -m bench.<group>.<script> ARGS…`; `check_parses` hands ARGS to that script's own
`parse_args`, so a row whose command would not run as written (a moved script, a renamed option, an argument
that lost its quotes) fails the tests rather than the reader.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import sys
from dataclasses import dataclass

from bench.lib.header import code_span, recorded_command
from bench.lib.paths import BENCH

README = BENCH / "README.md"
CLAIMS_HEADER = "| claim | result | script | command (read from the result's header) |"
OTHER_HEADER = "| file | kept because | command (read from its header) |"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@dataclass
class Row:
    table: str  # "claims" or "other"
    cells: list[str]

    @property
    def result(self) -> str:
        """The result file, relative to bench/ (the first link of the row's result or file cell)."""
        found = LINK.findall(self.cells[1] if self.table == "claims" else self.cells[0])
        if len(found) != 1:
            raise ValueError(f"bench/README.md row {self.cells[0]!r}: link exactly one result file, not {found}")
        return found[0]


def split_cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def tables(text: str) -> list[tuple[str, int, int]]:
    """(kind, first row index, end index) of each generated table in the README's lines (header and rule excluded)."""
    lines, found = text.splitlines(), []
    for i, line in enumerate(lines):
        kind = {CLAIMS_HEADER: "claims", OTHER_HEADER: "other"}.get(line.strip())
        if kind:
            end = i + 2
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            found.append((kind, i + 2, end))
    return found


def rows(text: str | None = None) -> list[Row]:
    text = README.read_text() if text is None else text
    lines = text.splitlines()
    return [Row(kind, split_cells(lines[i])) for kind, start, end in tables(text) for i in range(start, end)]


def command_of(result: str) -> str | None:
    """The command the result file's header records, or None (a file written by hand)."""
    path = BENCH / result
    if path.suffix != ".md" or not path.is_file():
        return None
    return recorded_command(path.read_text())


def split_command(command: str) -> tuple[str, list[str]]:
    """`python -m bench.claims.x A B` → ("bench.claims.x", ["A", "B"]); anything else is an error."""
    argv = shlex.split(command)
    if argv[:2] != ["python", "-m"] or len(argv) < 3 or not argv[2].startswith("bench."):
        raise ValueError(f"not a `python -m bench.<group>.<script> …` command: {command}")
    return argv[2], argv[3:]


def script_cell(command: str | None) -> str:
    if command is None:
        return "—"
    module, _ = split_command(command)
    path = module.removeprefix("bench.").replace(".", "/") + ".py"
    return f"[{path}]({path})"


def command_cell(command: str | None) -> str:
    return "—" if command is None else code_span(command).replace("|", "\\|")


def render(text: str) -> str:
    """`text` (bench/README.md) with every generated cell rewritten from the result files' headers."""
    lines = text.splitlines()
    for kind, start, end in tables(text):
        for i in range(start, end):
            row = Row(kind, split_cells(lines[i]))
            command = command_of(row.result)
            if kind == "claims":
                cells = [row.cells[0], row.cells[1], script_cell(command), command_cell(command)]
            else:
                cells = [row.cells[0], row.cells[1], command_cell(command)]
            lines[i] = "| " + " | ".join(cells) + " |"
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def check_parses(command: str) -> None:
    """Raise ValueError unless the script's own parse_args accepts the command's arguments."""
    module, argv = split_command(command)
    script = importlib.import_module(module)
    try:
        script.parse_args(argv)
    except SystemExit as e:  # argparse reports to stderr and exits 2
        raise ValueError(f"{module} does not accept {argv} (exit {e.code})") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if bench/README.md is not what this would write")
    args = ap.parse_args(argv)
    text = README.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print("bench/README.md is stale: run `python -m bench.lib.table`", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
