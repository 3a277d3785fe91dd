"""A sampler that fails on purpose, for the searcher-fault tests (search.backend=<this file>:build): the hf
sampler, raising on its fourth generate call in each process. Fault injection lives here, not in the product."""

from tba.rollout.samplers.hf import build as build_hf

FAIL_AFTER = 3


class FaultySampler:
    quantize_s = 0.0

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def generate(self, *args, **kwargs):
        if self.calls >= FAIL_AFTER:
            raise RuntimeError(f"injected searcher fault after {self.calls} batches (tests/runtime/faulty_sampler.py)")
        self.calls += 1
        return self.inner.generate(*args, **kwargs)

    def load_weights(self, weights, version):
        self.inner.load_weights(weights, version)

    def close(self):
        self.inner.close()


def build(spec, *, source, tokenizer, device, seed, policy=None):
    return FaultySampler(build_hf(spec, source=source, tokenizer=tokenizer, device=device, seed=seed, policy=policy))
