"""Full checkpoints, written atomically, read without unpickling anything.

Layout under `RUN_DIR/checkpoints/`:

    step_0000050/model/            policy + tokenizer, save_pretrained (safetensors)
    step_0000050/reference/        TBA′ only: the trainer's (periodically reset) reference
    step_0000050/tensors.safetensors   optimizer moments and step counters
    step_0000050/state.json        step, version, optimizer hyperparameters, Python/NumPy/torch RNG states,
                                   replay-buffer sampling state, searcher prompt cursors (+ their RNG),
                                   loop counters (evals so far, rewards seen, timings)
    latest                         name of the newest complete checkpoint

Atomicity: everything is written into `step_N.tmp/`, fsynced, then the directory is renamed to `step_N`
and `latest` is replaced by rename — a crash at any point leaves the previous checkpoint as `latest`.
Reading never unpickles: tensors come from safetensors, everything else from JSON. The LR and β
schedules are pure functions of the step, so the step is their whole state.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

STATE = "state.json"
TENSORS = "tensors.safetensors"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written (disk full, unwritable) or read (missing, incomplete)."""


def encode_bytes(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def decode_bytes(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def rng_state() -> dict:
    """This process's Python, NumPy and torch RNG states (JSON-able)."""
    np_state, (version, internal, gauss) = np.random.get_state(), random.getstate()
    return {"python": [version, list(internal), gauss],
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
            "torch": encode_bytes(torch.get_rng_state())}


def set_rng_state(state: dict) -> None:
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(decode_bytes(state["torch"]))


def _optimizer_tensors(optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    sd = optimizer.state_dict()
    tensors = {f"optim.{i}.{name}": v.contiguous() for i, st in sd["state"].items() for name, v in st.items()
               if isinstance(v, torch.Tensor)}
    groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, groups


def load_optimizer(path: Path, optimizer, groups: list[dict]) -> None:
    """Optimizer moments from `path`'s safetensors; `groups` are the hyperparameters from its state.json."""
    try:
        tensors = load_file(str(path / TENSORS))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from None
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, i, name = key.split(".", 2)
            state.setdefault(int(i), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with p.open("rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(run_dir: Path, *, step: int, policy, tokenizer, optimizer, state: dict, reference=None,
         keep: int = 2) -> Path:
    """Write checkpoint `step` atomically and prune to the newest `keep`. Raises CheckpointError."""
    root = Path(run_dir) / "checkpoints"
    final, tmp = root / f"step_{step:07d}", root / f"step_{step:07d}.tmp"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        policy.save_pretrained(tmp / "model", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "model")
        if reference is not None:
            reference.save_pretrained(tmp / "reference", safe_serialization=True)
        tensors, groups = _optimizer_tensors(optimizer)
        save_file(tensors, str(tmp / TENSORS))
        payload = {**state, "step": step, "optimizer_param_groups": groups, "rng": rng_state(), "complete": True}
        (tmp / STATE).write_text(json.dumps(payload))
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest_tmp = root / "latest.tmp"
        latest_tmp.write_text(final.name)
        with latest_tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(latest_tmp, root / "latest")
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        previous = latest(run_dir)
        why = "disk full" if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else "cannot write"
        raise CheckpointError(
            f"{why}: checkpoint of step {step} to {final} failed ({e}); the last good checkpoint "
            f"({previous if previous else 'none'}) is intact and `tba train --resume {run_dir}` continues "
            "from it once there is space") from None
    for old in sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    """Newest complete checkpoint: the one `latest` names, else the highest step with a complete state."""
    root = Path(run_dir) / "checkpoints"
    named = root / "latest"
    if named.is_file():
        candidate = root / named.read_text().strip()
        if _complete(candidate):
            return candidate
    done = [p for p in sorted(root.glob("step_*")) if not p.name.endswith(".tmp") and _complete(p)]
    return done[-1] if done else None


def _complete(path: Path) -> bool:
    try:
        return json.loads((path / STATE).read_text()).get("complete", False) and (path / TENSORS).is_file()
    except (OSError, ValueError):
        return False


def load(path: Path, *, optimizer=None) -> dict:
    """Return checkpoint `path`'s state (the JSON part), loading `optimizer` too if given.

    The policy weights live in `path/model` (a save_pretrained directory); they are loaded by the caller
    through the normal model loader. RNG states are returned, not applied (see `set_rng_state`).
    """
    try:
        state = json.loads((path / STATE).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from None
    if optimizer is not None:
        load_optimizer(path, optimizer, state["optimizer_param_groups"])
    return state
