"""The searchers' sections of the config schema (tba.config.schema): what they sample, where they run, how they are
supervised and what each declares on Ray. `search.groups` describes several behaviour policies feeding one
buffer; without it, every searcher samples the trained policy with the settings of `search` itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from tba.config.rules import (
    devices,
    fraction,
    non_negative,
    one_of,
    or_none,
    positive,
    positive_or_none,
    probability,
    setting,
)
from tba.errors import ConfigError
from tba.rollout.samplers import SAMPLERS
from tba.runtime import START_METHODS, TRANSPORTS

QUANTIZE = ("none", "int8", "int8_weight", "fp8")
"""search.quantize's schemes (tba.rollout.quantize)."""
BATCHING = ("static", "continuous")
WEIGHT_UPDATES = ("between_batches", "in_flight")
IN_FLIGHT_CACHE = ("keep", "recompute")


@dataclass
class VLLMConfig:
    """search.backend=vllm: the vllm.LLM engine each searcher runs in its own process."""

    kv_cache_gb: float = 1.0
    """CPU only: memory for the KV cache per searcher (vLLM's kv_cache_memory_bytes; an exported
    VLLM_CPU_KVCACHE_SPACE wins)."""
    gpu_memory_utilization: float | None = setting(None, or_none(fraction))
    """GPU only: share of the device's memory the engine may take (model + KV cache; vLLM's own setting). None =
    what the run's plan sets (tba.run.plan), else 0.9 × the memory free on the searcher's GPU when the engine starts
    (after its π_ref has loaded)."""
    enforce_eager: bool | None = None
    """No CUDA graphs / torch.compile. None = true on a CPU (start-up would compile for minutes), false on a GPU
    (CUDA graphs: decoding's speed on long runs, at a start-up of tens of seconds)."""
    tensor_parallel_size: int = setting(1, positive)
    """GPUs per engine (vLLM's tensor parallelism). 1: the engine lives in the searcher's process. k > 1: vLLM's
    worker processes over k GPUs — searcher i takes k consecutive items of search.device (tba.run.searchers) and
    its weights must arrive through vLLM's own weight transfer (search.weight_transport=vllm); GPUs, runtime=local,
    full fine-tuning (not LoRA) only."""
    max_model_len: int | None = None
    """Longest prompt + response the engine plans for. None = task.max_prompt_tokens + search.max_new_tokens."""
    fast_cpu_env: bool = True
    """CPU, local runtime: preload tcmalloc and Intel OpenMP in vLLM searchers (tba.rollout.samplers.vllm.fast_cpu_env;
    several times the tokens/s). A preload you set wins; other runtimes: export it yourself (README)."""


@dataclass
class SearcherGroup:
    """One behaviour policy feeding the buffer: `num_searchers` searchers that sample alike. A field left null
    takes the value of `search` itself. Every sample records its group's `name` as its source."""

    name: str = "policy"
    """The source name in metrics, `tba buffer stats` and `tba report`."""
    num_searchers: int = setting(1, positive)
    """Searchers of this group; together they cover every train prompt (each its round-robin shard)."""
    temperature: float | None = setting(None, or_none(positive))
    """Sampling temperature T_b of this group. The log-probs TB compares (π_θ's, π_ref's) stay at
    search.temperature: T_b changes the behaviour, not the target. Its behaviour log-probs are at T_b."""
    top_p: float | None = setting(None, or_none(probability))
    """Nucleus of this group's sampler (< 1 gives some responses no chance: TB then misses π*)."""
    backend: str | None = setting(None, or_none(one_of(SAMPLERS, plugin="module:build (your own)")))
    """This group's sampling engine (hf, vllm, or module:build)."""
    quantize: str | None = setting(None, or_none(one_of(QUANTIZE)))
    """Sample from a quantized copy of each published policy (tba.rollout.quantize: int8, int8_weight, fp8)."""
    policy: str | None = None
    """Another model to sample from, fixed for the whole run: any causal LM with the run's tokenizer (hub name,
    directory — an earlier run's `tba export`, a teacher —, .gguf, package:). null = the trained policy."""
    sync: bool | None = None
    """Load every policy the trainer publishes (every k updates). null = true for the trained policy, false for
    another `policy`; false with the trained policy = a fixed behaviour: its starting weights, never updated."""
    device: str | None = setting(None, devices)
    """This group's device(s), as search.device (null = search.device)."""

    def check(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"search.groups: name {self.name!r}: letters, digits, - and _ only (it names a source)")
        if self.policy is not None and self.sync:
            raise ConfigError(f"search.groups: group {self.name!r} samples another model (policy: {self.policy}); "
                              "it cannot load the trainer's weights: leave sync unset or false")


