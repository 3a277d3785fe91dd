"""How long `tba train` takes to start, as a user sees it: searcher processes forked from the fork server (the
default, tba.runtime.forkserver) vs spawned (supervision.start_method=spawn), whole command from launch.

    python -m bench.perf.startup [--config arith_hard_cpu] [--repeats 3] [--steps 2] [key=value ...]
    python -m bench.perf.startup --smoke    # the default recipe shrunk to seconds, one repeat (CI)

Each repeat runs `python -m tba train CONFIG trainer.steps=STEPS eval.every_steps=STEPS supervision.start_method=M`
in a fresh process for each method, alternating (spawn, forkserver, spawn, …) so that a machine that slows down
mid-benchmark slows both alike, and records:
- command (s): launch to exit, the wall-clock a user waits (imports, models, the first and last evaluation, STEPS
  updates, the final checkpoint): the same work either way except how the searcher starts;
- start-up (s): the run's `startup_s` (summary.json: from the models being built to the searchers being ready,
  the first evaluation excluded) — what bench/perf/vs_trl.py --startup adds to tba's clock.
The SFT warm start is built (or found in its cache) once before timing. Run on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.lib.header import header
from bench.lib.paths import OUT, RESULTS
from bench.lib.smoke import SMOKE_OVERRIDES

METHODS = ("spawn", "forkserver")


def run_once(config: str, method: str, out: Path, steps: int, overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "tba", "train", config, f"output_dir={out}", f"trainer.steps={steps}",
           f"eval.every_steps={steps}", f"supervision.start_method={method}", "logging.progress=false", *overrides,
           "--overwrite"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"method": method, "command_s": wall, "startup_s": summary["startup_s"]}


def table(rows: list[dict]) -> str:
    out = ["| start method | command (s), median | start-up (s), median | command (s), each repeat | "
           "start-up (s), each repeat |", "|---|---|---|---|---|"]
    for m in METHODS:
        mine = [r for r in rows if r["method"] == m]
        cmd, up = [r["command_s"] for r in mine], [r["startup_s"] for r in mine]
        out.append(f"| {m} | {statistics.median(cmd):.1f} | {statistics.median(up):.2f} | "
                   f"{' / '.join(f'{x:.1f}' for x in cmd)} | {' / '.join(f'{x:.2f}' for x in up)} |")
    med = {m: statistics.median(r["command_s"] for r in rows if r["method"] == m) for m in METHODS}
    out += ["", f"Command wall-clock saved by forking: {med['spawn'] - med['forkserver']:.1f} s "
                f"(medians: spawn {med['spawn']:.1f} s, forkserver {med['forkserver']:.1f} s)."]
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="arith_hard_cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT / "startup")
    ap.add_argument("--results", type=Path, default=RESULTS / "startup" / "startup.md")
    ap.add_argument("--smoke", action="store_true", help="the default recipe shrunk to seconds, one repeat (CI)")
    ap.add_argument("overrides", nargs="*", help="config overrides for every run")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        args.config, args.repeats = "arith_tiny_cpu", 1
        args.overrides = [*(o for o in SMOKE_OVERRIDES if not o.startswith("trainer.steps=")),
                          f"sft.cache_dir={args.out / 'sft-cache'}", *args.overrides]
    warm = subprocess.run([sys.executable, "-m", "tba", "sft", args.config, *args.overrides], capture_output=True,
                          text=True, timeout=3600)
    if warm.returncode != 0:
        raise SystemExit(f"tba sft failed:\n{warm.stderr[-3000:]}")
    rows = []
    for i in range(args.repeats):
        for m in METHODS:
            rows.append({"repeat": i, **run_once(args.config, m, args.out / m, args.steps, args.overrides)})
            print(json.dumps(rows[-1]), flush=True)
    md = table(rows)
    print(md)
    head = header(__spec__.name, "command: `python -m tba train` from launch to exit, in a fresh process; start-up: "
                  "summary.json's startup_s (models built → searchers ready, first evaluation excluded)", argv=argv)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(head + md + "\n\n```json\n" + json.dumps(rows, indent=1) + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
