"""The model FLOPs of a trainer update, from the model's shape (tba.models.shape) and the lengths of what it trained:
the numerator of `trainer/mfu` (tba.run.utilization divides by the update's seconds and the devices' peak).

Counted as in PaLM's appendix B (Chowdhery et al., 2022) — model FLOPs, not hardware FLOPs: a recomputed
activation (trainer.activation_checkpointing) and the no-grad scoring pass of split micro-batches are not counted.

* Matmuls with weights: 6 FLOPs per weight per token (2 forward, 2 for the input's gradient, 2 for the weight's);
  4 when the base weights are frozen (LoRA: no weight gradient; its adapters are not counted). N, the weights, is
  the decoder layers' linear weights (attention and MLP projections): embeddings (a lookup), norms and biases are not
  counted. The LM head (V·d) is counted apart, at the positions it runs on: one per response token (tba.models
  .logprobs runs the head only where a response token is predicted), none for prompt tokens.
* Attention: 12·L·H·T per token, H = heads × head dim and T the length of the sequence the token is in
  (the QKᵀ and AV matmuls, 2 × 2·H·T forward, tripled for backward; not halved for the causal mask, as PaLM).
* Prompts shared by a group (trainer.shared_prompts): the prompt runs once per group, its tokens' T is the prompt's
  length, then each response but its last token (predicted, never input), each of T = prompt + response. Otherwise
  every sample is its own sequence of prompt + response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from tba.models.shape import ModelShape


@dataclass(frozen=True)
class ModelFlops:
    body: int
    """N: the decoder layers' linear weights."""
    head: int
    """The LM head's weights, V·d (its own matmul even when tied to the embeddings)."""
    layers: int
    attention_width: int
    """heads × head dim: the width of the attention's QKᵀ and AV matmuls."""
    weight_gradients: bool = True
    """False for a frozen base (LoRA): 4 FLOPs per weight per token instead of 6."""

    @classmethod
    def of(cls, shape: ModelShape, *, lora: bool = False) -> ModelFlops:
        head = shape.vocab * shape.hidden
        return cls(body=shape.linear_params - head, head=head, layers=shape.layers,
                   attention_width=shape.heads * shape.head_dim, weight_gradients=not lora)

    def update(self, groups: list[tuple[int, list[int]]], *, shared_prompts: bool) -> float:
        """Forward and backward FLOPs of an update on `groups`: (prompt tokens, each sample's response tokens)."""
        per_weight = 6 if self.weight_gradients else 4
        tokens = heads = context = 0  # tokens through the layers, positions through the head, Σ tokens × T
        for prompt, responses in groups:
            heads += sum(responses)
            if shared_prompts:
                tokens += prompt + sum(r - 1 for r in responses)
                context += prompt * prompt + sum((r - 1) * (prompt + r) for r in responses)
            else:
                tokens += sum(prompt + r for r in responses)
                context += sum((prompt + r) ** 2 for r in responses)
        return float(per_weight * (self.body * tokens + self.head * heads)
                     + 12 * self.layers * self.attention_width * context)
