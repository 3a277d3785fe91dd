"""The loop's order of operations, with a scripted stub runtime, trainer and evaluation (no model at all).

What is checked: groups are in the buffer (and on disk) before they can be drawn; weights are published
every k updates with the trainer's version and a new recency window starts there; checkpoints are written
on schedule and at the end; a resume re-adds the groups accepted after the checkpoint; and the state the
loop checkpoints (tba.algorithm.state.RunState) round-trips.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tba.algorithm import monitor as monitor_module
from tba.algorithm.loop import Loop
from tba.algorithm.monitor import Monitor
from tba.algorithm.runtime import RuntimeReport
from tba.algorithm.state import Evaluation, RunState
from tba.algorithm.types import Group, Sample
from tba.config import load_config
from tba.errors import UserError
from tba.run.build import build_buffer, loop_settings


def group(pid: int, version: int, n: int = 4) -> Group:
    return Group(prompt_id=pid, prompt_tokens=[1, pid], samples=[
        Sample(response=[pid, j, 2], ref_logprobs=[-1.0] * 3, reward=float(j), version=version,
               behaviour_logprobs=[-0.5] * 3) for j in range(n)])


class StubRuntime:
    """Delivers one scripted batch of two groups per collect, generated with the last published version."""

    searchers = 1

    def __init__(self, events: list, next_pid: int = 0):
        self.events, self.version, self.pid = events, 0, next_pid

    def launch(self):
        self.events.append(("launch",))

    def start(self):
        self.events.append(("start",))

    def collect(self, block: bool):
        groups = [group(self.pid, self.version), group(self.pid + 1, self.version)]
        self.pid += 2
        self.events.append(("collect", block, [g.prompt_id for g in groups]))
        return groups

    def publish(self, weights, version):
        self.version = version
        self.events.append(("publish", version))

    def report(self):
        return RuntimeReport({"searcher/restarts": 0}, [{"cursor": self.pid}], [{"rank": 0}], None)

    def stop(self):
        self.events.append(("stop",))


class StubTrainer:
    def __init__(self, events: list):
        self.events, self.version, self.skipped_steps = events, 0, 0
        self.optimizer, self.reference = None, None

    def step(self, draws):
        self.events.append(("update", self.version, [d.prompt_id for d in draws]))
        self.version += 1
        return {"trainer/loss": 1.0, "trainer/beta": 0.1, "trainer/tokens_per_s": 1.0, "trainer/skipped": 0.0,
                "trainer/step_s": 0.5}

    def weights(self):
        return {"w": self.version}


class RecordingBuffer:
    """The real buffer, with its extend/sample/mark_sync calls recorded in order."""

    def __init__(self, buffer, events):
        self._b, self._events = buffer, events

    def __getattr__(self, name):
        return getattr(self._b, name)

    def __len__(self):
        return len(self._b)

    def extend(self, groups, step):
        self._events.append(("store", step, [g.prompt_id for g in groups]))
        self._b.extend(groups, step)

    def sample(self, b, k, version=None):
        draws = self._b.sample(b, k, version)
        self._events.append(("draw", [d.prompt_id for d in draws]))
        return draws

    def mark_sync(self, step):
        self._events.append(("window", step))
        self._b.mark_sync(step)


class StubEvaluator:
    def __call__(self):
        return {"score": 0.5}

    def describe(self, metrics):
        return f"score {metrics['score']}"


class StubCheckpoints:
    """Records what the loop checkpoints; `keep` of them count as kept on disk (for buffer compaction)."""

    def __init__(self, run_dir, saved: list, keep: int = 0):
        self.run_dir, self.saved, self.keep = run_dir, saved, keep

    def save(self, step, *, trainer, state):
        self.saved.append((step, state))

    def buffer_marks(self):
        return [s["buffer"]["groups_added"] for _, s in self.saved[-self.keep:]] if self.keep else []


@pytest.fixture
def harness(tmp_path):
    saved = []

    def make(steps=6, k=2, every=4, state=None, next_pid=0, resumed=False, extra=(), keep=0):
        cfg = load_config(None, [f"output_dir={tmp_path}", f"trainer.steps={steps}", f"trainer.sync_every_steps={k}",
                                 f"checkpoint.every_steps={every}", "eval.every_steps=3", "buffer.prefill_samples=8",
                                 "trainer.prompts_per_step=2", "trainer.samples_per_prompt=2", "mode=async",
                                 "buffer.online_prob=1", "logging.progress=false", "logging.tensorboard=false",
                                 *extra])
        events: list = []
        state = state or RunState()
        buffer_state = saved[-1][1]["buffer"] if resumed else None
        buffer = build_buffer(cfg, tmp_path, tmp_path if resumed else None, buffer_state)
        logger = SimpleNamespace(lines=[], close=lambda: None)
        logger.log = lambda step, m: logger.lines.append((step, m))
        run = Loop(loop_settings(cfg), trainer=StubTrainer(events), buffer=RecordingBuffer(buffer, events),
                   runtime=StubRuntime(events, next_pid), evaluator=StubEvaluator(),
                   checkpoints=StubCheckpoints(tmp_path, saved, keep), logger=logger, state=state,
                   monitor=Monitor(RunState(), 0.0, 300.0), resumed=resumed)
        return run, events, logger

    return make, saved


def test_groups_are_stored_before_they_can_be_drawn(harness):
    make, _ = harness
    run, events, _ = make()
    run.run()
    run.close()
    stored: set[int] = set()
    for e in events:
        if e[0] == "store":
            stored |= set(e[2])
        if e[0] == "draw":
            assert set(e[1]) <= stored, e
    # prefill blocks for 8 samples (one batch of 2 groups × 4), then every step collects without waiting
    collects = [e for e in events if e[0] == "collect"]
    assert collects[0][1] is True and all(c[1] is False for c in collects[1:])
    assert [e[0] for e in events[:5]] == ["launch", "start", "collect", "store", "window"]


def test_weights_are_published_every_k_updates_with_the_trainer_version(harness):
    make, _ = harness
    run, events, logger = make(steps=6, k=2)
    run.run()
    publishes = [e[1] for e in events if e[0] == "publish"]
    assert publishes == [2, 4, 6]
    # each publish is followed by a new recency window at that step, before the next collect
    for i, e in enumerate(events):
        if e[0] == "publish":
            assert events[i + 1] == ("window", e[1])
    # staleness = the trainer's version before the update − the sample's; recency draws the newest groups,
    # generated with the last published version: 0 on the first step of a window, 1 on the second
    assert [m["staleness/max"] for _, m in logger.lines] == [0, 1, 0, 1, 0, 1]
    assert [s for s, _ in logger.lines] == [1, 2, 3, 4, 5, 6]


def test_checkpoints_follow_the_schedule_and_the_end(harness):
    make, saved = harness
    run, _, logger = make(steps=10, every=4)
    totals = run.run()
    run.close()
    assert [s for s, _ in saved] == [4, 8, 10]  # every 4, and at the end; close() adds none (already saved)
    assert run.trainer.version == 10 and run.state.evals[0].score == 0.5 and totals.restarts == 0
    evals = [s for s, m in logger.lines if "eval/score" in m]
    assert evals == [3, 6, 9, 10]


def test_an_interrupted_step_gets_an_exit_checkpoint_of_the_last_completed_step(harness):
    make, saved = harness
    run, events, _ = make(steps=10, every=4)
    run.trainer.step = lambda draws: (_ for _ in ()).throw(RuntimeError("boom")) if run.state.step == 5 else \
        StubTrainer.step(run.trainer, draws)
    with pytest.raises(RuntimeError, match="boom"):
        run.run()
    run.close()
    assert [s for s, _ in saved] == [4]  # the failing update was half applied: no exit checkpoint of it
    run2, _, _ = make(steps=10, every=4)
    run2.trainer.step = lambda draws: StubTrainer.step(run2.trainer, draws)
    run2.started = True
    run2.state.step = 5  # a completed step that is not saved yet
    run2.close()
    assert [s for s, _ in saved] == [4, 5]


def test_resume_re_adds_the_groups_accepted_after_the_checkpoint(harness):
    make, saved = harness
    run, events, _ = make(steps=6, every=4)
    run.run()
    run.close()
    all_groups = run.buffer.groups_added
    # the checkpoint at step 4 saw fewer groups than the run accepted by its end
    step4 = next(state for step, state in saved if step == 4)
    saved[:] = [(4, step4)]
    run2, _, _ = make(steps=6, every=4, state=RunState.from_checkpoint({**step4, "step": 4}), resumed=True)
    assert step4["buffer"]["groups_added"] < all_groups
    assert run2.buffer.groups_added == all_groups  # everything on disk is back in memory


def test_checkpoints_compact_the_store_and_a_resume_rebuilds_the_buffer_from_its_snapshot(harness):
    make, saved = harness  # the two newest checkpoints are kept, as with checkpoint.keep = 2
    run, _, _ = make(steps=24, every=4, extra=("buffer.max_samples=16",), keep=2)
    run.run()
    run.close()
    from tba.algorithm.store import BufferStore

    store = BufferStore(run.checkpoints.run_dir, readonly=True)
    accepted = store.num_groups() * 4  # every stub group has 4 samples
    stored = store.db.execute("SELECT count(*) FROM samples").fetchone()[0]
    # kept: the buffer as of the older kept checkpoint (step 20) and every group after it; nothing evicted before
    assert run.buffer.evicted_prompts > 0 and len(run.buffer) <= stored < accepted / 2
    live = {pid: [x.response for x in h.items] for pid, h in run.buffer.histories.items()}
    final = saved[-1][1]
    run2, _, _ = make(steps=24, every=4, state=RunState.from_checkpoint({**final, "step": 24}), resumed=True,
                      extra=("buffer.max_samples=16",))
    assert {pid: [x.response for x in h.items] for pid, h in run2.buffer.histories.items()} == live


def test_run_state_round_trips_a_checkpoint(tmp_path):
    state = RunState(step=7, evals=[Evaluation(0, {"score": 0.25}, 0.0),
                                    Evaluation(5, {"score": 0.5, "kl": 0.1}, 3.5)],
                     rewards_seen=[0.1, 0.2], received=96, busy_s=2.5, train_s=4.0, wall_s=9.0, resumed_at=[3],
                     restarts=1, rewards_dropped=2, policy_source="/a", reference_source="/b")
    on_disk = json.loads(json.dumps({**state.to_checkpoint(), "step": 7}))  # state.json is JSON
    assert RunState.from_checkpoint(on_disk) == state
    assert RunState.from_checkpoint({}) == RunState()


def test_an_async_trainer_drawing_on_an_aging_buffer_warns(harness, monkeypatch, caplog):
    make, _ = harness
    monkeypatch.setattr(monitor_module, "NO_FRESH_WARN_S", 0.0)
    run, _, _ = make(steps=3)
    run.runtime.collect = lambda block: [group(100, 0), group(101, 0)] if block else []  # prefill, then silence
    run.run()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sum("no fresh samples" in m for m in warnings) == 1  # once per quiet spell, not every step


@pytest.mark.parametrize("bound", [None, 1.0])
def test_max_replay_ratio_makes_an_async_trainer_wait_for_fresh_samples(harness, bound):
    """B·K = 4 draws per update; a collect brings 8 samples, but the searcher delivers only every third call."""
    make, _ = harness
    run, events, logger = make(steps=12, extra=[f"trainer.max_replay_ratio={bound or 'null'}"])
    calls = {"n": 0}
    original = run.runtime.collect

    def collect(block):
        calls["n"] += 1
        return original(block) if block or calls["n"] % 3 == 0 else []

    run.runtime.collect = collect
    run.run()
    waits = len([e for e in events if e[0] == "collect" and e[1]]) - 1  # blocking collects after the prefill
    ratios = [m["trainer/replay_ratio"] for _, m in logger.lines]
    if bound is None:  # never waits: 48 draws from 40 samples
        assert waits == 0 and ratios[-1] == pytest.approx(48 / 40)
    else:  # waits whenever the next update would take the ratio past the bound, so it never does
        assert waits > 0 and max(ratios) <= bound


def test_max_replay_ratio_holds_when_one_update_draws_more_than_a_search_batch(harness):
    """B·K = 32 draws per update but a collect brings 8 samples: the trainer waits for several batches per
    update, not just one (waiting for one let the ratio drift to B·K / batch)."""
    make, _ = harness
    run, events, logger = make(steps=5, extra=["trainer.max_replay_ratio=2.0", "trainer.prompts_per_step=4",
                                               "trainer.samples_per_prompt=8"])
    run.runtime.collect = lambda block, original=run.runtime.collect: original(block) if block else []
    run.run()
    ratios = [m["trainer/replay_ratio"] for _, m in logger.lines]
    assert len(ratios) == 5 and max(ratios) <= 2.0 and ratios[-1] == pytest.approx(2.0)


@pytest.mark.parametrize("extra, fired", [([], []), (["trainer.replay_warning=2"], ["2.0", "4.0"]),
                                          (["trainer.replay_warning=2", "trainer.max_replay_ratio=2"], []),
                                          (["trainer.replay_warning=0.1", "mode=sync"], [])])
def test_a_trainer_far_ahead_of_its_searchers_warns_once_then_as_the_ratio_doubles(harness, caplog, extra, fired):
    """B·K = 4 draws per update on 8 prefilled samples, then nothing unless the loop waits: the ratio is u/2 after u
    updates. Past trainer.replay_warning it warns, again at twice the ratio; never under it (default 8), with
    max_replay_ratio (the trainer waits instead) or in sync mode (every step waits)."""
    make, _ = harness
    run, _, logger = make(steps=12, extra=extra)
    run.runtime.collect = lambda block, original=run.runtime.collect: original(block) if block else []
    run.runtime.report = lambda: RuntimeReport({"searcher/restarts": 0, "episode/ended_done": 7.0,
                                                "episode/ended_timeout": 3.0}, [{}], [{"rank": 0}], None)
    totals = run.run()
    warnings = [r.getMessage() for r in caplog.records if "replaying far ahead" in r.getMessage()]
    assert [w.split("replay ratio ")[1].split("×")[0] for w in warnings] == fired
    assert not warnings or "16 draws from 8 samples" in warnings[0] and "3 timeout" in warnings[0]
    assert totals.replay_ratio == pytest.approx(logger.lines[-1][1]["trainer/replay_ratio"])
    assert totals.episodes_ended == {"done": 7, "timeout": 3}


def test_an_update_with_nothing_young_enough_waits_for_fresh_samples(harness):
    """buffer.max_sample_age: once every buffered sample is too old, the next update blocks for fresh ones
    instead of training on them (the searcher here delivers only when the loop waits)."""
    make, _ = harness
    run, events, logger = make(steps=6, k=1, extra=["buffer.max_sample_age=1"])
    run.runtime.collect = lambda block, original=run.runtime.collect: original(block) if block else []
    run.run()
    waits = [e for e in events if e[0] == "collect" and e[1]]
    assert len(waits) > 1  # the prefill, then waits for young samples
    assert max(m["staleness/max"] for _, m in logger.lines) <= 1
    assert all("buffer/too_old" in m for _, m in logger.lines)


def test_the_prefill_counts_completions_delivered_not_the_unique_ones_kept(harness):
    """P = 8 completions: a searcher that repeats itself (each batch: 2 prompts × 4 copies of one response) is
    waited for once — 8 completions delivered, 2 unique kept — not until 8 unique samples exist (never, here)."""
    make, _ = harness
    run, events, _ = make(steps=2)
    waits = []

    def collect(block):
        if block:
            waits.append(1)
            assert len(waits) < 5, "the prefill is still waiting after 4 batches"
        groups = [group(0, 0), group(1, 0)]
        for g in groups:
            for x in g.samples:
                x.response = [g.prompt_id, 2]
        return groups

    run.runtime.collect = collect
    run.run()
    assert len(waits) == 1 and run.state.received == 8 + 2 * 8 and len(run.buffer) == 2


def test_a_prefill_whose_every_sample_is_dropped_stops_naming_the_last_error(harness):
    """Searchers whose every reward fails (an agent the endpoint refuses, a reward function that raises) deliver
    empty batches; the prefill would wait for ever: once 64 (at least twice P) are dropped and none received, the
    run stops with one line naming the last failure."""
    make, _ = harness
    run, _, _ = make(steps=2)
    dropped = []

    def collect(block):
        dropped.append(4)
        assert len(dropped) < 100, "the prefill is still waiting"
        return []

    run.runtime.collect = collect
    run.runtime.report = lambda: RuntimeReport({"searcher/restarts": 0, "searcher/rewards_dropped": sum(dropped)},
                                               [None], [{"rank": 0}], "prompt 3: agent f raised ValueError: no\ntb")
    with pytest.raises(UserError, match=r"first 64 samples were all dropped .* the last: prompt 3: agent f raised"):
        run.run()
    assert len(dropped) == 16


def test_ctrl_c_during_an_evaluation_stops_within_seconds_with_the_exit_checkpoint(harness):
    """SIGINT while the held-out evaluation runs (minutes on a real task): the evaluation is abandoned at once,
    the update before it is complete, so close() writes the exit checkpoint of that step."""
    import os
    import signal
    import threading
    import time

    from tba.run.progress import RunControl

    make, saved = harness
    run, _, _ = make(steps=6, every=100)
    run.progress = RunControl(6, enabled=False)

    class SlowEvaluator(StubEvaluator):
        calls = 0

        def __call__(self):
            SlowEvaluator.calls += 1
            if SlowEvaluator.calls == 2:  # the evaluation after update 3 (eval.every_steps=3)
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
                time.sleep(60)
            return {"score": 0.5}

    run.evaluator = SlowEvaluator()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run.run()
    assert time.monotonic() - t0 < 10  # not the 60 s the evaluation would have taken
    run.close()
    assert [s for s, _ in saved] == [3] and run.state.step == 3


def test_a_stop_asked_during_an_update_skips_its_evaluation():
    from tba.run.progress import GracefulStop

    stop = GracefulStop()
    stop.requested = True
    with pytest.raises(KeyboardInterrupt), stop.interruptible():
        pytest.fail("the evaluation ran")


def test_each_update_logs_the_searchers_tokens_per_s_and_the_utilization(harness):
    make, _ = harness
    run, _, logger = make(steps=4)
    seen = []
    run.utilization = lambda draws, seconds: seen.append((len(draws), seconds)) or {"trainer/mfu": 0.25}
    run.run()
    assert seen == [(2, 0.5)] * 4 and all(m["trainer/mfu"] == 0.25 for _, m in logger.lines)
    assert all(m["searcher/tokens_per_s"] > 0 for _, m in logger.lines)  # 2 groups × 4 samples × 3 tokens a step


def test_the_searchers_rate_is_over_the_last_updates(monkeypatch):
    import tba.algorithm.loop as loop

    now = [0.0]
    monkeypatch.setattr(loop, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    rate = loop.SearchRate(window=2)
    rate.add(99)  # the prefill's: not counted
    rate.start()
    for tokens, seconds in [(10, 1.0), (30, 1.0), (0, 2.0)]:
        rate.add(tokens)
        now[0] += seconds
        last = rate.rate()
    assert last == 30 / 3.0  # the last two updates: 30 + 0 tokens over 1 + 2 s
