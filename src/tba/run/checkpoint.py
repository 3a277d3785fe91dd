"""Full checkpoints, written atomically, read without unpickling anything.

Layout under `RUN_DIR/checkpoints/`:

    step_0000050/model/            policy + tokenizer, save_pretrained (safetensors)
    step_0000050/reference/        TBA′ only: the trainer's (periodically reset) reference
    step_0000050/tensors.safetensors   optimizer moments and step counters (one trainer process), or
    step_0000050/optimizer/        the same, sharded: each rank's part (torch.distributed.checkpoint, trainer.world_size
                                   > 1; resharded when a run resumes at another world size, one process included)
    step_0000050/state.json        step, version, optimizer hyperparameters, Python/NumPy/torch RNG states
                                   (+ the CUDA generators' where CUDA is in use),
                                   replay-buffer sampling state, searcher prompt cursors (+ their RNG),
                                   loop counters (evals so far, rewards seen, timings)
    latest                         name of the newest complete checkpoint

Atomicity: everything is written into `step_N.tmp/`, fsynced, then the directory is renamed to `step_N`
and `latest` is replaced by rename — a crash at any point leaves the previous checkpoint as `latest`.
Reading never unpickles: tensors come from safetensors, everything else from JSON. The LR and β
schedules are pure functions of the step, so the step is their whole state.

Resuming (`latest`) takes the newest *usable* checkpoint, not just the newest complete one: every safetensors
file it holds (model/, reference/, tensors.safetensors) must be as long as its header says (a cheap check of
the header and the file size, no tensor is read) and model/config.json must parse. A damaged newest checkpoint
(a truncated file, say) is skipped with a warning naming the file and the checkpoint used instead; when no
complete checkpoint is usable, CheckpointError names every bad file.

CUDA RNG states are saved only where CUDA is already initialized (saving never initialises it) and restored
only on as many devices as they were saved from (otherwise a warning, and the generators stay as they are).

state.json records FORMAT_VERSION; a checkpoint of another format is refused with one error that says what to do
(tba keeps no migrations).
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tba.algorithm.seeding import rng_state
from tba.errors import UserError

logger = logging.getLogger(__name__)

STATE = "state.json"
FORMAT_VERSION = 1
"""The checkpoint layout's version, written into every state.json; bump it whenever what a checkpoint holds changes."""
TENSORS = "tensors.safetensors"
SHARDED = "optimizer"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint cannot be written (disk full, unwritable) or read (missing, incomplete)."""


def _optimizer_tensors(optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    sd = optimizer.state_dict()
    tensors = {f"optim.{i}.{name}": v.contiguous() for i, st in sd["state"].items() for name, v in st.items()
               if isinstance(v, torch.Tensor)}
    groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, groups


def _optimizer_state(path: Path, groups: list[dict]) -> dict:
    """torch's optimizer state dict from `path`'s safetensors; `groups` are the hyperparameters from its state.json."""
    try:
        tensors = load_file(str(path / TENSORS))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from None
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, i, name = key.split(".", 2)
            state.setdefault(int(i), {})[name] = value
    return {"state": state, "param_groups": groups}


def load_optimizer(path: Path, optimizer, groups: list[dict]) -> None:
    """Optimizer moments from `path`'s safetensors; `groups` are the hyperparameters from its state.json."""
    optimizer.load_state_dict(_optimizer_state(path, groups))


