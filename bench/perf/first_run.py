"""What a newcomer's first commands take, and what they print: the README's Quickstart and recipe times come
from here.

    python -m bench.perf.first_run                        # the Quickstart's train command, the Python quickstart,
                                                          # and the enumerable recipe, each from a clean cache
    python -m bench.perf.first_run --runs quickstart      # a subset
    python -m bench.perf.first_run --smoke                # the default recipe shrunk to seconds (CI)
    python -m bench.perf.first_run --repeats 3            # each command 3 times, each in its own fresh clone

Each command runs in a fresh clone of this repository (its `.venv` linked, so installing is not timed: the
README states that separately, and scripts/train.sh's install step is left out) with an empty cache
(`TBA_CACHE`: SFT warm starts, converted GGUF models), as a first run would. Recorded per command: wall seconds,
its summary.json (start → end held-out score, training seconds) and the last lines it printed (the before/after
table); with --repeats, the median wall time beside every repeat's. Writes --results (default
bench/results/first_run/first_run.md) and, beside it, `tba report`'s report.html of the default recipe's first run
(report_default_recipe.html).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import RESULTS
from bench.lib.smoke import SMOKE_OVERRIDES

REPO = Path(__file__).resolve().parents[2]
RUNS = {  # name: (command, run directory it writes, what it is)
    "train.sh": (".venv/bin/tba train --overwrite", "runs/arith-tiny",
                 "the Quickstart's first command after its install step (scripts/train.sh): the default recipe"),
    "quickstart": (".venv/bin/python examples/quickstart.py", "runs/quickstart",
                   "examples/quickstart.py: SmolLM2-135M, a local jsonl, TRL-style rewards"),
    "enumerable": (".venv/bin/tba train enumerable_cpu output_dir=runs/enumerable", "runs/enumerable",
                   "tba train enumerable_cpu (1000 updates, exact KL to π*)"),
}


def clone(dest: Path) -> None:
    subprocess.run(["git", "clone", "-q", str(REPO), str(dest)], check=True)
    (dest / ".venv").symlink_to(REPO / ".venv")


def run_one(name: str, root: Path, extra: list[str], timeout: int, report: Path | None = None) -> dict:
    command, run_dir, what = RUNS[name]
    command = " ".join([command, *extra])
    env = {**os.environ, "TBA_CACHE": str(root / "cache"), "PYTHONUNBUFFERED": "1"}
    env.pop("VIRTUAL_ENV", None)
    print(f"$ {command}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(command, shell=True, cwd=root / "repo", env=env, capture_output=True, text=True,
                          timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{command} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = json.loads((root / "repo" / run_dir / "summary.json").read_text())
    tail = [line for line in proc.stdout.splitlines() if line.strip()][-14:]
    if report is not None:  # `tba report` of the run: the figures a first user sees
        subprocess.run([".venv/bin/tba", "report", run_dir, "--out", str(root / "report")], cwd=root / "repo", env=env,
                       check=True, capture_output=True, timeout=600)
        report.write_bytes((root / "report" / "report.html").read_bytes())
    print(f"  {wall:.0f} s: {summary['score_start']:.3f} → {summary['score_end']:.3f}", flush=True)
    return {"name": name, "command": command, "what": what, "wall_s": wall, "score_start": summary["score_start"],
            "score_end": summary["score_end"], "train_s": summary.get("train_wall_clock_s"),
            "steps": summary.get("trainer_steps"), "tail": tail}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per command")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each command, each from a fresh clone")
    ap.add_argument("--smoke", action="store_true", help="train.sh on a seconds-long recipe (CI)")
    ap.add_argument("--results", type=Path, default=RESULTS / "first_run" / "first_run.md")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.smoke:
        args.runs = ["train.sh"]
    rows = []
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tba-first-run-") as tmp:
        for name in args.runs:
            for repeat in range(args.repeats):
                root = Path(tmp) / f"{name}-{repeat}"
                root.mkdir()
                clone(root / "repo")
                report = args.results.parent / "report_default_recipe.html" if name == "train.sh" and not repeat \
                    else None
                rows.append({**run_one(name, root, SMOKE_OVERRIDES if args.smoke else [], args.timeout, report),
                             "repeat": repeat})
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "tail"}), flush=True)
    lines = ["| command | what | wall s (first run, empty cache): median [each] | held-out start → end | "
             "training s (steps): median |", "|---|---|---|---|---|"]
    for name in args.runs:
        mine = [r for r in rows if r["name"] == name]
        walls, r = [x["wall_s"] for x in mine], mine[0]
        scores = sorted({f"{x['score_start']:.3f} → {x['score_end']:.3f}" for x in mine})
        lines.append(f"| `{r['command']}` | {r['what']} | {statistics.median(walls):.0f} "
                     f"[{', '.join(f'{w:.0f}' for w in walls)}] | {'; '.join(scores)} | "
                     f"{statistics.median(x['train_s'] for x in mine):.0f} ({r['steps']}) |")
    for r in (x for x in rows if x["repeat"] == 0):
        lines += ["", f"What `{r['command']}` printed last:", "", "```", *r["tail"], "```"]
    head = header(__spec__.name, "each command in a fresh clone with an empty SFT cache; installing not timed "
                  f"(python {sys.version.split()[0]})", argv=argv)
    text = head + "\n".join(lines) + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n"
    args.results.write_text(text)
    print(text.split("```json")[0])


if __name__ == "__main__":
    main()
