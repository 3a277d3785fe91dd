"""The devices `tba eval` runs on: one worker per device, each holding the policy (an HF model, or a vLLM engine) and
its side of the evaluation — `tba.run.sharded.rank_evaluation`, exactly what a sharded trainer's rank runs — so an
evaluation spread over devices is the run's own `SpreadEvaluator` (shares of the prompts out, results merged here).

Why processes, one per device, and not threads: each device's decoding is a loop of small kernels that holds the
GIL between them, a vLLM engine wants its process to itself, and CUDA needs a fresh interpreter (spawn). With one
device the worker lives in this process (nothing to start). A worker answers requests one at a time — an evaluation
config, a share, a seed — so the greedy and the sampled passes reuse one loaded model, and a long share can be
sent in pieces (at multiples of the generation chunk: the batches, hence the completions, are the same) for
progress.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import queue
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from tba.errors import UserError
from tba.models import load_model, precision, resolve_device
from tba.rollout.evaluate import ShareResult
from tba.rollout.samplers import SAMPLERS
from tba.rollout.samplers.base import SamplerSpec
from tba.run.sharded import rank_evaluation
from tba.runtime.worker import build_sampler

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What a device's worker is built from (picklable: it crosses into a spawned process)."""

    cfg: object
    """The evaluation's RunConfig."""
    policy: str
    reference: str
    device: str
    backend: str
    """hf | vllm"""
    seed: int
    max_model_len: int | None = None
    """vLLM: the longest prompt + response it must plan for."""
    threads: int | None = None


@dataclasses.dataclass(frozen=True)
class Request:
    eval_cfg: object
    """The EvalConfig of this pass (greedy: the run's eval section; sampled: n samples at a temperature)."""
    share: object
    """A tba.rollout.evaluate.Share."""
    seed: int | None = None
    """Reseed torch before this request (the first piece of a sampled pass); None: continue its stream."""


def vllm_spec(cfg, policy: str, max_model_len: int | None) -> SamplerSpec:
    """The vLLM engine's spec for evaluation: the run's search.vllm settings and dtype; a LoRA checkpoint is served
    merged into its base (the sampler's own LoRA path)."""
    lora = cfg.model.lora if (Path(policy) / "adapter_config.json").is_file() else None
    entry = SAMPLERS["vllm"]
    return SamplerSpec(entry.target, cfg.model.dtype, lora, cfg.search.vllm, max_model_len, takes_policy=False,
                       fresh_process=entry.fresh_process, child_env=entry.child_env)


class DeviceWorker:
    """One device's policy and its side of the evaluation; `evaluation` given: the task and tokenizer this process
    has already built (one device), else they are built as a sharded trainer's rank builds them."""

    def __init__(self, spec: WorkerSpec, evaluation=None):
        if spec.threads:
            torch.set_num_threads(spec.threads)
        self.spec, self.device = spec, resolve_device(spec.device)
        self.evaluation = evaluation or rank_evaluation(spec.cfg, spec.policy, spec.reference)
        if spec.backend == "vllm":  # an engine, not a module: no exact metrics (they read π_θ's logits)
            self.evaluation = dataclasses.replace(self.evaluation, scoring=None)
            self.model = build_sampler(vllm_spec(spec.cfg, spec.policy, spec.max_model_len), source=spec.policy,
                                       tokenizer=self.evaluation.tokenizer, device=self.device, seed=spec.seed)
        else:
            self.model = load_model(spec.policy, spec.cfg.model.dtype).to(self.device).eval()

    def __call__(self, request: Request) -> ShareResult:
        if request.seed is not None:
            torch.manual_seed(request.seed)
        evaluation = dataclasses.replace(self.evaluation, cfg=request.eval_cfg)
        autocast = self.spec.cfg.model.autocast if self.spec.backend == "hf" else None
        with precision.autocast(self.device, autocast):
            result = evaluation(self.model, request.share, self.device)
        self.evaluation._reference = evaluation._reference  # π_ref loaded once, kept between passes
        return result

    def close(self) -> None:
        if self.spec.backend == "vllm":
            self.model.close()


def _serve(spec: WorkerSpec, index: int, requests, replies) -> None:
    """A spawned worker's loop: build, say ready, answer requests until None."""
    try:
        worker = DeviceWorker(spec)
        replies.put((index, "ready", None))
    except BaseException as e:  # noqa: BLE001 — the parent reports it as this device's failure
        replies.put((index, "error", _why(e)))
        return
    while (request := requests.get()) is not None:
        try:
            replies.put((index, "ok", worker(request)))
        except BaseException as e:  # noqa: BLE001
            replies.put((index, "error", _why(e)))
    worker.close()


def _why(e: BaseException) -> str:
    return str(e) if isinstance(e, UserError) else "".join(traceback.format_exception(e))[-3000:]


class Workers:
    """The evaluation's workers, one per device: in this process for one device, spawned processes for several.
    `run(jobs, done)`: each worker carries out its list of requests in order (workers in parallel); `done()` is
    called after every request; returns each worker's results."""

    def __init__(self, specs: list[WorkerSpec], local_evaluation=None, timeout_s: float = 3600.0):
        self.specs, self.timeout_s = specs, timeout_s
        self.local = DeviceWorker(specs[0], local_evaluation) if len(specs) == 1 else None
        self.procs, self.inboxes = [], []
        if self.local is None:
            ctx = multiprocessing.get_context("spawn")
            self.replies = ctx.Queue()
            for i, spec in enumerate(specs):
                inbox = ctx.Queue()
                proc = ctx.Process(target=_serve, args=(spec, i, inbox, self.replies), daemon=True,
                                   name=f"tba-eval-{spec.device}")
                proc.start()
                self.procs.append(proc)
                self.inboxes.append(inbox)
            for _ in specs:
                self._reply()

    def __len__(self) -> int:
        return len(self.specs)

    def _reply(self):
        while True:
            try:
                index, kind, payload = self.replies.get(timeout=5.0)
                break
            except queue.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead:
                    raise UserError(f"eval worker(s) {', '.join(dead)} ended without an answer") from None
        if kind == "error":
            raise UserError(f"eval worker on {self.specs[index].device}: {payload}")
        return index, payload

    def run(self, jobs: list[list[Request]], done: Callable[[], None] = lambda: None) -> list[list[ShareResult]]:
        results: list[list[ShareResult]] = [[] for _ in jobs]
        if self.local is not None:
            for request in jobs[0]:
                results[0].append(self.local(request))
                done()
            return results
        cursor = [0] * len(jobs)
        pending = 0
        for i, job in enumerate(jobs):
            if job:
                self.inboxes[i].put(job[0])
                pending += 1
        while pending:
            i, result = self._reply()
            results[i].append(result)
            done()
            cursor[i] += 1
            pending -= 1
            if cursor[i] < len(jobs[i]):
                self.inboxes[i].put(jobs[i][cursor[i]])
                pending += 1
        return results

    @property
    def model(self):
        """The policy of a one-device evaluation (None with several: each process holds its own)."""
        return None if self.local is None else self.local.model

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
        for inbox in self.inboxes:
            inbox.put(None)
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
