"""Where the benchmarks write: committed results under bench/results/<script>/, one folder per script so that
everything a script wrote sits together, and run directories (never committed) under bench/_out/."""

from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
REPO = BENCH.parent
RESULTS = BENCH / "results"
OUT = BENCH / "_out"
