"""`tba train|sft [CONFIG.yaml] [key.sub=value ...]`, `tba train --resume RUN_DIR`, `tba buffer stats|dump`,
`tba export RUN_DIR OUT_DIR`, `tba report RUN_DIR [RUN_DIR ...] [--out DIR]`.

The config (embedded default recipe when no file is given) is loaded and validated before anything heavy
is imported, so a typo costs a second, not a model build.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tba.config import ConfigError, load_config

USAGE = """tba train [CONFIG.yaml] [key.sub=value ...] [--overwrite]   run TBA (no config: the embedded default)
tba train --resume RUN_DIR [key.sub=value ...]            continue a run from its last complete checkpoint
tba sft   [CONFIG.yaml] [key.sub=value ...]               build (or reuse) the cached SFT warm start
tba buffer stats RUN_DIR                                  what a run's durable replay buffer holds
tba buffer dump RUN_DIR [--limit N]                       its stored groups as JSON lines (decoded if possible)
tba export RUN_DIR OUT_DIR                                the run's policy as a servable model (LoRA merged)
tba report RUN_DIR [RUN_DIR ...] [--out DIR]              figures + one self-contained report.html (runs overlaid)"""


def buffer_command(action: str, run_dir: str, limit: int | None) -> int:
    from tba.store import BufferStore, StoreError

    try:
        store = BufferStore(run_dir, readonly=True)
    except StoreError as e:
        print(f"tba: {e}", file=sys.stderr)
        return 1
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
        row = {"seq": seq, "step": step, "prompt_id": g.prompt_id, "prompt_tokens": g.prompt_tokens,
               "samples": [{"version": s.version, "reward": s.reward, "response": s.response,
                            "ref_logprob": s.ref_logprob_sum} for s in g.samples]}
        if tokenizer is not None:
            row["prompt"] = tokenizer.decode(g.prompt_tokens, skip_special_tokens=True)
            for d, s in zip(row["samples"], g.samples, strict=True):
                d["text"] = tokenizer.decode(s.response, skip_special_tokens=True)
        try:
            print(json.dumps(row))
        except BrokenPipeError:  # `| head`
            return 0
    return 0


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    config = None
    overrides = []
    for a in args:
        if "=" not in a and config is None and not overrides:
            config = a
        else:
            overrides.append(a)
    return config, overrides


def main(argv: list[str] | None = None) -> int:
    from tba.objectives import OBJECTIVES
    from tba.tasks import TASKS

    epilog = ("objectives (objective=...):\n" + "".join(f"  {o.name:<11} {o.summary}\n" for o in OBJECTIVES.values())
              + "tasks (task.name=...; or module:factory for your own, docs/tasks.md):\n"
              + "".join(f"  {t.name:<11} {t.summary}\n" for t in TASKS.values())
              + "recipes: src/tba/recipes/*.yaml; every key: docs/architecture.md")
    parser = argparse.ArgumentParser(prog="tba", usage=USAGE, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["train", "sft", "buffer", "export", "report"])
    parser.add_argument("args", nargs="*", help="optional CONFIG.yaml, then key.sub=value overrides")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR from its last complete checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="replace a previous run in output_dir")
    parser.add_argument("--limit", type=int, help="buffer dump: at most N groups")
    parser.add_argument("--out", metavar="DIR", help="report: where to write (default RUN_DIR/report, ./tba-report)")
    ns = parser.parse_intermixed_args(argv)
    if ns.command == "buffer":
        if len(ns.args) != 2 or ns.args[0] not in ("stats", "dump"):
            parser.error("usage: tba buffer stats|dump RUN_DIR")
        return buffer_command(ns.args[0], ns.args[1], ns.limit)
    if ns.command == "export":
        if len(ns.args) != 2:
            parser.error("usage: tba export RUN_DIR OUT_DIR")
        from tba.checkpoint import CheckpointError
        from tba.export import ExportError, export

        try:
            export(ns.args[0], ns.args[1])
        except (ExportError, CheckpointError) as e:
            print(f"tba: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        return 0
    if ns.command == "report":
        if not ns.args:
            parser.error("usage: tba report RUN_DIR [RUN_DIR ...] [--out DIR]")
        from tba.report import ReportError, report

        runs = [Path(a) for a in ns.args]
        out = Path(ns.out) if ns.out else runs[0] / "report" if len(runs) == 1 else Path("tba-report")
        try:
            report(runs, out)
        except ReportError as e:
            print(f"tba: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        return 0
    config, overrides = _split(ns.args)
    try:
        if ns.resume:
            if config is not None:
                raise ConfigError(f"--resume reads {ns.resume}/config.yaml; drop {config} (overrides are fine)")
            config = str(Path(ns.resume) / "config.yaml")
            if not Path(config).is_file():
                raise ConfigError(f"--resume {ns.resume}: no run there (config.yaml missing)")
            overrides = [f"output_dir={ns.resume}", *overrides]
        cfg = load_config(config, overrides)
    except ConfigError as e:
        print(f"tba: config error: {e}", file=sys.stderr)
        return 2

    from tba.checkpoint import CheckpointError
    from tba.models import ModelLoadError
    from tba.progress import console, print_summary
    from tba.rundir import RunDirError
    from tba.runtime.base import SearcherError
    from tba.store import StoreError

    def log(msg: str) -> None:
        console.print(msg, highlight=False, soft_wrap=True)

    try:
        if ns.command == "train":
            from tba.loop import train

            summary = train(cfg, log=log, resume=bool(ns.resume), overwrite=ns.overwrite)
            if summary:
                print_summary(summary)
            log(f"run directory: {cfg.output_dir} (summary.json, metrics.jsonl, tensorboard/, checkpoint/; "
                f"buffer.sqlite and checkpoints/ for `tba train --resume {cfg.output_dir}` and `tba buffer`)")
            log(f"figures: `tba report {cfg.output_dir}`; a servable model: `tba export {cfg.output_dir} OUT_DIR`")
        else:
            from tba.build import build_task
            from tba.sft import warm_start

            if cfg.model.policy != "builtin":
                raise ConfigError("tba sft currently builds the builtin warm start (model.policy=builtin)")
            path = warm_start(cfg, build_task(cfg), log=log)
            log(f"SFT checkpoint: {path}")
    except ConfigError as e:
        print(f"tba: config error: {e}", file=sys.stderr)
        return 2
    except RunDirError as e:
        print(f"tba: {e}", file=sys.stderr)
        return 2
    except (ModelLoadError, SearcherError, CheckpointError, StoreError) as e:
        print(f"tba: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tba: interrupted; searchers stopped. Continue with `tba train --resume {cfg.output_dir}`",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
