"""`tba plan [--gpus 8xH100] [--cpu-memory 1TB] [CONFIG.yaml] [key.sub=value ...]`: the run's memory plan per device,
from its config alone (no weights are read, nothing is downloaded; docs/plan.md), on this machine or on the target
`--gpus` names. Exit 0 when every device fits, 1 when one does not (with the smallest change that fits), 2 when a GPU
of the layout (or every device) could not be checked."""

from __future__ import annotations

import argparse
import sys

from tba.cli.command import Command
from tba.cli.train import config_arguments, load_run_config


def render(plan, machine) -> None:
    """The plan as one table per device (rich; plain text when stdout is not a terminal)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from tba.run.plan import gb

    console = Console(soft_wrap=True)
    console.print(escape(f"Memory plan on {machine.label} (an estimate: terms marked ~ depend on kernels and "
                         "allocators; [phase] terms are held only during that phase; docs/plan.md)"), highlight=False)
    for d in plan.devices:
        table = Table(title=f"{d.name}: needs {gb(d.need)} of {gb(d.usable)} usable"
                      + ("" if d.usable is None or d.name == "cpu" else f" ({gb(d.capacity)} total)"),
                      title_justify="left")
        table.add_column("occupant")
        table.add_column("term")
        table.add_column("size", justify="right")
        for o in d.occupants:
            for i, t in enumerate(o.terms):
                label = ("~ " if t.approximate else "") + (f"[{t.phase}] " if t.phase else "") + t.name
                table.add_row(escape(o.name) if i == 0 else "", escape(label), gb(t.bytes))
            peak = o.peak_phase()
            table.add_row("", f"[bold]{escape(o.name)} peak[/bold]" + (f" (during {peak})" if peak else ""),
                          f"[bold]{gb(o.bytes)}[/bold]", end_section=True)
        console.print(table)
        verdict = {True: "fits", False: "DOES NOT FIT", None: "not checked (capacity unknown)"}[d.fits]
        console.print(f"{d.name}: {verdict}" + "".join(f"; {p}" for p in d.problems), highlight=False)
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False)


def plan(ns: argparse.Namespace) -> int:
    from tba.run.plan import local_machine, make_plan, target_machine

    cfg = load_run_config(ns, check_installed=False)  # a plan for another machine needs no vLLM or Ray here
    machine = target_machine(ns.gpus, ns.cpu_memory) if ns.gpus or ns.cpu_memory else local_machine()
    result = make_plan(cfg, machine)
    render(result, machine)
    refusal, unchecked = result.refusal(), result.unchecked()
    gpus = [d for d in unchecked if d != "cpu"]
    if refusal:
        print(f"tba: plan: {refusal}", file=sys.stderr)
    if gpus or len(unchecked) == len(result.devices):  # a partial check is no answer: no change is searched for
        print(f"tba: plan: {', '.join(gpus or unchecked)}: capacity unknown on {machine.label}, not checked; plan "
              "for the target's GPUs with --gpus (e.g. --gpus 8xH100, --gpus 4xA100-80GB, --gpus 2x24GB)",
              file=sys.stderr)
        return 2
    if refusal:
        from tba.run.plan.fix import advice

        print(f"tba: plan: {advice(cfg, machine)}", file=sys.stderr)
        return 1
    return 0


def plan_arguments(parser: argparse.ArgumentParser) -> None:
    config_arguments(parser)
    parser.add_argument("--gpus", metavar="[Nx]GPU",
                        help="plan for a target's GPUs instead of this machine's: 8xH100, 4xA100-80GB, H200, 2x24GB, "
                             "8x80GiB (GB = 10^9 bytes, GiB = 2^30; without N every cuda:k the layout names); "
                             "names: H100, H100-NVL, H200, A100-80GB, A100-40GB, L40S, A40, L4, A10G, A10, T4, "
                             "RTX4090, RTX3090, RTX6000-ADA")
    parser.add_argument("--cpu-memory", metavar="SIZE",
                        help="the target's RAM (e.g. 1TB), to check what lives on `cpu` (the controller, host "
                             "buffers); with --gpus and without it, `cpu` is not checked")


COMMAND = Command("plan", "Per device, the memory a recipe's trainer and searchers will need, and whether it fits.",
                  plan_arguments, plan)
