"""`tba train` and `tba sft`: a recipe (or the embedded default) with dotted overrides, or a run to resume."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from tba.algorithm.objectives import OBJECTIVES
from tba.cli.command import Command
from tba.config import load_config
from tba.errors import ConfigError
from tba.tasks import TASKS

logger = logging.getLogger(__name__)


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    config = None
    overrides = []
    for a in args:
        if "=" not in a and config is None and not overrides:
            config = a
        else:
            overrides.append(a)
    return config, overrides


def load_run_config(ns: argparse.Namespace, *, check_installed: bool = True):
    """The run's config: CONFIG.yaml (or the embedded default) with overrides, or RUN_DIR/config.yaml on --resume
    (`check_installed` false: for a plan, which needs no vLLM or Ray on this machine)."""
    config, overrides = _split(ns.args)
    if getattr(ns, "resume", None):
        if config is not None:
            raise ConfigError(f"--resume reads {ns.resume}/config.yaml; drop {config} (overrides are fine)")
        config = str(Path(ns.resume) / "config.yaml")
        if not Path(config).is_file():
            raise ConfigError(f"--resume {ns.resume}: no run there (config.yaml missing)")
        overrides = [f"output_dir={ns.resume}", *overrides]
    return load_config(config, overrides, check_installed=check_installed)


def interrupted(cfg) -> int:
    print(f"tba: interrupted; searchers stopped. Continue with `tba train --resume {cfg.output_dir}`",
          file=sys.stderr)
    return 130


def check_plan(cfg) -> None:
    """Refuse, before anything is loaded, a layout that `tba plan` says cannot fit (a PlanError: one line, exit 1,
    naming the smallest change that fits when there is one).
    A plan that cannot be made (a model's config not available offline, …) never stops the run: one debug line (the
    run itself then says what is missing, if anything; `--debug` shows why the plan was skipped)."""
    from tba.run.plan import PlanError, local_machine, make_plan
    from tba.run.plan.fix import advice

    try:
        refusal = make_plan(cfg).refusal()
    except Exception as e:  # noqa: BLE001 — the check may only refuse what it computed, never fail a run itself
        logger.debug(f"memory plan skipped ({type(e).__name__}: {e})")
        return
    if refusal:
        try:
            hint = advice(cfg, local_machine())
            refusal = f"{refusal}. {hint[0].upper()}{hint[1:]}"
        except Exception as e:  # noqa: BLE001 — a failed search for a fix still refuses what does not fit
            logger.debug(f"no change that fits was searched for ({type(e).__name__}: {e})")
        raise PlanError(refusal)


def train(ns: argparse.Namespace) -> int:
    cfg = load_run_config(ns)
    if not ns.ignore_plan:
        check_plan(cfg)
    from tba.runtime.forkserver import start_early

    start_early(cfg)  # the searchers' imports, in a server process, while this one imports the trainer's
    from tba.api import TBATrainer
    from tba.run.progress import print_summary

    try:
        summary = TBATrainer(args=cfg).train(resume=bool(ns.resume), overwrite=ns.overwrite,
                                             set_aside_buffer=ns.set_aside_buffer)
    except KeyboardInterrupt:
        return interrupted(cfg)
    if summary:
        print_summary(summary)
    logger.info(f"run directory: {cfg.output_dir} (summary.json, metrics.jsonl, tensorboard/, checkpoint/; "
        f"buffer.sqlite and checkpoints/ for `tba train --resume {cfg.output_dir}` and `tba buffer`)")
    logger.info(f"figures: `tba report {cfg.output_dir}`; a servable model: `tba export {cfg.output_dir} OUT_DIR`")
    return 0


def sft(ns: argparse.Namespace) -> int:
    cfg = load_run_config(ns)
    from tba.run.train import sft

    try:
        path = sft(cfg)
    except KeyboardInterrupt:
        return interrupted(cfg)
    logger.info(f"SFT checkpoint: {path}")
    return 0


def config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("objectives (objective=...):\n"
                     + "".join(f"  {o.name:<11} {o.summary}\n" for o in OBJECTIVES.values())
                     + "tasks (task.name=...; or module:factory for your own, docs/tasks.md):\n"
                     + "".join(f"  {t.name:<16} {t.summary}\n" for t in TASKS.values())
                     + f"  {'verifiers:ENV':<16} a verifiers v1 environment, run by verifiers' training client\n"
                     + "recipes: src/tba/recipes/*.yaml; every config key, documented: src/tba/config/schema.py")
    parser.add_argument("args", nargs="*", metavar="[CONFIG.yaml] key.sub=value",
                        help="a recipe (a file or a shipped recipe's name; none: the embedded default), then overrides")


def train_arguments(parser: argparse.ArgumentParser) -> None:
    config_arguments(parser)
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR from its last complete checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="replace a previous run in output_dir")
    parser.add_argument("--set-aside-buffer", action="store_true",
                        help="--resume: move a replay buffer that cannot be read aside (buffer.set-aside-N.sqlite) "
                             "and resume from the checkpoint with the groups it can still read")
    parser.add_argument("--ignore-plan", action="store_true",
                        help="start even if `tba plan` estimates that the run does not fit in memory")


COMMANDS = (Command("train", "Run TBA on a recipe (no config: the embedded default) or resume a run.", train_arguments,
                    train),
            Command("sft", "Build (or reuse) the cached SFT warm start of the builtin model.", config_arguments, sft))