@dataclass
class SearchConfig:
    """The searchers: what they sample (the behaviour policy and one search batch) and where they run."""

    backend: str = setting("hf", one_of(SAMPLERS, plugin="module:build (your own)"))
    """The sampling engine (tba.rollout.samplers.SAMPLERS: hf, vllm) or your own `file.py:build`. Reference log-probs
    are the HF reference model's with every backend."""
    temperature: float = setting(0.7, positive)
    """T: sampling temperature; log-probs everywhere are of logits ÷ T, as in the paper."""
    top_p: float = setting(1.0, probability)
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p, renormalised;
    log-probs everywhere are of that renormalised distribution. 1.0 = off (full support)."""
    generations_per_prompt: int = setting(10, positive)
    """S: completions generated per prompt and search batch (S ≥ trainer.samples_per_prompt = K, so that dedup
    still leaves K unique ones)."""
    prompts_per_batch: int = setting(8, positive)
    """Prompts per search iteration (one generate call of prompts × S sequences)."""
    max_new_tokens: int = setting(32, positive)
    """Longest response in tokens; a response that reaches it without EOS is kept, cut there. In a multi-turn
    task (one with an environment): the longest policy turn."""
    batching: str = setting("static", one_of(BATCHING))
    """static: each search batch (prompts_per_batch × S rows) decodes until its longest response ends.
    continuous (hf: tba.models.continuous, vllm: requests submitted to its scheduler as slots free): `slots` rows
    stay in flight and a row that ends hands its slot to the next prompt's sample; a prompt's group is delivered
    when its last sample ends, and a search step returns once prompts_per_batch groups are. Multi-turn episodes
    (tba.rollout.episode_stream): an episode ending a turn frees its slot while its environment answers, and
    resumes with its KV cache (vllm: its prefix cache)."""
    weight_update: str = setting("between_batches", one_of(WEIGHT_UPDATES))
    """When a searcher loads newly published weights. between_batches: only with no response half-generated (under
    continuous batching the rows in flight end first, admitting nothing meanwhile; episodes: the open ones end).
    in_flight: at the next decode step (continuous batching) or the next turn (multi-turn episodes in static
    batches), the rows in flight going on with their cached keys and values; each sample records the version of
    every token (Sample.versions). No objective is corrected for it: TB's target does not depend on which policies
    sampled (docs/objectives.md)."""
    in_flight_cache: str = setting("keep", one_of(IN_FLIGHT_CACHE))
    """weight_update=in_flight with batching=continuous (hf backend): what becomes of the keys and values that rows
    in flight (and episodes between turns) cached under older weights. keep: they stay — the next tokens come from
    the new weights reading an older cache. recompute: at the first decode step after a load, every row in flight
    re-prefills its whole context under the new weights (an episode between turns, when it resumes), so each later
    token is sampled from the newest policy given its prefix; it costs a forward over every context per load."""
    slots: int | None = setting(None, positive_or_none)
    """batching=continuous: rows in flight. None = prompts_per_batch × generations_per_prompt."""
    max_turns: int = setting(4, positive)
    """Multi-turn tasks: policy turns per episode at most (tba.rollout.episodes)."""
    max_episode_tokens: int | None = setting(None, positive_or_none)
    """Multi-turn tasks: tokens after the prompt per episode, the policy's and the environment's. None =
    max_turns × max_new_tokens × 2."""
    env_timeout_s: float = setting(10.0, positive)
    """Multi-turn tasks: longest wait for the environment's answer (a tool call) before the episode ends."""
    num_searchers: int = setting(1, positive)
    """N: searcher processes (local) or actors (ray). Each owns a round-robin shard of the train prompts."""
    device: str | None = setting(None, devices)
    """Where each searcher's models live (cpu | cuda | cuda:N | auto), or a comma list that searcher i takes
    item i of (cyclically), e.g. cuda:1,cuda:2,cuda:3 beside a trainer on cuda:0; a vLLM searcher with
    search.vllm.tensor_parallel_size = k takes k consecutive items (i·k … i·k + k − 1). None = model.device.
    runtime=local starts each searcher seeing only its own GPU(s) (CUDA_VISIBLE_DEVICES: its cuda:N is cuda:0
    inside). On Ray each actor sees the GPUs it declared (ray.searcher_gpus) and `cuda` means its own."""
    dtype: str | None = setting(None, or_none(one_of(("float32", "bfloat16", "float16"))))
    """The searchers' models (the sampler's and their π_ref) and the weights a sharded trainer publishes. None = the
    trainer's compute dtype (trainer.fsdp.param_dtype when sharded, else model.dtype) for a searcher on a GPU,
    model.dtype on a CPU: master weights stay in model.dtype whatever the searchers sample in."""
    threads: int | None = setting(None, positive_or_none)
    """torch threads per searcher. None = an equal share of the cores (inline: all cores)."""
    weight_transport: str = setting("auto", one_of(("auto", *TRANSPORTS)))
    """How published weights reach searchers (tba.runtime.TRANSPORTS). auto = local: vllm (vLLM's NCCL weight
    transfer, straight into each engine) when every synced searcher is a vLLM engine on GPUs other than the
    trainer's and the policy is not LoRA, else shared (host shared memory, or CUDA IPC when every searcher is on
    the trainer's GPU); ray: object_store on CPU, broadcast (NCCL) when the trainer is on a GPU."""
    quantize: str = setting("none", one_of(QUANTIZE))
    """Sample from a quantized copy of each published policy: none | int8 | int8_weight | fp8 (tba.rollout.quantize).
    The trainer trains, and π_ref scores, in full precision; the behaviour log-probs are the quantized model's."""
    vllm: VLLMConfig = setting(factory=VLLMConfig)
    """Engine settings when backend is vllm (the `search.vllm.*` section)."""
    groups: list[SearcherGroup] | None = None
    """Several behaviour policies feeding one buffer, e.g. [{name: policy, num_searchers: 1}, {name: explore,
    temperature: 1.5, sync: false}, {name: teacher, policy: runs/old/checkpoint}]. null = one group, "policy",
    of num_searchers searchers with the settings above."""

    def check(self) -> None:
        if self.in_flight_cache == "recompute" and (self.batching, self.weight_update) != ("continuous", "in_flight"):
            raise ConfigError(f"search.in_flight_cache=recompute: only with search.batching=continuous and "
                              f"search.weight_update=in_flight (here {self.batching}, {self.weight_update}): nothing "
                              "else keeps a cache across a weight load")
        if self.groups is None:
            return
        if not self.groups:
            raise ConfigError("search.groups: an empty list; leave it null for one group of search.num_searchers")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ConfigError(f"search.groups: names must differ, got {names}")
        total = sum(g.num_searchers for g in self.groups)
        if self.num_searchers not in (1, total):
            raise ConfigError(f"search.num_searchers: {self.num_searchers}, but search.groups has {total} searchers; "
                              "with groups, set the count per group (num_searchers: 1, the default, is ignored)")


