"""Soak: the default recipe trained for an hour; resident memory of every process and the durable buffer's
size on disk sampled each minute.

    python -m bench.perf.soak --minutes 60       # writes bench/results/soak/soak.{md,json}; a plot to bench/_out/soak/
    python -m bench.perf.soak --smoke            # 30 s, samples every 10 s (what CI runs)
    python -m bench.perf.soak --recipe tool_arith_smollm2_cpu --kill-searcher 20 40 --minutes 60 [key=value ...]

The run is `tba train` (embedded default recipe) with `trainer.steps` raised so it cannot finish first,
in its own process; every `--interval` seconds the script reads VmRSS of the trainer, of each searcher and of
the other processes below it (the fork server searchers start from, the resource tracker) from /proc, the
size of RUN_DIR/buffer.sqlite (with its WAL), plus the run's last metrics line. Pass config overrides after the
options (e.g. `buffer.compact=false` for the store that keeps every sample). `--recipe` trains another recipe;
`--kill-searcher M …` kills one searcher process (kill -9, the first one found: a multi-turn searcher is
mid-episode at almost any moment) at each of those minutes, which the run must survive by restarting it. At the
end it sends Ctrl-C (the run writes its exit checkpoint) and reports growth from the first sample (after start-up
and prefill) to the last, the searcher restarts, and whether every group the trainer accepted is in the durable
buffer (groups accepted by the last metrics line vs groups in buffer.sqlite).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.lib.header import command, header, machine, today
from bench.lib.paths import OUT, RESULTS
from bench.lib.scratch import scratch_dir


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, …): searchers fork from a fork server, not the trainer."""
    out, todo = [], children(pid)
    while todo:
        out.append(todo.pop())
        todo += children(out[-1])
    return out


def searcher_pids(trainer: int) -> list[int]:
    """The run's searcher processes: spawned children, or children of its fork server (tba.runtime.forkserver)."""
    out = []
    for kid in children(trainer):
        line = cmdline(kid)
        if "multiprocessing.forkserver" in line:
            out += children(kid)
        elif "multiprocessing.spawn" in line:
            out.append(kid)
    return out


def disk_mb(run: Path) -> float:
    """Bytes of the durable buffer on disk (buffer.sqlite and its -wal/-shm files), in MB."""
    return sum(f.stat().st_size for f in run.glob("buffer.sqlite*") if f.is_file()) / 2**20


