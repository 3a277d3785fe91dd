"""A trainer of two ranks end to end (trainer.world_size=2, FSDP2 over gloo, the real CLI): killed between
checkpoints it resumes at two ranks and at one with the next update unchanged; a rank that dies or stops answering
ends the run with an error naming it, within the collective timeout, and leaves no process behind."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import TINY as TINY_RECIPE
from procs import alive, cmdline, descendants
from runs import needs_ray, ray_processes

from tba.cli import main

TINY = [TINY_RECIPE, "task.options.digits=1", "eval.every_steps=1000", "search.max_new_tokens=16", "trainer.lr=1e-3",
        "trainer.prompts_per_step=4", "trainer.micro_batch_prompts=1"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved buffer (a short inline run) that two-rank runs train on offline: no searcher, so every draw and
    update is a function of the seed alone."""
    root = tmp_path_factory.mktemp("sharded")
    source = root / "source"
    assert main(["train", *TINY, f"output_dir={source}", f"sft.cache_dir={root / 'cache'}", "runtime=inline",
                 "mode=sync", "trainer.steps=3"]) == 0
    return root, source


def offline(saved, out, *extra) -> list[str]:
    root, source = saved
    return ["train", *TINY, f"output_dir={out}", f"sft.cache_dir={root / 'cache'}", "runtime=offline",
            f"buffer.source={source}", "trainer.world_size=2", *extra]


def losses(out: Path) -> dict[int, float]:
    return {m["step"]: m["trainer/loss"] for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def launch(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tba", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TBA_TEST_CHILD": "1"})


def ranks_of(proc: subprocess.Popen, timeout_s: float = 120) -> list[int]:
    """The pids of the run's two trainer rank processes (spawned children of the controller)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(p for p in descendants(proc.pid) if "multiprocessing.spawn" in cmdline(p))
        if len(found) >= 2:
            return found
        time.sleep(0.05)
    raise AssertionError("the trainer's two rank processes did not appear")


def wait_for_step(out: Path, step: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "metrics.jsonl").is_file() and len((out / "metrics.jsonl").read_text().splitlines()) >= step:
            return
        time.sleep(0.02)
    if proc.poll() is not None:
        err = proc.stderr.read()[-3000:]
        raise AssertionError(f"the run ended (exit {proc.returncode}) before step {step}:\n{err}")
    raise AssertionError(f"the run did not reach step {step}")


@pytest.mark.slow
def test_a_killed_two_rank_run_resumes_at_two_ranks_and_at_one_and_the_next_update_is_unchanged(saved, tmp_path):
    straight = tmp_path / "straight"
    assert main(offline(saved, straight, "trainer.steps=8")) == 0
    killed = tmp_path / "killed"
    proc = launch(offline(saved, killed, "trainer.steps=400", "checkpoint.every_steps=4"))
    ranks = ranks_of(proc)
    wait_for_step(killed, 6, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while any(alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in ranks), "a trainer rank outlived the killed controller"
    ckpt = int((killed / "checkpoints" / "latest").read_text().split("_")[1])
    assert ckpt % 4 == 0 and max(losses(killed)) > ckpt  # updates after the checkpoint were lost
    assert main(["export", str(killed), str(tmp_path / "exported")]) == 0  # from the sharded checkpoint's model/
    for world in (2, 1):
        out = tmp_path / f"resumed{world}"
        shutil.copytree(killed, out)
        assert main(["train", "--resume", str(out), f"trainer.world_size={world}", f"trainer.steps={ckpt + 2}"]) == 0
        assert losses(out)[ckpt + 1] == pytest.approx(losses(straight)[ckpt + 1], rel=1e-5)
        assert losses(out)[ckpt + 2] == pytest.approx(losses(straight)[ckpt + 2], rel=1e-5)


def _ends_naming(proc: subprocess.Popen, ranks: list[int], victim: int, bound_s: float) -> str:
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the run did not end within {bound_s} s") from None
    took = time.monotonic() - t0
    assert proc.returncode != 0
    assert "trainer rank failed" in err and f"pid {victim})" in err and "tba train --resume" in err, err[-2000:]
    deadline = time.monotonic() + 10
    while any(alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in ranks), "a trainer rank was left behind"
    return f"{took:.1f} s"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_rank_that_dies_or_stops_answering_ends_the_run_naming_it(saved, tmp_path, how):
    out = tmp_path / how
    proc = launch(offline(saved, out, "trainer.steps=100000", "trainer.fsdp.collective_timeout_s=5",
                          "checkpoint.every_steps=1000"))
    ranks = ranks_of(proc)
    wait_for_step(out, 3, proc)
    os.kill(ranks[-1], signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    _ends_naming(proc, ranks, ranks[-1], bound_s=60)


@pytest.mark.slow
def test_a_one_process_checkpoint_resumes_at_two_ranks_with_the_next_updates_unchanged(saved, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(offline(saved, straight, "trainer.world_size=1", "trainer.steps=6")) == 0
    assert main(offline(saved, split, "trainer.world_size=1", "trainer.steps=4")) == 0
    assert main(["train", "--resume", str(split), "trainer.world_size=2", "trainer.steps=6"]) == 0
    assert losses(split)[5] == pytest.approx(losses(straight)[5], rel=1e-5)
    assert losses(split)[6] == pytest.approx(losses(straight)[6], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["shared", "broadcast"])
def test_searchers_load_the_weights_two_ranks_publish(saved, tmp_path, transport):
    """Publication gathers on the trainer's group before rank 0 sends on the transport's own (broadcast: a second
    gloo group): the run ends, and the searchers sampled the versions it published."""
    root, _ = saved
    versions = {}
    for world in (1, 2):
        out = tmp_path / f"{transport}{world}"
        assert main(["train", *TINY, f"output_dir={out}", f"sft.cache_dir={root / 'cache'}", "runtime=local",
                     "mode=sync", f"trainer.world_size={world}", "trainer.steps=4",
                     f"search.weight_transport={transport}", "supervision.collect_timeout_s=120"]) == 0
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        versions[world] = [m["searcher/version_min"] for m in metrics]
        assert metrics[-1]["sync/searcher_loads"] >= 2
    assert versions[2] == versions[1] and versions[2][-1] >= 2, versions  # as one process publishes them


@needs_ray
@pytest.mark.slow
def test_on_ray_the_other_rank_is_an_actor_of_a_placement_group(saved, tmp_path, capsys):
    root, _ = saved
    out = tmp_path / "ray"
    assert main(["train", *TINY, f"output_dir={out}", f"sft.cache_dir={root / 'cache'}", "runtime=ray", "mode=sync",
                 "trainer.world_size=2", "trainer.steps=3"]) == 0
    assert "2 ranks (cpu, cpu; Ray actors), FSDP2" in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["trainer_steps"] == 3
    assert not ray_processes()
