"""`tba train|sft [CONFIG.yaml] [key.sub=value ...]`.

The config (embedded default recipe when no file is given) is loaded and validated before anything heavy
is imported, so a typo costs a second, not a model build.
"""

from __future__ import annotations

import argparse
import sys

from tba.config import ConfigError, load_config

USAGE = """tba train [CONFIG.yaml] [key.sub=value ...]   run TBA (no config: the embedded arith_tiny_cpu recipe)
tba sft   [CONFIG.yaml] [key.sub=value ...]   build (or reuse) the cached SFT warm start and report it"""


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
    parser = argparse.ArgumentParser(prog="tba", usage=USAGE)
    parser.add_argument("command", choices=["train", "sft"])
    parser.add_argument("args", nargs="*", help="optional CONFIG.yaml, then key.sub=value overrides")
    ns = parser.parse_args(argv)
    config, overrides = _split(ns.args)
    try:
        cfg = load_config(config, overrides)
    except ConfigError as e:
        print(f"tba: config error: {e}", file=sys.stderr)
        return 2

    from tba.models import ModelLoadError
    from tba.progress import console, print_summary
    from tba.runtime.base import SearcherError

    def log(msg: str) -> None:
        console.print(msg, highlight=False)

    try:
        if ns.command == "train":
            from tba.loop import train

            summary = train(cfg, log=log)
            print_summary(summary)
            log(f"run directory: {cfg.output_dir} (summary.json, metrics.jsonl, tensorboard/, checkpoint/)")
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
    except (ModelLoadError, SearcherError) as e:
        print(f"tba: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tba: interrupted; searchers stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