def last_metrics(run: Path) -> dict:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--interval", type=float, default=60)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--recipe", default=None, help="a recipe name or path (default: the embedded default)")
    ap.add_argument("--kill-searcher", type=float, nargs="*", default=[], metavar="MINUTE",
                    help="kill -9 one searcher at each of these minutes")
    ap.add_argument("--out", default=None, help="results path without suffix (.md and .json are written); default "
                    "bench/results/soak/soak (--smoke: a temporary directory, removed at the end)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    args.argv = argv
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with scratch_dir("tba-soak-") as root:  # the run; with --smoke also its SFT cache (and results unless --out)
        if args.smoke:  # tiny warm start so that CI does not spend minutes on SFT
            args.minutes, args.interval = 0.5, 10.0
            args.out = args.out or str(root / "results" / "soak")
            args.overrides += ["sft.steps=30", "sft.log_every_steps=30", f"sft.cache_dir={root / 'sft-cache'}",
                               "task.test_size=16", "task.train_size=500"]
        args.out = args.out or str(RESULTS / "soak" / "soak")
        soak(args, root)


def soak(args, root: Path) -> None:
    run = root / "run"
    cmd = [sys.executable, "-m", "tba", "train", *([args.recipe] if args.recipe else []), f"output_dir={run}",
           "trainer.steps=100000000", "logging.progress=false", *args.overrides]
    log = open(run.parent / "train.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    print(f"soak: {' '.join(cmd)}\nlog: {run.parent / 'train.log'}", flush=True)
    while not (run / "metrics.jsonl").is_file() or not last_metrics(run):  # start-up, SFT, prefill
        if proc.poll() is not None:
            sys.exit(f"training exited early ({proc.returncode}); see {run.parent / 'train.log'}")
        time.sleep(2)
    samples, t0, kills = [], time.monotonic(), []
    pending = sorted(args.kill_searcher)
    while True:
        if pending and (time.monotonic() - t0) / 60 >= pending[0]:
            victims = searcher_pids(proc.pid)
            if victims:
                os.kill(victims[0], signal.SIGKILL)
                kills.append({"minute": (time.monotonic() - t0) / 60, "pid": victims[0]})
                print(f"killed searcher pid {victims[0]}", flush=True)
            pending.pop(0)
        m = last_metrics(run)
        kids, searchers = descendants(proc.pid), searcher_pids(proc.pid)
        row = {"minute": (time.monotonic() - t0) / 60, "trainer_mb": rss_mb(proc.pid),
               "searchers_mb": [rss_mb(k) for k in searchers],
               "others_mb": sum(rss_mb(k) for k in kids if k not in searchers), "processes": 1 + len(kids),
               "step": m.get("step"), "buffer_size": m.get("buffer/size"), "buffer_groups": m.get("buffer/groups"),
               "disk_mb": disk_mb(run)}
        row["total_mb"] = row["trainer_mb"] + sum(row["searchers_mb"]) + row["others_mb"]
        samples.append(row)
        print(json.dumps(row), flush=True)
        if proc.poll() is not None:
            sys.exit(f"training died ({proc.returncode}); see {run.parent / 'train.log'}")
        if row["minute"] >= args.minutes:
            break
        wake = t0 + len(samples) * args.interval
        if pending:
            wake = min(wake, t0 + pending[0] * 60)
        time.sleep(max(0.0, wake - time.monotonic()))
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=120)
    final = last_metrics(run)
    from tba.algorithm.store import BufferStore

    store = BufferStore(run, readonly=True)
    stored = store.accepted
    store.close()
    survival = {"kills": kills, "searcher_restarts": final.get("searcher/restarts"),
                "groups_accepted_last_logged": final.get("buffer/groups"), "groups_in_store": stored,
                "groups_lost": max(0, (final.get("buffer/groups") or 0) - stored)}
    kill_minutes = ", ".join(f"{k['minute']:.1f}" for k in kills)
    first, last = samples[0], samples[-1]
    growth = {k: (last[k] - first[k]) / first[k] for k in ("trainer_mb", "total_mb")}
    before, after = sum(first["searchers_mb"]), sum(last["searchers_mb"])
    growth["searchers_mb"] = (after - before) / max(before, 1)
    hours = max(last["minute"] - first["minute"], 1e-9) / 60
    groups = max((last["buffer_groups"] or 0) - (first["buffer_groups"] or 0), 1)
    disk = {"mb_per_hour": (last["disk_mb"] - first["disk_mb"]) / hours,
            "mb_per_1000_groups": 1000 * (last["disk_mb"] - first["disk_mb"]) / groups, "final_mb": last["disk_mb"]}
    peak = max(s["total_mb"] for s in samples)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"command": command(__spec__.name, args.argv), "train_command": " ".join(cmd), "date": today(),
              "machine": machine(), "overrides": args.overrides, "exit_code_after_ctrl_c": code, "growth": growth,
              "disk": disk, "peak_total_mb": peak, "survival": survival, "samples": samples}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plots = root if args.smoke else OUT / "soak"  # never bench/results; a smoke run leaves nothing behind
    plots.mkdir(parents=True, exist_ok=True)
    _plot(samples, plots / out.with_suffix(".png").name)
    lines = [
        header(__spec__.name, f"runs: `{result['train_command']}`", argv=args.argv,
               title=f"Soak: {args.recipe or 'the default recipe'} for {args.minutes:g} minutes, memory and buffer "
               f"size sampled every {args.interval:g} s").rstrip("\n"), "",
        "RSS counts pages shared with a process's parent (searchers fork from a fork server that imported tba) in "
        "each process, so the total over-counts the machine's use.", "",
        "| minute | trainer step | buffer samples in memory | groups accepted | buffer.sqlite MB | trainer RSS MB | "
        "each searcher's RSS MB | fork server and resource tracker MB | total MB |", "|---" * 9 + "|",
        *[f"| {s['minute']:.1f} | {s['step']} | {s['buffer_size']} | {s['buffer_groups']} | {s['disk_mb']:.1f} | "
          f"{s['trainer_mb']:.0f} | {' + '.join(f'{x:.0f}' for x in s['searchers_mb']) or '—'} | "
          f"{s['others_mb']:.0f} | {s['total_mb']:.0f} |" for s in samples], "",
        f"Durable buffer: {disk['final_mb']:.1f} MB at the end; grew {disk['mb_per_hour']:.1f} MB per hour "
        f"({disk['mb_per_1000_groups']:.2f} MB per 1000 groups accepted) from the first sample to the last.", "",
        f"RSS growth first → last sample: trainer {growth['trainer_mb']:+.1%}, searchers (sum) "
        f"{growth['searchers_mb']:+.1%}, all processes "
        f"{growth['total_mb']:+.1%} (peak {peak:.0f} MB). Ctrl-C at the end: exit code {code} "
        "(130 = interrupted, exit checkpoint written).",
        *([""] if kills else []),
        *([f"Searchers killed (kill -9) at minutes {kill_minutes}; searcher restarts "
           f"by the last metrics line: {survival['searcher_restarts']}. Groups accepted by the last logged update: "
           f"{survival['groups_accepted_last_logged']}; groups in buffer.sqlite after the exit: {stored} — "
           f"{survival['groups_lost']} lost."] if kills else []),
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _plot(samples: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    minutes = [s["minute"] for s in samples]
    series = {"all processes": [s["total_mb"] for s in samples], "trainer": [s["trainer_mb"] for s in samples],
              "searchers (sum)": [sum(s["searchers_mb"]) for s in samples]}
    for label, values in series.items():
        ax.plot(minutes, values, marker="o", ms=3, label=label)
    ax.set_xlabel("minutes since the first trainer step")
    ax.set_ylabel("resident memory (MB)")
    ax.set_ylim(bottom=0)
    ax.set_title("tba soak: RSS sampled every interval")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
