"""`tba train|sft [CONFIG.yaml] [key.sub=value ...]`, `tba train --resume RUN_DIR`, `tba buffer stats|dump`,
`tba export RUN_DIR OUT_DIR`, `tba report RUN_DIR [RUN_DIR ...] [--out DIR]`.

The config (embedded default recipe when no file is given) is loaded and validated before anything heavy
is imported, so a typo costs a second, not a model build: this is why each command imports what it runs
(torch and transformers take ≈ 10 s) inside its function. An error the user can cause (a `tba.errors.UserError`:
config, data, model, run directory, checkpoint, buffer, export, report) is printed as one line,
`tba: <label>: <message>`; anything else is a bug and keeps its traceback. `--debug` (or env TBA_DEBUG=1)
shows the traceback of both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tba.algorithm.objectives import OBJECTIVES
from tba.config import load_config
from tba.errors import ConfigError, UserError
from tba.rollout.episodes import turns
from tba.tasks import TASKS

USAGE = """tba train [CONFIG.yaml] [key.sub=value ...] [--overwrite]   run TBA (no config: the embedded default)
tba train --resume RUN_DIR [key.sub=value ...]            continue a run from its last complete checkpoint
tba sft   [CONFIG.yaml] [key.sub=value ...]               build (or reuse) the cached SFT warm start
tba buffer stats RUN_DIR                                  what a run's durable replay buffer holds
tba buffer dump RUN_DIR [--limit N]                       its stored groups as JSON lines (decoded if possible)
tba export RUN_DIR OUT_DIR                                the run's policy as a servable model (LoRA merged)
tba report RUN_DIR [RUN_DIR ...] [--out DIR]              figures + one self-contained report.html (runs overlaid)"""


def user_error(error: BaseException) -> tuple[int, str] | None:
    """(exit code, the one line to print) for an error the user caused; None for a bug."""
    if not isinstance(error, UserError):
        return None
    label = type(error).__name__ if error.label is None else error.label
    return error.exit_code, f"tba: {label}: {error}" if label else f"tba: {error}"


def log(msg: str) -> None:
    from tba.run.progress import console

    console.print(msg, highlight=False, soft_wrap=True)


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    config = None
    overrides = []
    for a in args:
        if "=" not in a and config is None and not overrides:
            config = a
        else:
            overrides.append(a)
    return config, overrides


def load_run_config(ns: argparse.Namespace):
    """The run's config: CONFIG.yaml (or the embedded default) with overrides, or RUN_DIR/config.yaml on --resume."""
    config, overrides = _split(ns.args)
    if ns.resume:
        if config is not None:
            raise ConfigError(f"--resume reads {ns.resume}/config.yaml; drop {config} (overrides are fine)")
        config = str(Path(ns.resume) / "config.yaml")
        if not Path(config).is_file():
            raise ConfigError(f"--resume {ns.resume}: no run there (config.yaml missing)")
        overrides = [f"output_dir={ns.resume}", *overrides]
    return load_config(config, overrides)


def interrupted(cfg) -> int:
    print(f"tba: interrupted; searchers stopped. Continue with `tba train --resume {cfg.output_dir}`",
          file=sys.stderr)
    return 130


