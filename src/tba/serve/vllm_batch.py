"""The vllm backend's batch for serving: each request's samples are requests of the searcher's own vLLM engine.

vLLM's scheduler already batches requests of different sampling settings, so nothing is grouped here: each sample
is one engine request with its own `SamplingParams` (temperature, top-p, max_tokens, EOS plus the request's stop
tokens, `logprobs` = the top log-probs asked for) streamed back one step at a time (RequestOutputKind.DELTA), the
same calls tba.rollout.samplers.vllm.VLLMStream makes for a searcher. Log-probs are the engine's processed ones
(softmax(logits / T) after top-p: the sampler is built with logprobs_mode="processed_logprobs"). Cancelling aborts
the engine requests. Only the engine thread (tba.serve.engine) calls these.
"""

from __future__ import annotations

import torch

from tba.serve.engine import Params, Token


class VLLMBatch:
    def __init__(self, sampler):
        """`sampler`: a tba.rollout.samplers.vllm.VLLMSampler (its engine in this process)."""
        self.sampler = sampler
        self.engine = sampler.llm.llm_engine
        self.requests: dict[str, tuple[str, int, Params]] = {}
        """engine request id → (request, sample index, its settings)."""
        self.serial = 0

    @property
    def active(self) -> int:
        return len(self.requests)

    @property
    def idle(self) -> bool:
        return not self.requests

    def add(self, rid: str, prompt: list[int], params: Params) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        stop = sorted({self.sampler.eos_id, *params.stop_token_ids} - {None})
        for index in range(params.n):
            sampling = SamplingParams(n=1, temperature=params.temperature, top_p=params.top_p, top_k=0,
                                      max_tokens=params.max_tokens, stop_token_ids=stop,
                                      logprobs=params.top_logprobs, flat_logprobs=True, detokenize=False,
                                      seed=self.sampler._rng.getrandbits(62), output_kind=RequestOutputKind.DELTA)
            engine_id = f"serve-{self.serial}"
            self.serial += 1
            self.engine.add_request(engine_id, TokensPrompt(prompt_token_ids=list(prompt)), sampling)
            self.requests[engine_id] = (rid, index, params)

    def cancel(self, rid: str) -> None:
        mine = [e for e, (r, _, _) in self.requests.items() if r == rid]
        if mine:
            self.engine.abort_request(mine)
        for e in mine:
            del self.requests[e]

    def step(self, version: int) -> list[Token]:
        device = self.sampler.device
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            outputs = self.engine.step()
        events = []
        for out in outputs:
            known = self.requests.get(out.request_id)
            if known is None:
                continue
            rid, index, params = known
            completion = out.outputs[0]
            new = list(completion.token_ids)
            lp = completion.logprobs
            starts, ends = lp.start_indices[-len(new):], lp.end_indices[-len(new):]
            for j, (tok, a, b) in enumerate(zip(new, starts, ends, strict=True)):
                top = None
                if params.top_logprobs:  # the sampled token first (even if it is among them), then the top k
                    entries = zip(lp.token_ids[a + 1:b], lp.logprobs[a + 1:b], lp.ranks[a + 1:b], strict=True)
                    top = [(t, v) for _, t, v in sorted((r or 0, t, v) for t, v, r in entries)][:params.top_logprobs]
                last = out.finished and j == len(new) - 1
                finish = (completion.finish_reason or "stop") if last else None
                events.append(Token(rid, index, tok, lp.logprobs[a], version, top, finish))
            if out.finished:
                del self.requests[out.request_id]
                if not new:  # ended without a token (aborted by the engine): the sample still ends
                    events.append(Token(rid, index, -1, 0.0, version, None, "abort"))
        return events
