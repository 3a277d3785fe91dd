"""A sharded trainer's ranks as processes of this machine (runtime=local and offline): torch.multiprocessing spawn,
one command queue per rank, one queue of answers for all, the rendezvous on loopback. A stream's buckets (a
publication, the masters) cross a pipe of their own, each tensor's bytes read by the controller straight into a
tensor of its own, each send returning once the controller has read it: rank 0 holds one bucket beyond its shard.
Through the answers queue they would not: a queue's put returns at once (rank 0 would gather every bucket ahead of
the controller), its feeder thread pickles another copy, and torch moves a queued tensor into shared memory that
stays mapped while the controller keeps it.

Each rank process watches the controller (tba.runtime.lifetime.Lifeline: it ends within a fraction of a second of
the controller's exit, even blocked in a collective) and ignores Ctrl-C (the controller's to handle). A second
watcher thread waits for the controller's `abort` flag — raised when any rank failed — and aborts the process group
before the process exits: a rank blocked in an NCCL collective on a dead peer (a C call no Python signal handler
interrupts) is released at once instead of at the watchdog's timeout.
The controller reads answers with a deadline and checks between reads that every rank is alive: a rank that raised
(its traceback), died (its exit code) or fell silent past the deadline ends the group with TrainerRankError naming
it. Nothing the controller waits for is a collective.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from tba.ranks import fsdp
from tba.ranks.controller import TrainerRankError
from tba.ranks.rank import STREAMS, RankParts, build, process_group
from tba.runtime.lifetime import Child, Lifeline

POLL_S = 0.2
BEAT_S = 2.0
"""How often a rank says it is alive while it carries out a command (a bound well inside any silence timeout)."""


def free_address(host: str = "127.0.0.1") -> str:
    """A rendezvous address on `host`."""
    with socket.socket() as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


@dataclass
class RankArgs:
    rank: int
    world: int
    address: str
    device: torch.device
    parts: RankParts
    commands: object
    answers: object
    abort: object
    """Raised (1) by the controller when a rank failed: every other rank aborts its process group and exits."""
    controller_pid: int
    items: object
    """The sending end of the pipe rank 0's stream items cross (tba.ranks.local's docstring)."""


def _state(pid: int) -> str:
    """A process's state letter from /proc (R, S, D, T stopped, Z, …; '' when unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _beat(answers, rank: int) -> None:
    """From a daemon thread: a sign of life on the answers queue every BEAT_S, so the controller tells a rank that
    works long (an evaluation) from one that is stopped (a stopped process's threads stop too)."""

    def run():
        while True:
            answers.put(("beat", rank, None, None))
            time.sleep(BEAT_S)

    threading.Thread(target=run, name="tba-rank-beat", daemon=True).start()


def _watch_abort(flag) -> None:
    """From a daemon thread: once the controller raises `flag`, abort the process group and exit. A shared value
    polled, not a multiprocessing Event: an Event's `set` waits for every process that waits on it to wake, and one
    that was killed never does (the controller would hang in the very call that is meant to end the others)."""

    def run():
        while not flag.value:
            time.sleep(POLL_S)
        fsdp.abort()
        os._exit(1)

    threading.Thread(target=run, name="tba-rank-abort", daemon=True).start()


def _rank_main(a: RankArgs) -> None:
    Lifeline(a.controller_pid).watch()  # first: this process ends with the controller, even blocked in a collective
    fsdp.bounded_heap()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_abort(a.abort)
    try:
        torch.set_num_threads(a.parts.threads)
        a.answers.put(("arrived", a.rank, None, None))
        _beat(a.answers, a.rank)
        with process_group(a.rank, a.world, a.address, a.parts.fsdp.collective_timeout_s, a.device):
            trainer = build(a.parts, a.rank, a.world, a.device)
            a.answers.put(("ready", a.rank, None, None))
            while True:
                command, payload = a.commands.get()
                if command == "stop":
                    break
                if command in STREAMS:
                    _send_stream(a, trainer.items(command, payload), command)
                    result = None
                else:
                    result = trainer.run(command, payload)
                a.answers.put(("done", a.rank, command, result))
    except BaseException:
        a.answers.put(("error", a.rank, None, traceback.format_exc()))
        sys.exit(1)


def _send_stream(a: RankArgs, items: Iterator[dict], command: str) -> None:
    """Rank 0's stream: each bucket's names, dtypes and shapes on the answers queue, then each tensor's bytes through
    the pipe, straight from the tensor (no serialized copy). A function of its own so that no bucket outlives its
    send (a loop variable would keep the last one until the next command)."""
    for item in items:
        a.answers.put(("item", a.rank, command, [(k, str(t.dtype).removeprefix("torch."), tuple(t.shape))
                                                  for k, t in item.items()]))
        for t in item.values():
            a.items.send_bytes(_raw(t))  # returns once the controller has read all but the pipe's buffer
        del item
    fsdp.release_freed()


def _raw(t: torch.Tensor):
    """A host tensor's bytes as a writable buffer over its own memory (numpy has no bfloat16: viewed as bytes)."""
    return t.contiguous().view(-1).view(torch.uint8).numpy()


