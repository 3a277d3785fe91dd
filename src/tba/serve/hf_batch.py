"""The hf backend's batch for serving: tba.models.continuous with each request's own sampling settings.

A searcher's continuous batch samples every row alike (one temperature, one top-p, EOS the only stop). An endpoint's
requests differ — a harness at T = 0 beside a verifiers client at T = 1, each with its own stop tokens — and must
still share one forward per step. So this subclass keeps the parent's admission, prefill and timeline unchanged and
replaces only the draw: rows are grouped by (temperature, top-p) and each group sampled by the same code as the
searchers' (`tba.models.generation._sample`; temperature 0 is argmax), a row stops at EOS, at one of its stop
tokens or at its max_tokens, and a request can be cancelled wherever it is (queued, prefilled or decoding).

With one request of one sample, the draw is the parent's exactly: the tokens equal the sampler's `generate` under
the same torch seed (tests/serve/test_hf_batch.py).
"""

from __future__ import annotations

from collections import deque

import torch

from tba.models.continuous import ContinuousBatch, Finished
from tba.models.generation import _sample
from tba.serve.engine import Params, Token


class HFBatch(ContinuousBatch):
    def __init__(self, sampler, slots: int):
        """`sampler`: a tba.rollout.samplers.hf.HFSampler (its quantized copy samples when it has one)."""
        super().__init__(sampler.sampling, slots, temperature=1.0, top_p=1.0, eos_id=sampler.eos_id,
                         pad_id=sampler.pad_id, refill=1)
        self.sampler = sampler
        self.params: dict[str, Params] = {}
        self._left: dict[str, int] = {}
        self._events: list[Token] = []

    # ---- tba.serve.engine.Batch ------------------------------------------------------------------------------
    def add(self, rid: str, prompt: list[int], params: Params) -> None:
        self.params[rid], self._left[rid] = params, params.n
        self.submit(rid, prompt, params.n, params.max_tokens)

    def cancel(self, rid: str) -> None:
        self.queue = deque(q for q in self.queue if q.key != rid)
        self.prefills.pop(rid, None)
        for slot, row in enumerate(self.rows):
            if row is not None and row.key == rid:
                self._free(slot)
        self.params.pop(rid, None)
        self._left.pop(rid, None)

    def step(self, version: int) -> list[Token]:
        self.model = self.sampler.sampling  # a quantized copy may be a new object after a weight load
        self._events = []
        super().step(version)
        events, self._events = self._events, []
        for t in events:
            if t.finish is not None:
                self._left[t.rid] -= 1
                if not self._left[t.rid]:
                    del self._left[t.rid], self.params[t.rid]
        return events

    # ---- the draw --------------------------------------------------------------------------------------------
    def _sampled(self, slots: list[int], logits: torch.Tensor, version: int) -> list[Finished]:
        rows = [self.rows[s] for s in slots]
        params = [self.params[r.key] for r in rows]
        tokens, logprobs = self._draw(logits, params)
        tops = self._tops(logits, params)
        finished = []
        for slot, row, p, tok, lp, top in zip(slots, rows, params, tokens, logprobs, tops, strict=True):
            row.tokens.append(tok)
            row.logprobs.append(lp)
            row.versions.append(version)
            self.next[slot] = tok
            self.stats.tokens += 1
            stop = tok == self.eos_id or tok in p.stop_token_ids
            finish = "stop" if stop else "length" if len(row.tokens) >= row.budget else None
            self._events.append(Token(row.key, row.index, tok, lp, version, top, finish))
            if finish is not None:
                finished.append(Finished(row.key, row.index, row.tokens, row.logprobs, row.versions))
                self._free(slot)
        return finished

    @staticmethod
    def _draw(logits: torch.Tensor, params: list[Params]) -> tuple[list[int], list[float]]:
        """One token per row, each group of rows sampling alike drawn together (in row order: one group draws
        the uniforms the parent would)."""
        groups: dict[tuple[float, float], list[int]] = {}
        for i, p in enumerate(params):
            groups.setdefault((p.temperature, p.top_p), []).append(i)
        tokens, logprobs = [0] * len(params), [0.0] * len(params)
        for (temperature, top_p), rows in groups.items():
            sub = logits[rows] if len(rows) < len(params) else logits
            if temperature == 0:
                tok = sub.argmax(-1)
                lp = torch.log_softmax(sub.float(), -1).gather(-1, tok[:, None]).squeeze(-1)
            else:
                tok, lp = _sample(sub, temperature, top_p, greedy=False)
            for i, t, v in zip(rows, tok.tolist(), lp.tolist(), strict=True):
                tokens[i], logprobs[i] = t, v
        return tokens, logprobs

    @staticmethod
    def _tops(logits: torch.Tensor, params: list[Params]) -> list[list[tuple[int, float]] | None]:
        out: list[list[tuple[int, float]] | None] = [None] * len(params)
        for i, p in enumerate(params):
            if p.top_logprobs:
                z = logits[i].float() / (p.temperature or 1.0)
                values, ids = torch.log_softmax(z, -1).topk(min(p.top_logprobs, z.shape[-1]))
                out[i] = list(zip(ids.tolist(), values.tolist(), strict=True))
        return out

    def _free(self, slot: int) -> None:
        """The slot empty again (what the parent does when a row ends)."""
        self.rows[slot] = None
        self.next[slot] = self.pad_id
        if self.attn is not None:
            self.attn[slot].zero_()
        self.pos[slot] = 0
