"""`tba export RUN_DIR OUT_DIR`: the run's policy as a servable `from_pretrained` directory (LoRA merged)."""

from __future__ import annotations

import argparse

from tba.cli.command import Command


def export(ns: argparse.Namespace) -> int:
    from tba.run.export import export

    export(ns.run_dir, ns.out_dir)
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("out_dir", metavar="OUT_DIR")


COMMAND = Command("export", "The run's policy as a servable model (LoRA merged, tokenizer included).", arguments,
                  export)
