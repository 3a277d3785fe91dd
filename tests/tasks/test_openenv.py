"""The openenv task (tba.tasks.openenv) against a small OpenEnv environment served by openenv's own create_app: the
action's field from /schema, episodes reset by seed, per-step rewards summed, `done` respected, a hanging step timed
out by name, the local server gone with its parent, and a short `tba train` on it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="openenv-core not installed (tba[openenv])")

from openenv_guess import secret  # noqa: E402

from tba.cli import main  # noqa: E402
from tba.errors import ConfigError  # noqa: E402
from tba.models import save_checkpoint  # noqa: E402
from tba.rollout.episodes import Limits, replay_episodes  # noqa: E402
from tba.tasks.openenv import LocalServer, OpenEnvTask, fields  # noqa: E402

GUESS = f"{Path(__file__).resolve().parent / 'openenv_guess.py'}:GuessEnv"
"""The environment, beside this file: the served app's process imports it (and not this file's torch)."""


class Tokenizer:
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i)


@pytest.fixture(scope="module")
def server():
    s = LocalServer(GUESS, max_sessions=16, startup_timeout_s=60)
    yield s
    s.close()


def play(task, prompt, guesses, max_turns=4):
    tok = Tokenizer()
    (e,) = replay_episodes(tok, task, [prompt], [tok(prompt.text)["input_ids"]],
                           [[tok(g)["input_ids"] + [0] for g in guesses]], max_new_tokens=16,
                           limits=Limits(max_turns=max_turns, max_tokens=400, timeout_s=10.0))
    return e


def test_episodes_by_seed_rewards_summed_and_done_respected(server):
    task = OpenEnvTask(url=server.url, episodes=3, test_episodes=2, seed=10, prompt="Play. {observation}")
    assert (task.action_field, task.observation_field) == ("guess", "feedback")  # from /schema
    assert [p.meta["seed"] for p in task.train + task.test] == [10, 11, 12, 13, 14]
    assert task.train[0].text == "Play. Guess a number 0-7." and [p.id for p in task.test] == [0, 1]
    p = task.train[1]
    s = secret(11)
    wrong = [str(g) for g in range(8) if g != s]
    e = play(task, p, [wrong[0], wrong[1], str(s)])
    assert (e.end, e.turns) == ("done", 3) and e.reward == pytest.approx(-0.2 + 1.0)  # summed; done ends it
    env_text = Tokenizer().decode([t for t, m in zip(e.tokens, e.mask, strict=True) if not m])
    assert env_text == "".join(f"\n{'+' if int(g) < s else '-'}\n" for g in wrong[:2])
    cut = play(task, p, wrong[:2], max_turns=2)  # the turn limit: the rewards so far
    assert (cut.end, cut.reward) == ("max_turns", pytest.approx(-0.2))
    assert task.episode_metrics([e, cut]) == {"openenv/done_share": 0.5, "openenv/steps_mean": 2.5}


def test_a_hanging_step_times_out_naming_the_step(server):
    task = OpenEnvTask(url=server.url, episodes=1, test_episodes=1, step_timeout_s=0.5)
    t0 = time.monotonic()
    e = play(task, task.train[0], ["9", "hang"])
    assert time.monotonic() - t0 < 5
    assert e.end == "timeout" and e.reward is None
    assert ("OpenEnv step 2 of the episode of seed 0 did not answer within 0.5 s" in e.error.splitlines()[0])


def test_the_action_field_comes_from_the_schema_or_is_asked_for():
    schema = {"action": {"properties": {"metadata": {}, "text": {"type": "string"}, "n": {"type": "integer"}}},
              "observation": {"properties": {"done": {}, "reward": {}, "board": {"type": "array"}}}}
    assert fields(schema, None, None) == ("text", None)  # no string observation field: JSON
    two = {"action": {"properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "required": ["a", "b"]}}
    with pytest.raises(ConfigError, match="name the one the policy's text fills"):
        fields(two, None, None)
    assert fields(two, "b", None)[0] == "b"
    with pytest.raises(ConfigError, match="'c' is not in the action schema"):
        fields(two, "c", None)
    with pytest.raises(ConfigError, match="url= .* or app="):
        OpenEnvTask()


def test_a_served_app_stops_with_its_parent_even_when_the_parent_is_killed(tmp_path):
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[2] / 'src')!r})\n"
            "from tba.tasks.openenv import LocalServer\n"
            f"s = LocalServer({GUESS!r}, 4, 60)\n"
            "print(s.proc.pid, flush=True)\n"
            "import time; time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


QUICK = ["trainer.steps=3", "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2",
         "trainer.micro_batch_prompts=2", "search.prompts_per_batch=2", "search.generations_per_prompt=2",
         "search.max_new_tokens=2", "search.max_turns=3", "eval.max_new_tokens=2", "buffer.prefill_samples=4",
         "eval.every_steps=3", "logging.progress=false", "logging.tensorboard=false", "runtime=inline", "mode=sync",
         "sft.enabled=false"]


def test_tba_train_on_a_served_openenv_environment(tmp_path, tiny_model, tiny_tokenizer):
    model = tmp_path / "tiny"
    save_checkpoint(tiny_model, tiny_tokenizer, model)
    out = tmp_path / "run"
    code = main(["train", f"output_dir={out}", f"model.policy={model}", "task.name=openenv",
                 f"task.options.app={GUESS}", "task.options.episodes=8", "task.options.test_episodes=4",
                 "task.options.prompt=Guess from the feedback. {observation}", *QUICK])
    assert code == 0
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_steps"] == 3 and "openenv/steps_mean" in summary["eval_end"]
    assert summary["eval_end"]["openenv/steps_mean"] >= 1
