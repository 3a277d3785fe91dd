"""What a person sees and does while a run goes: its log lines, the live progress bar, Ctrl-C, the before/after
table.

Every module logs through stdlib `logging` (`logging.getLogger(__name__)`, under the `tba` logger); the front doors
(the `tba` command, `TBATrainer.train`) call `log_to_console` once, which prints INFO and above on stderr through
the same rich console as the progress bar (so the two never garble each other), as plain lines without a
terminal. A program that configures logging itself keeps its own handlers: the API then adds none.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

logger = logging.getLogger(__name__)

console = Console(stderr=True)


class ConsoleHandler(logging.Handler):
    """One log line per record on the console, as the user reads it: the message (a warning says so first)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            prefix = {logging.WARNING: "warning: ", logging.ERROR: "error: "}.get(record.levelno, "")
            console.print(prefix + record.getMessage(), highlight=False, soft_wrap=True, markup=False)
        except Exception:
            self.handleError(record)


def log_to_console(only_if_unconfigured: bool = False) -> None:
    """Print tba's log (INFO and above) on the console, once. `only_if_unconfigured`: not when the program has
    configured logging itself (a handler on the root or the `tba` logger): the API's way in."""
    tba = logging.getLogger("tba")
    if any(isinstance(h, ConsoleHandler) for h in tba.handlers):
        return
    if only_if_unconfigured and (logging.getLogger().handlers or tba.handlers):
        return
    tba.addHandler(ConsoleHandler())
    tba.setLevel(logging.INFO)


class RunProgress:
    """A live bar on a terminal; without one (a log file, CI) a plain line every `plain_every_s` seconds and
    at the last step, so that `tba train > log` reads as a log, never as a truncated bar."""

    def __init__(self, total: int, enabled: bool = True, start: int = 0, plain_every_s: float = 30.0):
        self.enabled, self.total, self.start, self.plain_every_s = enabled, total, start, plain_every_s
        self.plain = enabled and not console.is_terminal
        self._t0 = self._last = time.monotonic()
        self._progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
            console=console, disable=not enabled or self.plain,
        )
        # a resumed run starts at its checkpoint step, so speed and ETA count only the steps done now
        self._task = self._progress.add_task("train", total=total, completed=start, info="")

    def __enter__(self):
        self._progress.start()
        self._t0 = self._last = time.monotonic()
        return self

    def __exit__(self, *exc):
        self._progress.stop()

    def update(self, step: int, *, reward: float, score: float, beta: float, tokens_per_s: float,
               staleness: float = float("nan"), replay: float = float("nan"),
               search_tokens_per_s: float = float("nan"), mfu: float = float("nan")) -> None:
        """`replay`: draws per sample received (tba.algorithm.loop.Loop.replay_ratio), shown so that a trainer
        running far ahead of its searchers is visible before the warning, not only in metrics.jsonl;
        `tokens_per_s`, `search_tokens_per_s`, `mfu`: trainer/tokens_per_s, searcher/tokens_per_s, trainer/mfu."""
        info = (f"reward {reward:.3f} · eval {score:.3f} · β {beta:.4g} · staleness {staleness:.1f} · "
                f"replay {replay:.1f}× · {throughput(tokens_per_s, search_tokens_per_s, mfu)}")
        self._progress.update(self._task, completed=step, info=info)
        now = time.monotonic()
        if self.plain and (now - self._last >= self.plain_every_s or step == self.total):
            self._last = now
            elapsed = now - self._t0
            done = step - self.start
            eta = elapsed / done * (self.total - step) if done else float("nan")
            print(f"step {step}/{self.total} · {_clock(elapsed)} elapsed, eta {_clock(eta)} · {info}",
                  file=sys.stderr, flush=True)


def throughput(trainer: float, searchers: float = float("nan"), mfu: float = float("nan")) -> str:
    """`train 1,234 tok/s · search 567 tok/s · MFU 1.2%`, each part only when known."""
    parts = [f"train {trainer:,.0f} tok/s"]
    if searchers == searchers:  # not nan
        parts.append(f"search {searchers:,.0f} tok/s")
    if mfu == mfu:
        parts.append(f"MFU {100 * mfu:.2g}%")
    return " · ".join(parts)