class LocalRanks:
    """The controller's handle on rank processes (a tba.ranks.controller.RankGroup)."""

    where = "processes"

    def __init__(self, parts: RankParts, devices: list[torch.device]):
        ctx = mp.get_context("spawn")
        self.world = len(devices)
        self.timeout_s = parts.fsdp.collective_timeout_s
        address, self.answers, self.abort = free_address(), ctx.Queue(), ctx.RawValue("b", 0)
        self.items, sender = ctx.Pipe(duplex=False)
        self.commands = [ctx.Queue() for _ in range(self.world)]
        self.procs: list[Child] = []
        for r in range(self.world):
            p = ctx.Process(target=_rank_main, name=f"tba-trainer-rank-{r}", daemon=True,
                            args=(RankArgs(r, self.world, address, devices[r], parts, self.commands[r], self.answers,
                                           self.abort, os.getpid(), sender if r == 0 else None),))
            p.start()
            self.procs.append(Child(p))
        sender.close()  # rank 0 holds the only sending end: its death ends the pipe (EOFError), not a hang
        self.seen: dict[int, float] = {}
        self.placement = [{"rank": r, "pid": c.pid, "host": socket.gethostname()} for r, c in enumerate(self.procs)]
        try:
            self._wait("start", "arrived", fsdp.RENDEZVOUS_S, "a rank's start")
            self._wait("start", "ready", fsdp.RENDEZVOUS_S + self.timeout_s, "building the ranks")
        except BaseException:
            self.close()
            raise

    def call(self, command: str, payloads: list, timeout_s: float) -> list:
        return list(self._run(command, payloads, timeout_s, items=False))[-1][1]

    def stream(self, command: str, payloads: list, timeout_s: float) -> Iterator:
        for kind, value in self._run(command, payloads, timeout_s, items=True):
            if kind == "item":
                yield value

    def _run(self, command, payloads, timeout_s, *, items: bool):
        """Send `command`, then read answers until every rank is done. A rank may work as long as it needs — an
        evaluation takes minutes — while it beats: the deadline is on each rank's silence, not the command."""
        self._check_alive(command)
        for q, payload in zip(self.commands, payloads, strict=True):
            q.put((command, payload))
        self.seen = dict.fromkeys(range(self.world), time.monotonic())
        answers: dict[int, object] = {}
        while len(answers) < self.world:
            kind, rank, _, detail = self._get(command, timeout_s)
            if kind == "item":
                try:
                    bucket = {}
                    for name, dtype, shape in detail:
                        bucket[name] = torch.empty(shape, dtype=getattr(torch, dtype))
                        self.items.recv_bytes_into(_raw(bucket[name]))
                except EOFError:  # rank 0 raised or died while sending it: its traceback or exit code follows
                    self._get(command, self.timeout_s)
                    raise self._error(command, "rank 0 closed its stream mid-bucket") from None
                if items:
                    yield "item", bucket
            elif kind == "done":
                answers[rank] = detail
        yield "answers", [answers[r] for r in range(self.world)]

    def _wait(self, command: str, what: str, timeout_s: float, bound: str) -> None:
        pending, deadline = set(range(self.world)), time.monotonic() + timeout_s
        self.seen = dict.fromkeys(range(self.world), time.monotonic())
        while pending:
            kind, rank, _, _ = self._get(command, timeout_s, bound, deadline=deadline)
            if kind == what:
                pending.discard(rank)

    def _get(self, command: str, silence_s: float, bound: str = "trainer.fsdp.collective_timeout_s",
             deadline: float | None = None):
        """The next answer (beats only refresh their rank's last sign of life), raising for an error, a death, a
        rank silent for `silence_s`, or the overall `deadline`."""
        seen = self.seen  # each rank's last sign of life in this command
        while True:
            try:
                kind, rank, c, detail = self.answers.get(timeout=POLL_S)
            except queue.Empty:
                self._check_alive(command)
                now = time.monotonic()
                silent = [r for r, t in seen.items() if now - t > silence_s]
                if silent or (deadline is not None and now > deadline):
                    raise self._error(command, self._culprit() or (
                        f"{', '.join(f'rank {r} (pid {self.procs[r].pid})' for r in silent or range(self.world))} "
                        f"sent nothing for {silence_s:g} s ({bound}): alive but hung")) from None
                continue
            seen[rank] = time.monotonic()
            if kind == "beat":
                continue
            if kind == "error":
                raise self._error(command, self._culprit() or f"rank {rank} raised:\n{detail}")
            return kind, rank, c, detail

    def _culprit(self) -> str | None:
        """A rank that died or is stopped: the others' errors (a collective's timeout) are its consequence."""
        for r, p in enumerate(self.procs):
            if p.exited():
                return f"rank {r} (pid {p.pid}) died (exit code {p.reported_exitcode()})"
        for r, p in enumerate(self.procs):
            if _state(p.pid) in ("T", "t"):
                return (f"rank {r} (pid {p.pid}) is stopped (SIGSTOP, a debugger): the other ranks' collectives "
                        "waited for it")
        return None

    def _check_alive(self, command: str) -> None:
        for r, p in enumerate(self.procs):
            if p.exited():
                try:  # its traceback, if it sent one before dying
                    while True:
                        kind, rank, _, detail = self.answers.get_nowait()
                        if kind == "error" and rank == r:
                            raise self._error(command, f"rank {rank} raised:\n{detail}")
                except queue.Empty:
                    pass
                raise self._error(command, f"rank {r} (pid {p.pid}) died (exit code {p.reported_exitcode()})")

    def _error(self, command: str, why: str) -> TrainerRankError:
        self.abort.value = 1  # the others may be blocked in a collective with the failed rank: release them
        self.close()
        return TrainerRankError(f"{why} (during {command!r}); every rank is stopped. `tba train --resume RUN_DIR` "
                                "continues from the last checkpoint")

    def close(self) -> None:
        for q in self.commands:
            try:
                q.put(("stop", None))
            except (ValueError, OSError):
                pass
        for p in self.procs:
            if not p.wait(5.0):
                p.end()
            p.release()
        self.procs, self.commands = [], []
        self.items.close()
