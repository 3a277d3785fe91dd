"""Compare bench/claims/offpolicy.py results files cell by cell: final accuracy, the worst fall after a peak, and
whether two runs of a cell are identical — so that a change to TB is read against its control per seed, from
the files' own JSON, not from a hand-typed table.

    python -m bench.tools.grid_compare CONTROL.md CHANGE.md [MORE.md ...] [--objective tb] [--names a b c]

Per seed and k: each file's final accuracy, and its fall = the largest drop from an earlier evaluation's
best to a later evaluation (a late collapse that recovers by the end still counts). A slow start is not a
fall. "k=1 same" says whether a file's k = 1 evaluations equal the first file's exactly (a change that only
acts on stale data must leave k = 1 untouched: the inline runtime is deterministic given the warm start).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(path: Path, objective: str) -> dict:
    text = path.read_text()
    rows = json.loads(text.split("```json", 1)[1].split("```", 1)[0])
    return {(r["seed"], r["k"]): r for r in rows if r["objective"] == objective}


def fall(evals: list) -> float:
    """Largest drop (points) from the best evaluation so far to a later one."""
    best, worst = 0.0, 0.0
    for _, acc, _ in evals:
        best = max(best, acc)
        worst = max(worst, best - acc)
    return worst * 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument("--objective", default="tb")
    ap.add_argument("--names", nargs="+", default=None)
    args = ap.parse_args()
    names = args.names or [f.stem for f in args.files]
    grids = [load(f, args.objective) for f in args.files]
    cells = sorted(set().union(*grids))
    print("| seed | k | " + " | ".join(f"{n}: final (fall)" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for seed, k in cells:
        out = []
        for g in grids:
            r = g.get((seed, k))
            out.append("—" if r is None else f"{r['final'] * 100:.1f} ({fall(r['evals']):.1f})")
        print(f"| {seed} | {k} | " + " | ".join(out) + " |")
    base = grids[0]
    for name, g in zip(names[1:], grids[1:], strict=True):
        shared = [c for c in g if c[1] == 1 and c in base]
        same = sum([a for _, a, _ in g[c]["evals"]] == [a for _, a, _ in base[c]["evals"]] for c in shared)
        print(f"\nk=1 same as {names[0]}: {name} {same} of {len(shared)} seeds")
    for name, g in zip(names, grids, strict=True):
        for k in sorted({c[1] for c in g}):
            falls = [fall(r["evals"]) for c, r in g.items() if c[1] == k]
            print(f"{name} k={k}: worst fall {max(falls):.1f} points over {len(falls)} seeds")


if __name__ == "__main__":
    main()
