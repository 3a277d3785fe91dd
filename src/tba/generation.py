"""Batched sampling with a KV cache, and per-token log-probs of given responses.

Sampling is HF `generate` (KV cache, EOS stop) with top-k disabled, so the sampled distribution is exactly
softmax(logits / T) (optionally top-p filtered). Every log-prob in TBA is of that temperature-scaled
distribution — the trainer's log π_θ, the searcher's log π_ref and the behaviour log-probs — as in the
paper's code (§2.2), so the TB residual compares like with like.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig


def _pad(seqs: list[list[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)  # [N, L]
    mask = torch.zeros((len(seqs), length), dtype=torch.long)  # [N, L]
    for i, s in enumerate(seqs):
        if left:
            ids[i, length - len(s):] = torch.tensor(s)
            mask[i, length - len(s):] = 1
        else:
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
    return ids, mask


@torch.no_grad()
def generate(
    model,
    prompts: list[list[int]],
    *,
    num_samples: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 32,
    eos_id: int,
    pad_id: int,
    greedy: bool = False,
) -> list[tuple[list[int], list[float]]]:
    """Return, for each prompt and then each of its samples, (response ids, behaviour log-probs).

    Responses are cut after the first EOS (which is kept). Greedy decoding returns empty log-prob lists.
    """
    ids, mask = _pad(prompts, pad_id, left=True)
    config = GenerationConfig(
        do_sample=not greedy,
        temperature=temperature if not greedy else None,
        top_k=0 if not greedy else None,
        top_p=top_p if not greedy else None,
        max_new_tokens=max_new_tokens,
        num_return_sequences=num_samples,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        output_scores=not greedy,
        return_dict_in_generate=True,
    )
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    new = out.sequences[:, ids.shape[1]:]  # [N·S, T]
    if not greedy:
        scores = torch.stack(out.scores, dim=1).float()  # [N·S, T, V], already divided by T
        logp = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scores, -1)  # [N·S, T]
    results = []
    for i, row in enumerate(new.tolist()):
        n = row.index(eos_id) + 1 if eos_id in row else len(row)
        results.append((row[:n], logp[i, :n].tolist() if not greedy else []))
    return results


def response_logprobs(
    model, prompts: list[list[int]], responses: list[list[int]], temperature: float, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of each response given its prompt, logits ÷ T.

    Returns (logp [N, R], mask [N, R]) where R is the longest response; padded positions hold 0. Sequences
    are right-padded so that positions start at 0 for every row, exactly as in a single-sequence forward.
    """
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    ids, attn = _pad(seqs, pad_id, left=False)  # [N, L]
    logits = model(input_ids=ids, attention_mask=attn).logits.float() / temperature  # [N, L, V]
    resp_len = max(len(r) for r in responses)
    # gather the logits that predict each response token: position len(prompt)-1+t predicts response[t]
    starts = torch.tensor([len(p) - 1 for p in prompts])  # [N]
    pos = (starts[:, None] + torch.arange(resp_len)[None, :]).clamp(max=ids.shape[1] - 2)  # [N, R]
    picked = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))  # [N, R, V]
    targets = ids.gather(1, pos + 1)  # [N, R]
    logp = picked.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(picked, -1)  # [N, R]
    mask = (torch.arange(resp_len)[None, :] < torch.tensor([len(r) for r in responses])[:, None]).float()
    return logp * mask, mask
