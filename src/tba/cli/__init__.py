"""The `tba` command: `tba COMMAND [args]`, one module per command group, each with its own parser and `--help`.

    tba train [CONFIG.yaml] [key.sub=value ...] [--overwrite]   run TBA (no config: the embedded default)
    tba train --resume RUN_DIR [key.sub=value ...]            continue a run from its last complete checkpoint
    tba sft   [CONFIG.yaml] [key.sub=value ...]               build (or reuse) the cached SFT warm start
    tba plan  [--gpus 8xH100] [CONFIG.yaml] [key.sub=value ...] per device, the memory the run needs (exit 1: no fit)
    tba buffer stats RUN_DIR                                  what a run's durable replay buffer holds
    tba buffer dump RUN_DIR [--limit N]                       its stored groups as JSON lines (decoded)
    tba export RUN_DIR OUT_DIR                                the run's policy as a servable model (LoRA merged)
    tba eval  RUN_DIR|CHECKPOINT|MODEL [RECIPE] [key=value ...] greedy pass@1, pass@k (--samples N --k 1 5), metrics
    tba report RUN_DIR [RUN_DIR ...] [--out DIR]              figures + one report.html (runs overlaid)
    tba serve RECIPE_OR_RUN [key.sub=value ...] [--port 0]    the policy behind an inference endpoint (Ctrl-C ends)

The config (embedded default recipe when no file is given) is loaded and validated before anything heavy
is imported, so a typo costs a second, not a model build: this is why each command imports what it runs
(torch and transformers take ≈ 10 s) inside its function. An error the user can cause (a `tba.errors.UserError`:
config, data, model, run directory, checkpoint, buffer, export, report) is printed as one line,
`tba: <label>: <message>`; anything else is a bug and keeps its traceback. `--debug` (or env TBA_DEBUG=1)
shows the traceback of both.
"""

from __future__ import annotations

import argparse
import os
import sys

from tba.cli import buffer, evaluate, export, plan, report, serve, train
from tba.cli.command import Command, user_error

USAGE = __doc__.split("\n\n")[1].replace("    tba", "tba")


def commands() -> dict[str, Command]:
    return {c.name: c for c in (*train.COMMANDS, plan.COMMAND, buffer.COMMAND, export.COMMAND, evaluate.COMMAND,
                                   report.COMMAND, serve.COMMAND)}


def build_parser(command: Command) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"tba {command.name}", description=command.help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_arguments(parser)
    parser.add_argument("--debug", action="store_true", default=os.environ.get("TBA_DEBUG", "") not in ("", "0"),
                        help="print the traceback of every error, also of those a user can cause (env TBA_DEBUG=1)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    known = commands()
    if not argv or argv[0] not in known:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"tba: unknown command {argv[0]!r}; one of: {', '.join(known)}\n", file=sys.stderr)
        print(f"usage:\n{USAGE}\n\n`tba COMMAND --help` for a command's options.", file=sys.stderr if argv and
              argv[0] not in ("-h", "--help") else sys.stdout)
        if argv and argv[0] in ("-h", "--help"):
            raise SystemExit(0)
        return 2
    command = known[argv[0]]
    from tba.run.progress import log_to_console  # rich, not torch: cheap

    log_to_console()
    ns = build_parser(command).parse_intermixed_args(argv[1:])
    try:
        return command.run(ns)
    except Exception as e:
        known_error = user_error(e)
        if known_error is None or ns.debug:
            raise
        code, line = known_error
        print(line, file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