@dataclass
class SupervisionConfig:
    """How long the trainer waits for searchers in other processes or on Ray, and how many failures it survives
    (tba.runtime.supervision)."""

    ready_timeout_s: float = setting(300.0, positive)
    """How long a searcher may take to start (import, load models) before the run fails."""
    collect_timeout_s: float = setting(600.0, positive)
    """Longest wait for samples when the loop must wait (prefill; every step in sync mode)."""
    heartbeat_timeout_s: float = setting(300.0, positive)
    """Cap on how long a searcher that owes a batch may stay silent before it is killed and restarted like a
    crash. The limit in force is min(this, max(heartbeat_floor_s, 20 × its slowest of the last 16 batches))
    (tba.algorithm.timeout); until its first batch only this cap applies: it must exceed the slowest first batch."""
    heartbeat_floor_s: float = setting(10.0, positive)
    """The learnt heartbeat limit is never shorter than this (scheduling jitter on a busy machine is not a hang)."""
    max_restarts: int = setting(3, non_negative)
    """Searcher deaths or exceptions survived per run (each restarts that searcher); one more stops the run."""
    start_method: str = setting("auto", one_of(START_METHODS))
    """How runtime=local starts searcher processes (tba.runtime.forkserver): forkserver — forked from a server
    that imported tba once, seconds sooner —, spawn — a fresh interpreter each —, or auto: forkserver unless a
    searcher runs vLLM (spawn)."""


@dataclass
class RayConfig:
    address: str | None = None
    """Ray cluster to join (e.g. 127.0.0.1:6379 or auto). None = start a private local Ray on 127.0.0.1."""
    num_cpus: int | None = None
    """CPUs of the private local Ray (None = all cores)."""
    searcher_cpus: float = 1.0
    """CPUs each searcher actor declares."""
    searcher_gpus: float = 0.0
    """GPUs each searcher actor declares."""
    searcher_resources: dict | None = None
    """Custom resources each searcher actor requires, e.g. {searcher: 1} to pin them to tagged nodes."""
    trainer_placement: str = setting("PACK", one_of(("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")))
    """How the placement group of a sharded trainer's ranks (one bundle each, rank 0 included) spreads over nodes:
    PACK (as few nodes as the ranks fit on: one node when it can), SPREAD, STRICT_PACK (one node or none), or
    STRICT_SPREAD (one rank per node)."""
    trainer_resources: dict | None = None
    """Custom resources each trainer rank's bundle requires besides its CPUs and GPU, e.g. {trainer: 1} to place the
    ranks on tagged nodes."""