def _clock(seconds: float) -> str:
    if seconds != seconds:  # nan
        return "?"
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}"


class GracefulStop:
    """First Ctrl-C / SIGTERM: finish the current update, checkpoint, stop — or, inside `interruptible` (an
    evaluation, which can take minutes), stop at once. A second Ctrl-C: stop at once."""

    def __init__(self):
        self.requested, self._previous, self._now = False, {}, False

    def _handle(self, signum, frame):
        if self._now or (self.requested and signum == signal.SIGINT):
            raise KeyboardInterrupt
        self.requested = True
        logger.info(f"{signal.Signals(signum).name}: stopping after this step with a checkpoint (Ctrl-C again: now)")

    @contextlib.contextmanager
    def interruptible(self):
        if self.requested:
            raise KeyboardInterrupt  # asked during the update: its evaluation is not worth waiting for
        self._now = True
        try:
            yield
        finally:
            self._now = False

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class RunControl:
    """What a person sees and does while the updates run (the loop's `Progress`): the bar and Ctrl-C."""

    def __init__(self, total: int, enabled: bool = True, start: int = 0, plain_every_s: float = 30.0):
        self.bar, self.stop = RunProgress(total, enabled, start, plain_every_s), GracefulStop()

    @property
    def requested(self) -> bool:
        return self.stop.requested

    def __enter__(self):
        self.bar.__enter__()
        self.stop.__enter__()
        return self

    def __exit__(self, *exc):
        self.stop.__exit__(*exc)
        self.bar.__exit__(*exc)

    def update(self, step: int, **fields: float) -> None:
        self.bar.update(step, **fields)

    def interruptible(self):
        return self.stop.interruptible()


def print_summary(summary: dict) -> None:
    table = Table(title="tba: before / after")
    table.add_column("metric")
    table.add_column("start", justify="right")
    table.add_column("end", justify="right")
    table.add_column("change", justify="right")
    a0, a1 = summary["score_start"], summary["score_end"]
    start, end = summary.get("eval_start") or {}, summary.get("eval_end") or {}
    if set(start) - {"score"}:  # a task with its own metrics (win rate, attack success...): mean reward + those
        table.add_row(f"eval: mean reward (n={summary['test_problems']} prompts)", f"{a0:.4g}", f"{a1:.4g}",
                      f"{a1 - a0:+.4g}")
        for key in sorted(set(start) & set(end) - {"score"}):
            table.add_row(f"eval: {key}", f"{start[key]:.4g}", f"{end[key]:.4g}", f"{end[key] - start[key]:+.4g}")
    else:
        table.add_row(f"test accuracy (greedy pass@1, n={summary['test_problems']})", f"{a0:.1%}", f"{a1:.1%}",
                      f"{(a1 - a0) * 100:+.1f} pts")
    r0, r1 = summary["train_reward_start"], summary["train_reward_end"]
    table.add_row("train reward (T-sampled, first/last 10%)", f"{r0:.3f}", f"{r1:.3f}", f"{r1 - r0:+.3f}")
    table.add_row("trainer steps / samples received", "", f"{summary['trainer_steps']} / "
                  f"{summary['samples_received']}", "")
    table.add_row("wall clock (total / training)", "", f"{summary['wall_clock_s']:.0f}s / "
                  f"{summary['train_wall_clock_s']:.0f}s", "")
    if summary.get("replay_ratio") is not None:
        table.add_row("replay (draws per sample received)", "", f"{summary['replay_ratio']:.1f}×", "")
    if summary.get("episodes_ended"):  # multi-turn: timeouts and errors apart, each a different fix
        table.add_row("episodes ended", "", ", ".join(f"{n} {reason}" for reason, n in summary["episodes_ended"].items()
                                                      if n or reason in ("timeout", "error")), "")
    events = {"searcher restarts": summary.get("searcher_restarts"), "updates skipped (non-finite)":
              summary.get("skipped_steps"), "samples dropped (bad reward)": summary.get("samples_dropped_bad_reward"),
              "prompts over the length limit": summary.get("prompts_too_long"),
              "resumed at steps": ", ".join(map(str, summary.get("resumed_at_steps") or [])) or None}
    for name, value in events.items():
        if value:
            table.add_row(name, "", str(value), "")
    Console().print(table)
