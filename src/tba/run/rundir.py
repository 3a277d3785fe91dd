"""The run directory: checked writable before anything is built, never silently mixed with another run.

    RUN_DIR/config.yaml            resolved config (what --resume reads back)
    RUN_DIR/buffer.sqlite          the durable replay buffer (tba.algorithm.store): accepted groups, compacted at
                                   checkpoints (buffer.set-aside-N.sqlite: one set aside by --set-aside-buffer)
    RUN_DIR/checkpoints/           full checkpoints (tba.run.checkpoint); `latest` names the newest
    RUN_DIR/metrics.jsonl          one line per trainer step; tensorboard/ (mlflow/, wandb/) the same as scalars
    RUN_DIR/checkpoint/            final policy, save_pretrained (what users load)
    RUN_DIR/summary.json           before/after accuracy and run counters
    RUN_DIR/errors.log             tracebacks of what raised in the user's code (a reward, an environment), when any
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tba.errors import UserError

RUN_FILES = ("buffer.sqlite", "buffer.sqlite-wal", "buffer.sqlite-shm", "checkpoints", "metrics.jsonl",
             "metrics.interrupted.jsonl", "summary.json", "tensorboard", "mlflow", "wandb", "checkpoint", "init",
             "errors.log")
"""What --overwrite removes: the run's files, the report_to backends' stores under it (tensorboard/, mlflow/, wandb/)
among them."""


class RunDirError(UserError, RuntimeError):
    """The output directory cannot be used (unwritable, or it holds another run)."""

    exit_code = 2
    label = ""  # the message starts with the run directory


def holds_run(out: Path) -> bool:
    return (out / "buffer.sqlite").exists() or (out / "checkpoints").exists() or (out / "summary.json").exists()


def prepare(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Create `out` and prove it writable; refuse to start a fresh run over an existing one."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".tba-write-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"output_dir {out}: not writable ({e.strerror or e}); choose another output_dir=") from None
    if resume:
        if not (out / "config.yaml").is_file():
            raise RunDirError(f"--resume {out}: no run there (config.yaml missing)")
        return
    if holds_run(out):
        if not overwrite:
            raise RunDirError(f"output_dir {out} already holds a run. Continue it with `tba train --resume {out}`, "
                              "replace it with --overwrite, or pick another output_dir=")
        for name in RUN_FILES:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()


def set_aside_metrics(out: Path, after_step: int) -> int:
    """On resume: metrics lines logged after the checkpoint move to metrics.interrupted.jsonl (kept, not
    mixed with the resumed run's lines). Returns how many moved."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return 0
    keep, moved = [], []
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line from a kill
        (keep if step <= after_step else moved).append(line)
    if moved:
        with (out / "metrics.interrupted.jsonl").open("a") as f:
            f.write("\n".join(moved) + "\n")
    path.write_text("".join(line + "\n" for line in keep))
    return len(moved)


def set_aside_buffer(out: Path) -> Path | None:
    """Move RUN_DIR/buffer.sqlite (and its WAL files) to buffer.set-aside-N.sqlite, N the first free number, so that
    a run whose buffer cannot be read resumes from its checkpoint (`tba train --resume --set-aside-buffer`).
    Returns the new path (None: there was no buffer)."""
    source = out / "buffer.sqlite"
    if not source.exists():
        return None
    n = 1
    while (out / f"buffer.set-aside-{n}.sqlite").exists():
        n += 1
    target = out / f"buffer.set-aside-{n}.sqlite"
    for suffix in ("", "-wal", "-shm"):
        if (out / f"buffer.sqlite{suffix}").exists():
            (out / f"buffer.sqlite{suffix}").rename(out / f"{target.name}{suffix}")
    return target
