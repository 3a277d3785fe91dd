"""`tba plan [CONFIG.yaml] [key.sub=value ...]`: the run's memory plan per device, from its config alone (no weights
are read; docs/plan.md). Exit 0 when every device it can check fits, 1 when one does not."""

from __future__ import annotations

import argparse
import sys

from tba.cli.command import Command
from tba.cli.train import config_arguments, load_run_config


def render(plan) -> None:
    """The plan as one table per device (rich; plain text when stdout is not a terminal)."""
    from rich.console import Console
    from rich.table import Table

    from tba.run.plan import gb

    console = Console(soft_wrap=True)
    console.print("Memory plan (an estimate: terms marked ~ depend on kernels and allocators; docs/plan.md)")
    for d in plan.devices:
        table = Table(title=f"{d.name}: needs {gb(d.need)} of {gb(d.usable)} usable"
                      + ("" if d.usable is None or d.name == "cpu" else f" ({gb(d.capacity)} total)"),
                      title_justify="left")
        table.add_column("occupant")
        table.add_column("term")
        table.add_column("size", justify="right")
        for o in d.occupants:
            for i, t in enumerate(o.terms):
                table.add_row(o.name if i == 0 else "", ("~ " if t.approximate else "") + t.name, gb(t.bytes))
            table.add_row("", f"[bold]{o.name} total[/bold]", f"[bold]{gb(o.bytes)}[/bold]", end_section=True)
        console.print(table)
        verdict = {True: "fits", False: "DOES NOT FIT", None: "not checked (capacity unknown)"}[d.fits]
        console.print(f"{d.name}: {verdict}")
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False)


def plan(ns: argparse.Namespace) -> int:
    cfg = load_run_config(ns)
    from tba.run.plan import make_plan

    result = make_plan(cfg)
    render(result)
    refusal = result.refusal()
    if refusal:
        print(f"tba: plan: {refusal}", file=sys.stderr)
        return 1
    return 0


COMMAND = Command("plan", "Per device, the memory a recipe's trainer and searchers will need, and whether it fits.",
                  config_arguments, plan)
