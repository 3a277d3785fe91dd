"""A scalar reward model (the TL;DR preference reward, TBA paper §4.2), scored the way the paper's code does.

The paper's reward (TRL 0.9 `get_reward`, inherited through async_rlhf) reads query + EOS-truncated response
and takes the RM's scalar at the *last non-pad token* of that sequence, i.e. at the EOS token the policy
emitted; a response that never emitted EOS gets a fixed penalty (−1) and is not scored at all:

    r(x, y) = score_head(h_T(x ⊕ y ⊕ EOS))   if y ended with EOS,   T = its last position
            = non_eos_penalty                 otherwise

Two details make this more than `model(**tokenizer(texts)).logits`:

- Responses reach a task as decoded text with special tokens removed, so the EOS is gone; a finished
  response gets the RM tokenizer's EOS id re-appended, so the RM sees the token it was trained to score at.
- Hugging Face's own pooling for decoder classifiers finds "the last token" as the position before the
  first pad token. Pythia's tokenizers use pad == EOS, so that finds the token *before* our EOS (or fails
  with no pad id at all). Instead sequences are right-padded with an attention mask, the backbone's last
  hidden states are computed, and the `score` head (GPT-NeoX, Llama, GPT-2, Qwen, ... all name it so) is
  applied at index length − 1, read from the lengths we built. Right padding keeps positions 0..T intact,
  so a sequence's score does not depend on what it is batched with. Models without a `score` head (encoder
  classifiers such as BERT, which pool their first token) are called whole.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from tba.models import DTYPES, ModelLoadError, resolve_device


def _load_error(what: str, name: str, err: Exception) -> ModelLoadError:
    return ModelLoadError(
        f"could not load the {what} {name!r}: {type(err).__name__}: {err}\n"
        "If the Hugging Face Hub is unreachable (offline machine, HF_HUB_OFFLINE=1), pass a local directory "
        "written by save_pretrained instead, e.g. task.options.reward_model=/path/to/rm (and the matching "
        "*_tokenizer option), or download it once with `huggingface-cli download NAME`."
    )


class RewardModel:
    """`score(queries, responses, finished)` → the paper's TL;DR reward, one float per response.

    `tokenizer` names the RM's tokenizer when it is not stored with the model (the 6.9B gold RM uses
    `EleutherAI/pythia-6.9b-deduped`'s). `dtype` is a name from tba.models.DTYPES.
    """

    def __init__(self, name_or_path: str, *, tokenizer: str | None = None, device: str = "cpu",
                 dtype: str = "float32", batch_size: int = 16, non_eos_penalty: float = -1.0) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"reward model dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        tokenizer_name = tokenizer or name_or_path
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
        except (OSError, ValueError) as e:
            if Path(tokenizer_name).is_dir():
                raise
            raise _load_error("reward-model tokenizer", tokenizer_name, e) from e
        try:  # num_labels=1: a scalar head, as TRL loads RMs (a 2-label checkpoint fails loudly on the shape)
            model = AutoModelForSequenceClassification.from_pretrained(name_or_path, num_labels=1,
                                                                       dtype=DTYPES[dtype])
        except (OSError, ValueError) as e:
            if Path(name_or_path).is_dir():
                raise
            raise _load_error("reward model", name_or_path, e) from e
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.name, self.batch_size, self.non_eos_penalty = name_or_path, batch_size, float(non_eos_penalty)
        self.eos_id = self.tokenizer.eos_token_id
        # any id works as padding: padded positions are masked and never read
        self.pad_id = next((i for i in (self.tokenizer.pad_token_id, self.eos_id) if i is not None), 0)
        limits = [getattr(model.config, "max_position_embeddings", None), self.tokenizer.model_max_length]
        self.max_length = min(n for n in limits + [10**6] if isinstance(n, int) and n > 0)
        self._backbone = getattr(model, model.base_model_prefix, None) if hasattr(model, "score") else None

    def encode(self, query: str, response: str, append_eos: bool) -> list[int]:
        """Token ids of query ⊕ response (⊕ EOS). Over the RM's context, the query loses tokens from its left
        (the end of the post and the "TL;DR:" cue stay) and the response is kept (if the response alone is
        too long, its end is kept: the score is read at the end)."""
        q = self.tokenizer(query)["input_ids"]
        r = self.tokenizer(response, add_special_tokens=False)["input_ids"]
        if append_eos and self.eos_id is not None:
            r = r + [self.eos_id]
        r = r[-self.max_length:]
        q = q[len(q) - (self.max_length - len(r)):] if len(q) + len(r) > self.max_length else q
        return (q + r) or [self.pad_id]  # an empty sequence still needs one position to score

    @torch.no_grad()
    def score_ids(self, sequences: list[list[int]]) -> list[float]:
        """The RM's scalar at the last token of each sequence. Batched longest-first (less padding); the
        result is in input order."""
        order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
        out = [0.0] * len(sequences)
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            lengths = torch.tensor([len(sequences[i]) for i in idx])
            width = int(lengths.max())
            ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
            for row, i in enumerate(idx):
                ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
            mask = (torch.arange(width)[None, :] < lengths[:, None]).long()  # right padding
            ids, mask = ids.to(self.device), mask.to(self.device)
            if self._backbone is not None:
                hidden = self._backbone(input_ids=ids, attention_mask=mask).last_hidden_state  # [N, L, H]
                last = hidden[torch.arange(len(idx), device=self.device), (lengths - 1).to(self.device)]  # [N, H]
                values = self.model.score(last)[:, 0]  # r = score_head(h_{T})
            else:
                values = self.model(input_ids=ids, attention_mask=mask).logits[:, 0]
            for row, value in zip(idx, values.float().cpu().tolist(), strict=True):
                out[row] = value
        return out

    def score_texts(self, queries: list[str], responses: list[str],
                    append_eos: bool | list[bool] = True) -> list[float]:
        """Raw RM scores of (query, response) texts, no penalty: e.g. (query, reference summary) pairs for the
        win rate. `append_eos` (one flag, or one per response) re-appends the EOS the text no longer holds."""
        if len(queries) != len(responses):
            raise ValueError(f"score_texts: {len(queries)} queries but {len(responses)} responses")
        flags = [append_eos] * len(responses) if isinstance(append_eos, bool) else list(append_eos)
        return self.score_ids([self.encode(q, r, f) for q, r, f in zip(queries, responses, flags, strict=True)])

    def score(self, queries: list[str], responses: list[str], finished: list[bool]) -> list[float]:
        """The paper's reward: RM score at the EOS of each finished response; `non_eos_penalty` for the rest."""
        if not len(queries) == len(responses) == len(finished):
            raise ValueError(f"score: {len(queries)} queries, {len(responses)} responses, {len(finished)} flags")
        done = [i for i, f in enumerate(finished) if f]
        values = [self.non_eos_penalty] * len(responses)
        scores = self.score_texts([queries[i] for i in done], [responses[i] for i in done], True)
        for i, value in zip(done, scores, strict=True):
            values[i] = value
        return values