def restore_trainer(trainer, path: Path, state: dict) -> None:
    """Continue `trainer` from checkpoint `path`: optimizer moments, counters, and the π_ref an objective keeps
    itself (TBA′). The policy weights were loaded with the model (a sharded trainer's ranks loaded both from `path`
    as they started); LR and β are functions of the step. A checkpoint of either kind resumes either kind."""
    version, skipped = state["version"], state["skipped_steps"]
    if trainer.sharded:
        one_process = None if (path / SHARDED).is_dir() else functools.partial(
            _optimizer_state, path, state["optimizer_param_groups"])  # read by rank 0, in its own process
        trainer.load(path / SHARDED if one_process is None else None, one_process, version=version, skipped=skipped)
        return
    if (path / SHARDED).is_dir():
        from tba.ranks.fsdp import load_optimizer as load_sharded

        load_sharded(trainer.model, trainer.optimizer, path / SHARDED)
    else:
        load_optimizer(path, trainer.optimizer, state["optimizer_param_groups"])
    trainer.version, trainer.skipped_steps = version, skipped
    if trainer.reference is not None and (path / "reference").is_dir():
        from tba.models import load_model

        trainer.reference.model.load_state_dict(load_model(str(path / "reference")).state_dict())


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
         keep: int = 2, sharded=None) -> Path:
    """Write checkpoint `step` atomically and prune to the newest `keep`. `sharded`: a sharded trainer
    (tba.ranks.controller.ShardedTrainer; `policy`, `optimizer`, `reference` are then None), whose ranks write
    model/ from their master weights, reference/ and their parts of optimizer/ into the same temporary directory.
    Raises CheckpointError."""
    root = Path(run_dir) / "checkpoints"
    final, tmp = root / f"step_{step:07d}", root / f"step_{step:07d}.tmp"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if sharded is not None:
            groups = sharded.save(tmp)
        else:
            policy.save_pretrained(tmp / "model", safe_serialization=True)
            if reference is not None:
                reference.save_pretrained(tmp / "reference", safe_serialization=True)
            tensors, groups = _optimizer_tensors(optimizer)
            save_file(tensors, str(tmp / TENSORS))
        tokenizer.save_pretrained(tmp / "model")
        payload = {**state, "format_version": FORMAT_VERSION, "step": step, "optimizer_param_groups": groups,
                   "rng": rng_state(), "complete": True}
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
        try:
            previous = latest(run_dir, quiet=True)
        except CheckpointError:
            previous = None
        why = "disk full" if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else "cannot write"
        raise CheckpointError(
            f"{why}: checkpoint of step {step} to {final} failed ({e}); the last good checkpoint "
            f"({previous if previous else 'none'}) is intact and `tba train --resume {run_dir}` continues "
            "from it once there is space") from None
    for old in sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


@dataclass
class Checkpointer:
    """A run's checkpoints: where they go, the tokenizer each one saves, how many are kept. The loop hands it the
    trainer and its own JSON state at every checkpoint."""

    run_dir: Path
    tokenizer: object
    keep: int

    def save(self, step: int, *, trainer, state: dict) -> Path:
        if trainer.sharded:
            return save(self.run_dir, step=step, policy=None, tokenizer=self.tokenizer, optimizer=None, state=state,
                        keep=self.keep, sharded=trainer)
        reference = trainer.reference.model if trainer.reference is not None else None  # TBA′'s
        return save(self.run_dir, step=step, policy=trainer.model, tokenizer=self.tokenizer,
                    optimizer=trainer.optimizer, state=state, reference=reference, keep=self.keep)

    def buffer_marks(self) -> list[int]:
        return buffer_marks(self.run_dir)


def latest(run_dir: Path, quiet: bool = False) -> Path | None:
    """Newest usable checkpoint: the one `latest` names, else the highest step, as long as it is complete
    and its files are intact (`problems`); a damaged one is passed over for the next, with a logged warning
    (`quiet`: none). None if there is no complete checkpoint at all; CheckpointError naming every bad file if there
    are complete ones but none is usable."""
    root = Path(run_dir) / "checkpoints"
    done = [p for p in sorted(root.glob("step_*"), reverse=True) if not p.name.endswith(".tmp") and _complete(p)]
    named = root / "latest"
    if named.is_file():
        name = named.read_text().strip()
        done.sort(key=lambda p: p.name != name)  # stable: the named one first, then newest to oldest
    bad: list[tuple[Path, list[str]]] = []
    for path in done:
        found = problems(path)
        if not found:
            if bad:
                skipped = "; ".join(f"{p.name} ({', '.join(f)})" for p, f in bad)
                msg = f"unusable checkpoint(s) skipped: {skipped}; using {path} instead"
                if not quiet:
                    logger.warning(msg)
            return path
        bad.append((path, found))
    if bad:
        raise CheckpointError(f"no usable checkpoint in {root}: " + "; ".join(
            f"{p.name}: {', '.join(f)}" for p, f in bad) + f". Nothing to resume {run_dir} from; start it over "
            "with `--overwrite`")
    return None


