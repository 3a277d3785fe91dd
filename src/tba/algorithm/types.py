"""Records that cross component (and, later, process) boundaries.

Plain dataclasses of Python lists and floats: cheap to pickle through a queue or Ray's object store, no
tensors that pin memory. Shape legend used in comments across the package:
N = sequences in a batch (B prompt groups × K samples), L = padded sequence length, V = vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sample:
    """One completion of one prompt, as the searcher produced it."""

    response: list[int]
    """Response token ids, ending with EOS unless generation hit max_new_tokens."""
    ref_logprobs: list[float]
    """Per-token log π_ref(y_t | x, y_<t) of logits ÷ T, one per response token."""
    reward: float
    version: int
    """Policy version (trainer updates applied) of the weights that generated it — of its first token, when
    `versions` says that several did."""
    behaviour_logprobs: list[float] = field(default_factory=list)
    """Per-token log-probs under the generating policy (logits ÷ T); diagnostics and ratio-based baselines.
    Empty for completions from elsewhere (tba.rollout.demonstrations): their behaviour policy is unknown."""
    source: str = "policy"
    """Who produced it: a searcher group's name (search.groups; "policy" by default) or the data's (data.name)."""
    policy_mask: list[int] = field(default_factory=list)
    """Multi-turn episodes (tba.rollout.episodes): 1 where `response` holds a policy token, 0 where the environment's
    text is; their ref/behaviour log-probs are 0.0. Empty = every token is the policy's (single-turn)."""

    versions: list[int] = field(default_factory=list)
    """The policy version that sampled each response token, when weights changed while it was being generated
    (search.weight_update=in_flight); empty = every token is `version`'s. Environment tokens carry the version of
    the turn before them. No objective needs it (TB's target does not depend on who sampled): staleness metrics
    and `tba buffer dump` read it."""

    @property
    def last_version(self) -> int:
        """The version of its last token: its newest."""
        return self.versions[-1] if self.versions else self.version

    @property
    def ref_logprob_sum(self) -> float:
        return float(sum(self.ref_logprobs))


@dataclass
class Group:
    """All samples a searcher generated for one prompt in one search iteration."""

    prompt_id: int
    prompt_tokens: list[int]
    samples: list[Sample]
    source: str = "policy"
    """Who produced the group (every sample of it): a searcher group's name, or the data's."""


@dataclass
class Draw:
    """K samples of one prompt, as handed to the trainer."""

    prompt_id: int
    prompt_tokens: list[int]
    samples: list[Sample]
    online: bool
    data: bool = False
    """A data slot: half of its samples come from tba.rollout.demonstrations."""