def train_command(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    cfg = load_run_config(ns)
    from tba.runtime.forkserver import start_early

    start_early(cfg)  # the searchers' imports, in a server process, while this one imports the trainer's
    from tba.api import TBATrainer
    from tba.run.progress import print_summary

    try:
        summary = TBATrainer(args=cfg).train(resume=bool(ns.resume), overwrite=ns.overwrite, log=log)
    except KeyboardInterrupt:
        return interrupted(cfg)
    if summary:
        print_summary(summary)
    log(f"run directory: {cfg.output_dir} (summary.json, metrics.jsonl, tensorboard/, checkpoint/; "
        f"buffer.sqlite and checkpoints/ for `tba train --resume {cfg.output_dir}` and `tba buffer`)")
    log(f"figures: `tba report {cfg.output_dir}`; a servable model: `tba export {cfg.output_dir} OUT_DIR`")
    return 0


def sft_command(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    cfg = load_run_config(ns)
    from tba.run.train import sft

    try:
        path = sft(cfg, log=log)
    except KeyboardInterrupt:
        return interrupted(cfg)
    log(f"SFT checkpoint: {path}")
    return 0


def buffer_command(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if len(ns.args) != 2 or ns.args[0] not in ("stats", "dump"):
        parser.error("usage: tba buffer stats|dump RUN_DIR")
    (action, run_dir), limit = ns.args, ns.limit
    from tba.algorithm.store import BufferStore

    store = BufferStore(run_dir, readonly=True)
    if action == "stats":
        print(json.dumps(store.stats(), indent=1))
        return 0
    tokenizer = None
    run = Path(run_dir)
    candidates = [run / "checkpoint", run / "init", *sorted((run / "checkpoints").glob("step_*/model"))]
    for c in candidates:
        if (c / "tokenizer.json").is_file():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(c))
            break
    for n, (seq, step, g) in enumerate(store.iter_groups()):
        if limit is not None and n >= limit:
            break
        row = {"seq": seq, "step": step, "source": g.source, "prompt_id": g.prompt_id, "prompt_tokens": g.prompt_tokens,
               "samples": [{"version": s.version, "reward": s.reward, "response": s.response,
                            "ref_logprob": s.ref_logprob_sum,
                            **({"policy_mask": s.policy_mask} if s.policy_mask else {})}
                           for s in g.samples]}
        if tokenizer is not None:
            row["prompt"] = tokenizer.decode(g.prompt_tokens, skip_special_tokens=True)
            for d, s in zip(row["samples"], g.samples, strict=True):
                d["text"] = tokenizer.decode(s.response, skip_special_tokens=True)
                if s.policy_mask:  # an episode: its turns, whose they are, each decoded
                    d["turns"] = [{"by": "policy" if mine else "environment",
                                   "text": tokenizer.decode(s.response[a:b], skip_special_tokens=False)}
                                  for mine, a, b in turns(s.policy_mask)]
        try:
            print(json.dumps(row))
        except BrokenPipeError:  # `| head`
            return 0
    return 0


def export_command(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if len(ns.args) != 2:
        parser.error("usage: tba export RUN_DIR OUT_DIR")
    from tba.run.export import export

    export(ns.args[0], ns.args[1])
    return 0


def report_command(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not ns.args:
        parser.error("usage: tba report RUN_DIR [RUN_DIR ...] [--out DIR]")
    from tba.run.report import report

    runs = [Path(a) for a in ns.args]
    out = Path(ns.out) if ns.out else runs[0] / "report" if len(runs) == 1 else Path("tba-report")
    report(runs, out)
    return 0


COMMANDS = {"train": train_command, "sft": sft_command, "buffer": buffer_command, "export": export_command,
            "report": report_command}


def build_parser() -> argparse.ArgumentParser:
    epilog = ("objectives (objective=...):\n" + "".join(f"  {o.name:<11} {o.summary}\n" for o in OBJECTIVES.values())
              + "tasks (task.name=...; or module:factory for your own, docs/tasks.md):\n"
              + "".join(f"  {t.name:<11} {t.summary}\n" for t in TASKS.values())
              + "recipes: src/tba/recipes/*.yaml; every config key, documented: src/tba/config/schema.py")
    parser = argparse.ArgumentParser(prog="tba", usage=USAGE, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=list(COMMANDS))
    parser.add_argument("args", nargs="*", help="optional CONFIG.yaml, then key.sub=value overrides")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR from its last complete checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="replace a previous run in output_dir")
    parser.add_argument("--limit", type=int, help="buffer dump: at most N groups")
    parser.add_argument("--out", metavar="DIR", help="report: where to write (default RUN_DIR/report, ./tba-report)")
    parser.add_argument("--debug", action="store_true", default=os.environ.get("TBA_DEBUG", "") not in ("", "0"),
                        help="print the traceback of every error, also of those a user can cause (env TBA_DEBUG=1)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_intermixed_args(argv)
    try:
        return COMMANDS[ns.command](ns, parser)
    except Exception as e:
        known = user_error(e)
        if known is None or ns.debug:
            raise
        code, line = known
        print(line, file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
