"""How many correct answers the searchers supplied, by the policy version they were generated with: for each window
of `--every` versions, the share of searcher groups holding at least one sample of reward ≥ `--correct`, and the
searchers' mean reward. Read from finished runs' durable buffers (read-only), so it asks a question after the fact:
was a run starved of rewarded samples before it learnt, or did it have them and wait on something else?

    python -m bench.tools.correct_supply bench/_out/offpolicy_sources_hard/TB_fp-s2 ... --windows 2

Each argument is a run's output folder or its buffer.sqlite. Prints a
markdown table; data from other sources (demonstrations, logged data) is left out, and so are samples a long
run's buffer compaction removed (`buffer.max_samples`): read early windows of such a run with that in mind.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from tba.algorithm.store import BufferStore


def supply(run: Path, every: int, correct: float, source: str = "policy") -> dict[int, tuple[int, float, float]]:
    """{first version of the window: (groups, share with ≥ 1 correct sample, mean sample reward)}."""
    store = BufferStore(run, readonly=True)
    windows: dict[int, list] = defaultdict(lambda: [0, 0, 0.0, 0])  # groups, with correct, reward sum, samples
    try:
        for _, _, group in store.iter_groups():
            if group.source != source:
                continue
            rewards = [s.reward for s in group.samples]
            w = windows[max(s.version for s in group.samples) // every * every]
            w[0] += 1
            w[1] += max(rewards) >= correct
            w[2] += sum(rewards)
            w[3] += len(rewards)
    finally:
        store.close()
    return {k: (g, c / g, r / n) for k, (g, c, r, n) in sorted(windows.items())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run output folders or buffer files")
    ap.add_argument("--every", type=int, default=25, help="policy versions per window")
    ap.add_argument("--windows", type=int, default=4, help="how many windows to print, from version 0")
    ap.add_argument("--correct", type=float, default=1.0, help="the reward that counts as correct")
    args = ap.parse_args(argv)
    heads = [f"{k * args.every}–{(k + 1) * args.every - 1}" for k in range(args.windows)]
    print("| run | " + " | ".join(f"versions {h}: groups with a correct answer (mean reward)" for h in heads) + " |")
    print("|---|" + "---|" * args.windows)
    for run in args.runs:
        got = supply(run, args.every, args.correct)
        cells = [f"{got[k][1]:.0%} of {got[k][0]} ({got[k][2]:.3f})" if k in got else "—"
                 for k in range(0, args.windows * args.every, args.every)]
        print(f"| {run.name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
