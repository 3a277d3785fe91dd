"""Crash-proof runs end to end: kill -9 the trainer and resume, exact inline resume, offline training on a saved
buffer, and the run directory's guards (tiny model, the real CLI)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from paths import TINY as TINY_RECIPE
from procs import alive, descendants
from safetensors.torch import load_file

from tba.algorithm.store import BufferStore
from tba.cli import main

# the tiny recipe first, then this file's overrides
TINY = [TINY_RECIPE, "task.options.digits=1", "eval.every_steps=1000",
        "search.max_new_tokens=16", "trainer.sync_every_steps=1", "trainer.lr=1e-3"]
INLINE = ["runtime=inline", "mode=sync", "threads=1"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sft-cache")


def tba(out, cache, *extra):
    return main(["train", *TINY, f"output_dir={out}", f"sft.cache_dir={cache}", *extra])


def steps_logged(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def losses(out: Path) -> dict[int, float]:
    return {m["step"]: m["trainer/loss"] for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.slow
def test_kill_9_trainer_mid_run_then_resume_continues_and_keeps_every_buffered_group(tmp_path, cache, capsys):
    out = tmp_path / "run"
    assert tba(tmp_path / "warm", cache, *INLINE, "trainer.steps=1") == 0  # SFT cached outside the timed part
    args = [sys.executable, "-m", "tba", "train", *TINY, f"output_dir={out}", f"sft.cache_dir={cache}",
            "runtime=local", "trainer.steps=80", "checkpoint.every_steps=10"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "TBA_TEST_CHILD": "1"})
    deadline = time.monotonic() + 240
    ckpt_step = None
    while time.monotonic() < deadline and proc.poll() is None:
        latest = out / "checkpoints" / "latest"
        if latest.is_file():
            ckpt_step = int(latest.read_text().strip().split("_")[1])
            logged = steps_logged(out) if (out / "metrics.jsonl").is_file() else []
            if ckpt_step >= 20 and logged and logged[-1] >= ckpt_step + 2:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    searchers = descendants(proc.pid)  # searchers, and the fork server they came from
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpt_step = int((out / "checkpoints" / "latest").read_text().strip().split("_")[1])
    groups_before = BufferStore(out, readonly=True).num_groups()
    assert groups_before > 0 and steps_logged(out)[-1] > ckpt_step  # steps after the checkpoint were lost …
    for _ in range(100):  # … and the orphaned searcher notices and exits by itself
        if not any(alive(p) for p in searchers):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"searchers {searchers} outlived the killed trainer")

    assert main(["train", "--resume", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"resuming {out} from step_{ckpt_step:07d} (step {ckpt_step})" in err
    assert f"buffer restored: {groups_before} groups" in err  # every group accepted before the kill
    assert steps_logged(out) == list(range(1, 81))  # steps continue from the checkpoint, each logged once
    assert (out / "metrics.interrupted.jsonl").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 80 and summary["resumed_at_steps"] == [ckpt_step]
    assert summary["buffer_groups"] > groups_before
    assert BufferStore(out, readonly=True).num_groups() == summary["buffer_groups"]


@pytest.mark.slow
def test_inline_resume_is_bit_exact(tmp_path, cache):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert tba(straight, cache, *INLINE, "trainer.steps=12", "checkpoint.every_steps=6") == 0
    assert tba(split, cache, *INLINE, "trainer.steps=6") == 0
    assert main(["train", "--resume", str(split), "trainer.steps=12"]) == 0
    assert losses(split) == losses(straight)  # every step's loss, including those after the resume
    a, b = (load_file(str(d / "checkpoint" / "model.safetensors")) for d in (straight, split))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert main(["train", "--resume", str(split), "trainer.steps=12"]) == 0  # already finished: a no-op


@pytest.mark.slow
def test_offline_mode_trains_on_a_saved_buffer_without_searchers(tmp_path, cache, capsys):
    source = tmp_path / "source"
    assert tba(source, cache, *INLINE, "trainer.steps=4") == 0
    groups = BufferStore(source, readonly=True).num_groups()
    out = tmp_path / "offline"
    assert tba(out, cache, "runtime=offline", f"buffer.source={source}", "trainer.steps=6") == 0
    assert f"offline: {groups} groups" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 6 and summary["samples_received"] == 0 and summary["searchers"] == []
    assert BufferStore(source, readonly=True).num_groups() == groups  # the source is only read

    assert main(["buffer", "stats", str(source)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["groups"] == groups and stats["samples"] >= groups and stats["version_max"] >= 3
    assert main(["buffer", "dump", str(source), "--limit", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["seq"] for r in rows] == [1, 2] and "text" in rows[0]["samples"][0] and "prompt" in rows[0]
    assert main(["buffer", "stats", str(tmp_path / "nothing")]) == 1
    assert "no replay buffer at" in capsys.readouterr().err


def test_run_directory_guards(tmp_path, cache, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "summary.json").write_text("{}")
    assert tba(tmp_path / "taken", cache, *INLINE) == 2
    assert "already holds a run. Continue it with `tba train --resume" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")
    assert tba(tmp_path / "a-file" / "run", cache, *INLINE) == 2
    assert "not writable" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nowhere")]) == 2
    assert "no run there" in capsys.readouterr().err
    assert tba(tmp_path / "x", cache, "runtime=offline") == 2
    assert "buffer.source: runtime=offline" in capsys.readouterr().err


@pytest.mark.slow
def test_overwrite_replaces_a_previous_run(tmp_path, cache):
    out = tmp_path / "run"
    assert tba(out, cache, *INLINE, "trainer.steps=2") == 0
    assert main(["train", *TINY, f"output_dir={out}", f"sft.cache_dir={cache}", *INLINE, "trainer.steps=3",
                 "--overwrite"]) == 0
    assert steps_logged(out) == [1, 2, 3] and json.loads((out / "summary.json").read_text())["resumed_at_steps"] == []


def test_resume_skips_a_truncated_newest_checkpoint_and_names_the_bad_files(tmp_path, cache, capsys):
    import warnings

    out = tmp_path / "run"
    assert tba(out, cache, *INLINE, "trainer.steps=2", "checkpoint.every_steps=1") == 0
    root = out / "checkpoints"
    assert (root / "latest").read_text().strip() == "step_0000002" and (root / "step_0000001").is_dir()
    bad = root / "step_0000002" / "model" / "model.safetensors"
    bad.write_bytes(bad.read_bytes()[:1000])
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:  # the loop may report it through its log or warn
        warnings.simplefilter("always")
        assert main(["train", "--resume", str(out), "trainer.steps=3"]) == 0
    err = capsys.readouterr().err + "".join(str(w.message) for w in caught)
    assert f"{bad}: truncated" in err and f"resuming {out} from step_0000001 (step 1)" in err
    assert steps_logged(out) == [1, 2, 3]

    for step in (1, 2, 3):  # every checkpoint damaged: the CLI names the files instead of a traceback
        model = root / f"step_{step:07d}" / "model" / "model.safetensors"
        if model.is_file():
            model.write_bytes(model.read_bytes()[:1000])
    assert main(["train", "--resume", str(out), "trainer.steps=4"]) == 1
    err = capsys.readouterr().err
    assert f"tba: CheckpointError: no usable checkpoint in {root}" in err and "Traceback" not in err
    assert all(f"{root / f'step_{s:07d}' / 'model' / 'model.safetensors'}: truncated" in err for s in (2, 3))


@pytest.mark.slow
def test_a_corrupt_buffer_is_set_aside_on_request_and_the_run_resumes_from_its_checkpoint(tmp_path, cache, capsys):
    """A damaged buffer.sqlite stops `--resume` with one line naming the way out; with --set-aside-buffer the file is
    moved aside, the groups still readable are kept, and the run continues from its checkpoint to the end."""
    out = tmp_path / "run"
    assert tba(out, cache, *INLINE, "trainer.steps=4", "checkpoint.every_steps=2") == 0
    db = out / "buffer.sqlite"
    for wal in out.glob("buffer.sqlite-*"):
        wal.unlink()
    data = bytearray(db.read_bytes())
    data[len(data) // 2:] = b"\xff" * (len(data) - len(data) // 2)  # half the pages garbage
    db.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "trainer.steps=6"]) == 1
    err = capsys.readouterr().err
    assert "cannot be read" in err and f"tba train --resume {out} --set-aside-buffer" in err and "Traceback" not in err
    assert main(["train", "--resume", str(out), "--set-aside-buffer", "trainer.steps=6"]) == 0
    assert "replay buffer set aside as" in capsys.readouterr().err
    assert (out / "buffer.set-aside-1.sqlite").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 6 and summary["resumed_at_steps"] == [4]
