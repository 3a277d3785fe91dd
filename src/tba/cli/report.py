"""`tba report RUN_DIR [RUN_DIR ...] [--out DIR]`: figures and one self-contained report.html, runs overlaid."""

from __future__ import annotations

import argparse
from pathlib import Path

from tba.cli.command import Command


def report(ns: argparse.Namespace) -> int:
    from tba.run.report import report

    runs = [Path(a) for a in ns.runs]
    out = Path(ns.out) if ns.out else runs[0] / "report" if len(runs) == 1 else Path("tba-report")
    print(report(runs, out))  # the page, on stdout: what a script reads
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--out", metavar="DIR", help="where to write (default RUN_DIR/report, or ./tba-report)")


COMMAND = Command("report", "Figures and one self-contained report.html of one or more runs (overlaid).", arguments,
                  report)
