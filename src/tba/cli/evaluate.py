"""`tba eval RUN_DIR | CHECKPOINT | MODEL [RECIPE] [key.sub=value ...]`: greedy pass@1 (a run's own final `score`,
by the run's own evaluator), pass@k over n samples per prompt, mean reward and the task's metrics, on the task's test
split (or any dataset the task takes through overrides), with hf or vLLM, spread over the devices given; written to
a results json (RUN_DIR/eval/<name>.json, or --out) and printed as a table (tba.run.eval_target)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from tba.cli.command import Command
from tba.cli.train import _split

logger = logging.getLogger(__name__)


def _tracker(enabled: bool):
    """progress(description, total) → advance(): a rich bar on a terminal, log lines otherwise."""
    if enabled and sys.stderr.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       transient=True)
        bar.start()

        def track(description, total):
            task = bar.add_task(description, total=total)
            return lambda: bar.advance(task) or (bar.finished and bar.stop())

        return track

    def log(description, total):
        count = [0]

        def advance():
            count[0] += 1
            logger.info(f"{description}: {count[0]}/{total} done")

        return advance

    return log


def render(results: dict) -> None:
    """The results as one table: the greedy evaluation's metrics, then the sampled pass's."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"tba eval: {escape(results['target'])} — {results['task']}, {results['problems']} problems, "
                        f"{results['backend']} on {', '.join(results['devices'])}", title_justify="left")
    table.add_column("pass")
    table.add_column("metric")
    table.add_column("value", justify="right")
    run_end = results.get("run_eval_end") or {}
    for name, value in (results.get("greedy") or {}).items():
        label = "greedy pass@1 (score)" if name == "score" else name
        mark = "" if name not in run_end else " (= run)" if run_end[name] == value else f" (run: {run_end[name]:.4g})"
        table.add_row("greedy", escape(label), f"{value:.4g}{mark}")
    sampled = results.get("sampled") or {}
    settings = {"samples", "temperature", "top_p", "threshold"}
    head = (f"n={sampled.get('samples')}, T={sampled.get('temperature')}, seed {results['seed']}" if sampled else "")
    for i, (name, value) in enumerate((k, v) for k, v in sampled.items() if k not in settings):
        table.add_row(head if i == 0 else "", escape(name),
                      f"{value:.4g}")
    Console(soft_wrap=True).print(table)


def evaluate(ns: argparse.Namespace) -> int:
    from tba.run.eval_target import EvalOptions, default_out, evaluate, write

    recipe, overrides = _split(ns.args)
    devices = [d.strip() for d in ns.devices.split(",") if d.strip()] if ns.devices else None
    options = EvalOptions(backend=ns.backend, devices=devices, samples=ns.samples, ks=ns.k or [1], seed=ns.seed,
                          temperature=ns.temperature, top_p=ns.top_p, threshold=ns.threshold, greedy=not ns.no_greedy)
    results = evaluate(ns.target, recipe, overrides, options, _tracker(not ns.no_progress))
    out = write(results, default_out(results, ns.name) if ns.out is None else Path(ns.out))
    render(results)
    logger.info(f"results: {out}")
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RUN_DIR|CHECKPOINT|MODEL",
                        help="a run directory, checkpoints/step_N, a model directory (tba export), a Hub id or "
                             "package:MODULE/FILE")
    parser.add_argument("args", nargs="*", metavar="[RECIPE] key.sub=value",
                        help="a recipe for a model outside a run (none: the embedded default), then overrides, e.g. "
                             "task.test_size=100 eval.max_new_tokens=64 task.options.test_source=data.jsonl")
    parser.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="generation engine (default hf)")
    parser.add_argument("--devices", metavar="D[,D...]",
                        help="cpu, cuda:0,cuda:1, …: one worker process per device, prompts split (default: "
                             "model.device, in this process)")
    parser.add_argument("--samples", type=int, default=0, metavar="N",
                        help="also sample N completions per prompt for pass@k (default 0: greedy only)")
    parser.add_argument("--k", type=int, nargs="+", metavar="K", help="pass@k for each K ≤ N (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled pass (default 0)")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default eval.temperature)")
    parser.add_argument("--top-p", type=float, help="nucleus of the sampled pass (default eval.top_p)")
    parser.add_argument("--threshold", type=float, default=1.0,
                        help="a sample passes when its reward is at least this (default 1.0)")
    parser.add_argument("--no-greedy", action="store_true", help="skip the greedy pass (sampled pass@k only)")
    parser.add_argument("--out", metavar="FILE.json", help="results file (default RUN_DIR/eval/<name>.json, or "
                                                            "./tba-eval/<name>.json for a model outside a run)")
    parser.add_argument("--name", help="the results file's name (default: final, step_N or the model's name)")
    parser.add_argument("--no-progress", action="store_true", help="log lines instead of a progress bar")


COMMAND = Command("eval", "Greedy pass@1, pass@k and the task's metrics of a run, checkpoint or model.", arguments,
                  evaluate)