def buffer_marks(run_dir: Path) -> list[int]:
    """The replay-buffer position (groups accepted) of every complete checkpoint on disk: the positions
    buffer compaction must keep restorable. A checkpoint whose state cannot be read could not resume anyway."""
    marks = []
    for path in (Path(run_dir) / "checkpoints").glob("step_*"):
        try:
            state = json.loads((path / STATE).read_text()) if not path.name.endswith(".tmp") else {}
        except (OSError, ValueError):
            continue
        if state.get("complete") and "buffer" in state:
            marks.append(state["buffer"]["groups_added"])
    return marks


def _complete(path: Path) -> bool:
    try:
        return json.loads((path / STATE).read_text()).get("complete", False) and (
            (path / TENSORS).is_file() or (path / SHARDED / ".metadata").is_file())
    except (OSError, ValueError):
        return False


def problems(path: Path) -> list[str]:
    """What makes checkpoint `path` unusable, one "FILE: why" per bad file (empty: usable). Cheap: parses
    JSON and safetensors headers and compares file sizes, reads no tensor."""
    found = []
    for sub in ("model", "reference"):
        d = path / sub
        if sub == "reference" and not d.is_dir():
            continue
        config = d / ("adapter_config.json" if (d / "adapter_config.json").is_file() else "config.json")  # LoRA
        try:
            json.loads(config.read_text())
        except (OSError, ValueError) as e:
            found.append(f"{config}: {_why(e)}")
        index = d / "model.safetensors.index.json"
        if index.is_file():
            try:
                shards = set(json.loads(index.read_text())["weight_map"].values())
                found += [f"{d / s}: missing (listed in {index.name})" for s in sorted(shards) if not (d / s).is_file()]
            except (OSError, ValueError, KeyError, AttributeError) as e:
                found.append(f"{index}: {_why(e)}")
        weights = sorted(d.glob("*.safetensors"))
        if not weights and not index.is_file():
            found.append(f"{d}: no *.safetensors weights")
        found += [f"{f}: {why}" for f in weights if (why := safetensors_problem(f))]
    if (path / SHARDED).is_dir():
        if not (path / SHARDED / ".metadata").is_file():
            found.append(f"{path / SHARDED / '.metadata'}: missing")
    elif why := safetensors_problem(path / TENSORS):
        found.append(f"{path / TENSORS}: {why}")
    return found


def _why(e: Exception) -> str:
    if isinstance(e, FileNotFoundError):
        return "missing"
    return f"unreadable ({e})" if isinstance(e, OSError) else f"corrupt ({type(e).__name__}: {e})"


def safetensors_problem(file: Path) -> str | None:
    """Why the safetensors `file` is damaged, or None: its header (8-byte little-endian length, then JSON)
    must parse and the file must end exactly where the header's largest data offset says."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"truncated ({size} bytes, no header)"
            n = int.from_bytes(head, "little")
            if n > size - 8:
                return f"truncated ({size} bytes, the header alone needs {8 + n})"
            header = json.loads(f.read(n))
    except OSError as e:
        return _why(e)
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return f"corrupt header ({e})"
    if not isinstance(header, dict):
        return "corrupt header (not a JSON object)"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            _, stop = info["data_offsets"]
            end = max(end, int(stop))
        except (TypeError, KeyError, ValueError):
            return f"corrupt header (tensor {name!r} has no data_offsets)"
    expected = 8 + n + end
    if size != expected:
        return f"{'truncated' if size < expected else 'too long'} ({size} bytes, the header says {expected})"
    return None


def load(path: Path, *, optimizer=None) -> dict:
    """Return checkpoint `path`'s state (the JSON part), loading `optimizer` too if given.

    The policy weights live in `path/model` (a save_pretrained directory); they are loaded by the caller
    through the normal model loader. RNG states are returned, not applied (see `set_rng_state`).
    """
    try:
        state = json.loads((path / STATE).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from None
    if (found := state.get("format_version", 0)) != FORMAT_VERSION:
        run = path.parent.parent
        raise CheckpointError(f"checkpoint {path} is of format {found}; this tba reads format {FORMAT_VERSION}. "
                              f"Start the run over (`tba train --overwrite`, or another output_dir), export its policy "
                              f"with the tba version that wrote it, or train from its weights: "
                              f"model.policy={path / 'model'}" + (f" (run {run})" if run.name else ""))
    if optimizer is not None:
        load_optimizer(path, optimizer, state["optimizer_param_groups"])
    return state
